# Owner(s): ["oncall: distributed"]
"""The dX/dW split behind the zero-bubble schedules (stage_backward_input, then
stage_backward_weight) on a layer applied several times in one stage: the weight
backward must not re-run the dX chain between the layer's uses, so input plus
weight backward cost what a fused backward costs, with the same gradients. A
weight that reaches each use through a node of its own (F.linear's ``w.t()``)
gets its weight backward one use at a time, in W; a small parameter every use
reaches directly (the bias) is captured in I. A weight every use reaches
directly (``x @ w``) moves to I when its gradient is no larger than the
gradients saved for it, and otherwise keeps the old path."""

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
from torch.testing._internal.two_tensor import TwoTensor
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
            self.moved = [
                "param_grads" in g and "per_use" not in g for g in param_groups
            ]
            self.per_use = ["per_use" in g for g in param_groups]
            fused, i_flops, w_flops = (c.get_total_flops() for c in counters)
            torch.testing.assert_close(dinputs[0], ref_x.grad)
            for param, ref in zip(params, ref_params, strict=True):
                self.assertIsNotNone(param.grad)
                torch.testing.assert_close(param.grad, ref.grad)
        return i_flops, w_flops, fused

    @parametrize("bias", [True, False])
    @parametrize("uses", [4, 16])
    def test_reused_layer_costs_a_fused_backward(self, uses, bias):
        """Without per-use weight backwards, the weight backward re-runs the chain
        between the uses: 1.375x a fused backward at 4 uses, 1.469x at 16. With
        them, the input backward computes every dX (and the bias's gradient,
        which every use reaches directly), the weight backward every use's dW:
        half a fused backward each."""
        params = linear_params(1)
        if not bias:
            params = params[:1]

        def stage(x, params):
            w, b = params[0], params[1] if bias else None
            for _ in range(uses):
                x = torch.relu(F.linear(x, w, b))
            return [x]

        i_flops, w_flops, fused = self.run_split_and_fused(stage, params)
        self.assertEqual(self.per_use, [True])
        self.assertLessEqual(i_flops + w_flops, 1.05 * fused)
        self.assertEqual(i_flops, fused // 2)
        self.assertEqual(w_flops, fused // 2)

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
        """Only the reused layer runs per use; every dW stays in the weight backward."""

        def stage(x, params):
            x = plain_stack(x, params[:2])[0]
            x = reused_layer(3)(x, params[2:4])[0]
            return plain_stack(x, params[4:])

        i_flops, w_flops, fused = self.run_split_and_fused(stage, linear_params(3))
        self.assertEqual(self.per_use, [False, True, False])
        matmul = 2 * BATCH * WIDTH * WIDTH
        # dW of the two plain layers and of the reused layer's 3 uses stays in W
        self.assertEqual(w_flops, 5 * matmul)
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

    @parametrize(
        "uses, batch, moves",
        [(2, 4, False), (2, 8, True), (4, 8, True)],
        name_fn=lambda uses, batch, moves: f"{uses}_uses_{batch}_rows",
    )
    def test_memory_rule_weight_reached_directly(self, uses, batch, moves):
        """``x @ w``: every use reaches the weight's AccumulateGrad directly, so
        no backward from one use can avoid the chain below it; the group moves
        whole to the input backward, where its weight gradient (16 * 16 = 256
        elements per micro-batch) replaces the gradients saved at the uses
        (batch * 16 each), only when it is not larger. 2 uses of 4 rows: 256 >
        128, stays with its extra FLOPs; 2 uses of 8 rows (256) and 4 uses of 8
        rows (512) move."""

        def stage(x, params):
            for _ in range(uses):
                x = torch.tanh(x @ params[0])
            return [x]

        params = linear_params(1)[:1]
        i_flops, w_flops, fused = self.run_split_and_fused(stage, params, batch=batch)
        self.assertEqual(self.moved, [moves])
        self.assertEqual(self.per_use, [False])
        if moves:
            self.assertEqual(i_flops + w_flops, fused)
            self.assertEqual(w_flops, 0)
        else:
            self.assertGreater(i_flops + w_flops, fused)

    def test_weight_used_directly_and_through_own_node(self):
        """A weight that each use reaches both through its own ``w.t()`` and
        directly (``x @ w``): no per-use backward avoids the chain, so the group
        follows the memory rule of a directly reached weight: 3 uses of 8 rows
        save 6 * 128 elements >= 256 and move whole; 2 uses of 2 rows (128 < 256)
        stay."""

        def stage(x, params, uses):
            w = params[0]
            for _ in range(uses):
                x = torch.tanh(F.linear(x, w) + x @ w)
            return [x]

        for uses, batch, moves in ((3, 8, True), (2, 2, False)):
            params = linear_params(1)[:1]
            i_flops, w_flops, fused = self.run_split_and_fused(
                lambda x, p, uses=uses: stage(x, p, uses), params, batch=batch
            )
            self.assertEqual(self.moved, [moves])
            self.assertEqual(self.per_use, [False])
            if moves:
                self.assertEqual(i_flops + w_flops, fused)
            else:
                self.assertGreater(i_flops + w_flops, fused)

    def test_hooks_fire_once_per_microbatch(self):
        """Per micro-batch: each parameter's post-accumulate-grad hook once, in W;
        a tensor hook on an activation between two uses once, in I (the old path
        ran it again in W, re-running the chain); a module full backward hook
        once per use, in I."""
        params = linear_params(1)
        linear = torch.nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        with torch.no_grad():
            linear.weight.copy_(params[0])
            linear.bias.copy_(params[1])
        events = []
        for name, p in linear.named_parameters():
            p.register_post_accumulate_grad_hook(
                lambda p, name=name: events.append(("acc", name))
            )
        linear.register_full_backward_hook(lambda *_: events.append(("module",)))

        def stage(x):
            for use in range(4):
                x = torch.relu(linear(x))
                if use == 1:
                    x.register_hook(lambda g: events.append(("tensor",)))
            return [x]

        for _ in range(2):
            x = torch.randn(BATCH, WIDTH, dtype=torch.float64, requires_grad=True)
            outputs = stage(x)
            _, groups = stage_backward_input(
                outputs, [torch.ones_like(outputs[0])], [x], linear.parameters()
            )
            del outputs
            self.assertEqual(["per_use" in g for g in groups], [True])
            self.assertEqual(sorted(events), [("module",)] * 4 + [("tensor",)])
            events.clear()
            stage_backward_weight(linear.parameters(), groups)
            self.assertEqual(sorted(events), [("acc", "bias"), ("acc", "weight")])
            events.clear()

    def test_saved_tensor_hooks_and_tensor_subclass(self):
        """Activations saved through saved-tensor hooks (offloading,
        checkpointing) and a tensor subclass input: the per-use weight backward
        unpacks what it needs, the gradients match a fused backward."""
        params = linear_params(1)

        def stage(x, params):
            with torch.autograd.graph.saved_tensors_hooks(
                lambda t: t.clone(), lambda t: t
            ):
                return reused_layer(3)(x, params)

        self.run_split_and_fused(stage, params)
        self.assertEqual(self.per_use, [True])
        x0 = torch.randn(BATCH, WIDTH, dtype=torch.float64)
        for ps in (params, ref := clone_params(params)):
            for p in ps:
                p.grad = None
        x = TwoTensor(x0, x0.clone()).requires_grad_()
        outputs = reused_layer(3)(x, params)
        _, param_groups = stage_backward_input(
            outputs, [torch.ones_like(outputs[0])], [x], iter(params)
        )
        del outputs
        stage_backward_weight(iter(params), param_groups)
        torch.autograd.backward(
            reused_layer(3)(TwoTensor(x0, x0.clone()), ref),
            [torch.ones(BATCH, WIDTH, dtype=torch.float64)],
        )
        for p, r in zip(params, ref, strict=True):
            torch.testing.assert_close(p.grad, r.grad)

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
