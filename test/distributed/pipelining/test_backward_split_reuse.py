# Owner(s): ["oncall: distributed"]
"""The dX/dW split behind the zero-bubble schedules (stage_backward_input, then
stage_backward_weight) on a layer applied several times in one stage: the weight
backward must not re-run the dX chain between the layer's uses, so input plus
weight backward cost what a fused backward costs, with the same gradients.
Ordinary layers keep their weight-gradient work in the weight backward, and so
does a reused layer whose weight gradient would take more memory than the
gradients the weight backward would otherwise keep."""

from unittest import mock

import torch
import torch.distributed.pipelining._backward as _backward
import torch.nn.functional as F
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.utils.flop_counter import FlopCounterMode


WIDTH, BATCH = 16, 8


def linear_params(n_layers, seed=0):
    torch.manual_seed(seed)
    params = []
    for _ in range(n_layers):
        params.append(
            torch.nn.Parameter(torch.randn(WIDTH, WIDTH, dtype=torch.float64) / 4)
        )
        params.append(torch.nn.Parameter(torch.randn(WIDTH, dtype=torch.float64)))
    return params


def clone_params(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def reused_layer(uses):
    """One Linear + ReLU applied ``uses`` times (ALBERT-style)."""

    def stage(x, params):
        w, b = params
        for _ in range(uses):
            x = torch.relu(F.linear(x, w, b))
        return [x]

    return stage


def plain_stack(x, params):
    for w, b in zip(params[::2], params[1::2]):
        x = torch.relu(F.linear(x, w, b))
    return [x]


class StageBackwardSplitReuseTests(TestCase):
    def run_split_and_fused(
        self, stage, params, ref_params=None, n_microbatches=2, batch=BATCH
    ):
        """Several micro-batches through the split and through a fused backward;
        every gradient must match. Returns the FLOPs of the last micro-batch's
        input backward, weight backward and fused backward."""
        if ref_params is None:
            ref_params = clone_params(params)
        torch.manual_seed(1)
        for _ in range(n_microbatches):
            x = torch.randn(batch, WIDTH, dtype=torch.float64, requires_grad=True)
            ref_x = x.detach().clone().requires_grad_()
            grads = [torch.randn(batch, WIDTH, dtype=torch.float64)]
            outputs = stage(x, params)
            ref_outputs = stage(ref_x, ref_params)
            counters = [FlopCounterMode(display=False) for _ in range(3)]
            with counters[0]:
                torch.autograd.backward(ref_outputs, grads)
            with counters[1]:
                dinputs, param_groups = stage_backward_input(
                    outputs, grads, [x], iter(params)
                )
            del outputs  # as a stage does after the input backward
            with counters[2]:
                stage_backward_weight(iter(params), param_groups)
            self.moved = ["param_grads" in g for g in param_groups]
            fused, i_flops, w_flops = (c.get_total_flops() for c in counters)
            torch.testing.assert_close(dinputs[0], ref_x.grad)
            for param, ref in zip(params, ref_params, strict=True):
                self.assertIsNotNone(param.grad)
                torch.testing.assert_close(param.grad, ref.grad)
        return i_flops, w_flops, fused

    @parametrize("uses", [4, 16])
    def test_reused_layer_costs_a_fused_backward(self, uses):
        """Without computing the reused weight's gradient in the input backward,
        the weight backward re-runs the chain between the uses: 1.375x a fused
        backward at 4 uses, 1.469x at 16."""
        i_flops, w_flops, fused = self.run_split_and_fused(
            reused_layer(uses), linear_params(1)
        )
        self.assertLessEqual(i_flops + w_flops, 1.05 * fused)

    def test_plain_stack_keeps_weight_gradients_in_weight_backward(self):
        """Separate layers are unchanged: the input backward computes dX only
        (half of each layer's matmul FLOPs), the weight backward dW."""
        i_flops, w_flops, fused = self.run_split_and_fused(
            plain_stack, linear_params(4)
        )
        self.assertEqual(i_flops, fused // 2)
        self.assertEqual(w_flops, fused // 2)

    def test_weight_used_in_parallel_branches_stays_in_weight_backward(self):
        """A weight used twice without one use depending on the other: the
        weight backward re-runs nothing, so it keeps the dW work."""

        def stage(x, params):
            w, b = params
            return [F.linear(x, w, b) + F.linear(torch.tanh(x), w, b)]

        i_flops, w_flops, fused = self.run_split_and_fused(stage, linear_params(1))
        self.assertEqual(i_flops, fused // 2)
        self.assertEqual(w_flops, fused // 2)

    def test_reused_layer_next_to_plain_layers(self):
        """Only the reused layer's gradients move to the input backward."""

        def stage(x, params):
            x = plain_stack(x, params[:2])[0]
            x = reused_layer(3)(x, params[2:4])[0]
            return plain_stack(x, params[4:])

        i_flops, w_flops, fused = self.run_split_and_fused(stage, linear_params(3))
        matmul = 2 * BATCH * WIDTH * WIDTH
        # dW of the two plain layers stays in W
        self.assertEqual(w_flops, 2 * matmul)
        self.assertEqual(i_flops + w_flops, fused)

    def test_weight_penalty_in_loss(self):
        """A weight that reaches the loss directly and through the activations: the
        loss's add leads back to the weight's matmul."""

        def stage(x, params):
            w, b = params
            out = torch.tanh(F.linear(x, w, b))
            return [(out**2).mean() + 1e-2 * (w**2).sum()]

        params = linear_params(1)
        ref_params = clone_params(params)
        x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
        ref_x = x.detach().clone().requires_grad_()
        torch.autograd.backward(stage(ref_x, ref_params))
        dinputs, param_groups = stage_backward_input(
            stage(x, params), None, [x], iter(params)
        )
        stage_backward_weight(iter(params), param_groups)
        torch.testing.assert_close(dinputs[0], ref_x.grad)
        for param, ref in zip(params, ref_params, strict=True):
            torch.testing.assert_close(param.grad, ref.grad)

    def test_accumulate_grad_runs_in_weight_backward(self):
        """The reused weight's AccumulateGrad (its hooks, DDP's and FSDP's) still
        runs in the weight backward, once per micro-batch."""
        params = linear_params(1)
        fired = []
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: fired.append(i))
        x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
        outputs = reused_layer(4)(x, params)
        _, param_groups = stage_backward_input(
            outputs, [torch.ones_like(outputs[0])], [x], iter(params)
        )
        self.assertEqual(fired, [])
        self.assertTrue(all(p.grad is None for p in params))
        stage_backward_weight(iter(params), param_groups)
        self.assertEqual(sorted(fired), [0, 1])

    def test_tensor_hook_on_reused_weight_runs_once(self):
        """Capturing a gradient calls the parameter's tensor hooks, so a group with
        one keeps its gradients in the weight backward: each hook runs once per
        micro-batch, and its result is what accumulates."""
        params = linear_params(1)
        ref_params = clone_params(params)
        calls = []
        for ps in (params, ref_params):
            ps[0].register_hook(lambda g: (calls.append(1), 2 * g)[1])
        self.run_split_and_fused(reused_layer(4), params, ref_params)
        self.assertEqual(len(calls), 4)  # per micro-batch: the split once, fused once

    def test_param_groups_reusable_with_retain_graph(self):
        params = linear_params(1)
        x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
        outputs = reused_layer(4)(x, params)
        _, param_groups = stage_backward_input(
            outputs, [torch.ones_like(outputs[0])], [x], iter(params)
        )
        once = [
            g.clone() for g in stage_backward_weight(iter(params), param_groups, True)
        ]
        twice = stage_backward_weight(iter(params), param_groups)
        for a, b in zip(once, twice, strict=True):
            torch.testing.assert_close(b, 2 * a)
        with self.assertRaisesRegex(RuntimeError, "already used"):
            stage_backward_weight(iter(params), param_groups)

    @parametrize("uses", [2, 3])
    def test_weight_gradient_larger_than_saved_gradients_stays_in_weight_backward(
        self, uses
    ):
        """Moving holds the layer's weight and bias gradients (16 * 16 + 16 = 272
        elements per micro-batch) from I to W instead of the gradients saved at
        its uses (8 rows * 16 per use): with 2 uses (256 elements) that would
        hold more, so the group keeps the old path and its extra FLOPs; with 3
        (384) it moves."""
        i_flops, w_flops, fused = self.run_split_and_fused(
            reused_layer(uses), linear_params(1)
        )
        if uses == 2:
            self.assertEqual(self.moved, [False])
            self.assertEqual(i_flops, fused // 2)
            self.assertGreater(i_flops + w_flops, fused)
        else:
            self.assertEqual(self.moved, [True])
            self.assertEqual(i_flops + w_flops, fused)

    def test_microbatches_in_flight_input_input_weight_weight(self):
        """The order zero-bubble schedules use: several input backwards before the
        weight backwards. Each micro-batch keeps its own captured gradients; the
        sum equals a fused backward's and each AccumulateGrad runs in W, once per
        micro-batch."""
        params = linear_params(1)
        ref_params = clone_params(params)
        fired = []
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: fired.append(i))
        stage = reused_layer(4)
        torch.manual_seed(1)
        pending = []
        total_flops = 0
        for _ in range(3):
            x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
            ref_x = x.detach().clone().requires_grad_()
            grads = [torch.randn(BATCH, WIDTH, dtype=torch.float64)]
            torch.autograd.backward(stage(ref_x, ref_params), grads)
            outputs = stage(x, params)
            with FlopCounterMode(display=False) as flops:
                dinputs, param_groups = stage_backward_input(
                    outputs, grads, [x], iter(params)
                )
            total_flops += flops.get_total_flops()
            del outputs
            torch.testing.assert_close(dinputs[0], ref_x.grad)
            self.assertTrue(all("param_grads" in g for g in param_groups))
            pending.append(param_groups)
        self.assertEqual(fired, [])
        for n, param_groups in enumerate(pending):
            with FlopCounterMode(display=False) as flops:
                stage_backward_weight(iter(params), param_groups)
            total_flops += flops.get_total_flops()
            self.assertEqual(sorted(fired), sorted([0, 1] * (n + 1)))
        for param, ref in zip(params, ref_params, strict=True):
            torch.testing.assert_close(param.grad, ref.grad)
        # I + W of three micro-batches: three fused backwards (2 matmuls per use)
        self.assertEqual(total_flops, 3 * 4 * 2 * (2 * BATCH * WIDTH**2))

    def test_choice_visits_each_node_a_fixed_number_of_times(self):
        """Weights shared in mirror (weight i used by layers i and 2M - 1 - i, as
        in a tied encoder-decoder): every group spans the middle of the graph.
        The choice must not walk each group's span (quadratic in M); count the
        membership tests on the input-dependent nodes (deterministic, unlike a
        timing)."""

        def lookups(m):
            torch.manual_seed(0)
            ps = [torch.nn.Parameter(torch.randn(4, 4) / 2) for _ in range(m)]
            x = torch.randn(8, 4, requires_grad=True)
            h = x
            for p in ps + ps[::-1]:
                h = torch.tanh(h @ p)
            count = [0]

            class CountingSet(set):
                def __contains__(self, item):
                    count[0] += 1
                    return super().__contains__(item)

            real = _backward.reverse_closure

            def counting_closure(*args, **kwargs):
                closure, targets = real(*args, **kwargs)
                return CountingSet(closure), targets

            with mock.patch.object(_backward, "reverse_closure", counting_closure):
                _, groups = stage_backward_input(
                    [h], [torch.ones_like(h)], [x], iter(ps)
                )
            self.assertTrue(all("param_grads" in g for g in groups))
            del h
            stage_backward_weight(iter(ps), groups)
            return count[0]

        small, large = lookups(16), lookups(64)
        # linear: 4x the layers, about 4x the lookups (a walk per group: ~16x)
        self.assertLess(large, 5 * small)


instantiate_parametrized_tests(StageBackwardSplitReuseTests)


if __name__ == "__main__":
    run_tests()
