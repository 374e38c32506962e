# Owner(s): ["oncall: distributed"]
"""The dX/dW split behind the zero-bubble schedules (stage_backward_input, then
stage_backward_weight) on a layer applied several times in one stage: the weight
backward must not re-run the dX chain between the layer's uses, so input plus
weight backward cost what a fused backward costs, with the same gradients.
Ordinary layers keep their weight-gradient work in the weight backward, and so
does a reused layer whose weight gradient would take more memory than what the
weight backward would otherwise keep: a matmul layer's weight backward then
computes each use's weight gradient from the gradient saved at that use, without
the chain; any other layer's re-runs the chain unless it fits in its saved
gradients over the micro-batches in flight (``in_flight``, which a schedule sets
on its stages)."""

import contextlib
import copy
import gc
import random
import weakref
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.pipelining._backward as _backward
import torch.distributed.pipelining.stage as _stage
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

WIDTH, BATCH = 16, 8


def linear_params(n_layers, seed=0, width=WIDTH):
    torch.manual_seed(seed)
    params = []
    for _ in range(n_layers):
        params.append(
            torch.nn.Parameter(
                torch.randn(width, width, dtype=torch.float64) / width**0.5
            )
        )
        params.append(torch.nn.Parameter(torch.randn(width, dtype=torch.float64)))
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


def no_matmul_plan():
    """Treat every group as one whose weight backward must re-run the chain
    (as for a reused layer that is not a matmul)."""
    return mock.patch.object(_backward, "_direct_weight_plan", lambda *args: None)


def plain_stack(x, params):
    for w, b in zip(params[::2], params[1::2]):
        x = torch.relu(F.linear(x, w, b))
    return [x]


class StageBackwardSplitReuseTests(TestCase):
    def run_split_and_fused(
        self,
        stage,
        params,
        ref_params=None,
        n_microbatches=2,
        batch=BATCH,
        width=WIDTH,
        seq=None,
        exact=False,
        **kwargs,
    ):
        """Several micro-batches through the split and through a fused backward;
        every gradient must match (be bitwise equal with ``exact``). Returns the
        FLOPs of the last micro-batch's input backward, weight backward and fused
        backward. Inputs are (batch, width), or (batch, seq, width) with ``seq``.
        ``kwargs`` go to ``stage_backward_input``."""
        if ref_params is None:
            ref_params = clone_params(params)
        torch.manual_seed(1)
        shape = (batch, width) if seq is None else (batch, seq, width)
        for _ in range(n_microbatches):
            x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
            ref_x = x.detach().clone().requires_grad_()
            grads = [torch.randn(shape, dtype=torch.float64)]
            outputs = stage(x, params)
            ref_outputs = stage(ref_x, ref_params)
            counters = [FlopCounterMode(display=False) for _ in range(3)]
            with counters[0]:
                torch.autograd.backward(ref_outputs, grads)
            with counters[1]:
                dinputs, param_groups = stage_backward_input(
                    outputs, grads, [x], iter(params), **kwargs
                )
            del outputs  # as a stage does after the input backward
            with counters[2]:
                stage_backward_weight(iter(params), param_groups)
            self.moved = ["param_grads" in g for g in param_groups]
            self.direct = ["direct" in g for g in param_groups]
            fused, i_flops, w_flops = (c.get_total_flops() for c in counters)
            torch.testing.assert_close(dinputs[0], ref_x.grad)
            for param, ref in zip(params, ref_params, strict=True):
                self.assertIsNotNone(param.grad)
                if exact:
                    self.assertTrue(torch.equal(param.grad, ref.grad))
                else:
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

    def held_bytes(self, stage, params, batch, keep_graph=False, width=WIDTH, **kwargs):
        """Bytes held between the input and the weight backward, per storage: the
        saved tensors still alive (a pack hook keeps a weak reference to each),
        the gradients saved for W and the weight gradients I computed, without
        the parameters and the input, which the caller holds anyway. With
        ``keep_graph``, the split keeps every group in W. Also returns whether
        the group moved; runs W afterwards."""
        torch.manual_seed(1)
        x = torch.randn(batch, width, dtype=torch.float64, requires_grad=True)
        alive = []

        def pack(t):
            t = t.detach()
            alive.append(weakref.ref(t))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outputs = stage(x, params)
        grads = [torch.randn(batch, width, dtype=torch.float64)]
        with contextlib.ExitStack() as stack:
            if keep_graph:
                stack.enter_context(
                    mock.patch.object(
                        _backward,
                        "_groups_to_compute_in_input_backward",
                        lambda *args: [],
                    )
                )
            _, param_groups = stage_backward_input(
                outputs, grads, [x], iter(params), **kwargs
            )
        del outputs
        gc.collect()
        tensors = [t for ref in alive if (t := ref()) is not None]
        for group in param_groups:
            for saved in group["grads"]:
                tensors += [g for g in saved or () if g is not None]
            tensors += [g for g in group.get("param_grads") or () if g is not None]
        skip = {t.untyped_storage()._cdata for t in [x, *params]}
        storages = {
            t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors
        }
        nbytes = sum(n for k, n in storages.items() if k not in skip)
        moved = ["param_grads" in g for g in param_groups]
        del tensors
        stage_backward_weight(iter(params), param_groups)
        return nbytes, moved

    @parametrize(
        "uses, batch, moves",
        [(2, 4, False), (4, 2, False), (2, 8, True), (4, 3, True), (3, 8, True)],
    )
    def test_memory_rule(self, uses, batch, moves):
        """Moving holds the layer's weight and bias gradients (16 * 16 + 16 = 272
        elements per micro-batch) from I to W; the weight backward would hold the
        gradients saved at the layer's uses (batch * 16 per use) and the
        activations between them (the ReLU results of all uses but the last,
        batch * 16 each; the input is the caller's). A group moves when those
        take at least as much: 2 uses of 4 rows hold 128 + 64 elements and 4 uses
        of 2 rows 128 + 96, so both keep the old path and its extra FLOPs;
        2 uses of 8 rows (256 + 128) and 4 uses of 3 rows (192 + 144, fewer rows
        than the width in all) move for the activations they free, 3 uses of 8
        rows (384 + 256) for the saved gradients alone. Moving never holds more
        than the old path: checked with a pack hook on the saved tensors. Either
        way I + W cost a fused backward."""
        i_flops, w_flops, fused = self.run_split_and_fused(
            reused_layer(uses), linear_params(1), batch=batch
        )
        self.assertEqual(self.moved, [moves])
        # staying, the weight backward skips the chain (matmul plan)
        self.assertEqual(i_flops + w_flops, fused)
        if not moves:
            self.assertEqual(i_flops, fused // 2)
        held, moved = self.held_bytes(reused_layer(uses), linear_params(1), batch)
        stock, _ = self.held_bytes(
            reused_layer(uses), linear_params(1), batch, keep_graph=True
        )
        self.assertEqual(moved, [moves])
        elements = (2 * uses - 1) * batch * WIDTH
        self.assertEqual(stock, elements * 8)  # float64
        self.assertEqual(held, 272 * 8 if moves else stock)
        self.assertLessEqual(held, stock)

    @parametrize("in_flight, moves", [(None, False), (1, True), (3, True), (4, False)])
    def test_in_flight_rule_shared_4(self, in_flight, moves):
        """The benchmark's "shared 4" row: Linear(256, 256) + ReLU applied 4
        times to 32 rows. Moving holds the weight and bias gradients (65,792
        elements) where the weight backward would hold 4 saved gradients and
        the 3 ReLU results between the uses (57,344): 8,448 elements more per
        micro-batch in flight. That moves when ``in_flight`` times that is at
        most the saved gradients (32,768 elements: what W no longer allocates
        re-running the chain): up to 3 in flight. Unknown (``None``): nothing
        may grow, it stays. Gradients equal a fused float64 backward's either
        way. This rule is for a group whose weight backward must re-run the
        chain (``no_matmul_plan``); a matmul layer's skips it instead
        (``test_reused_matmul_layer_skips_the_chain_in_weight_backward``)."""
        width, batch = 256, 32
        with no_matmul_plan():
            i_flops, w_flops, fused = self.run_split_and_fused(
                reused_layer(4),
                linear_params(1, width=width),
                batch=batch,
                width=width,
                in_flight=in_flight,
            )
        self.assertEqual(self.moved, [moves])
        if moves:
            self.assertEqual(i_flops + w_flops, fused)
        else:
            self.assertEqual(i_flops + w_flops, 1.375 * fused)
        with no_matmul_plan():
            held, moved = self.held_bytes(
                reused_layer(4),
                linear_params(1, width=width),
                batch,
                width=width,
                in_flight=in_flight,
            )
        self.assertEqual(moved, [moves])
        self.assertEqual(held, (65_792 if moves else 57_344) * 8)

    @parametrize("in_flight", [1, 4])
    def test_in_flight_rule_bounds_held_memory(self, in_flight):
        """Linear(2048, 2048) + ReLU applied 4 times to 8 rows: moving would
        hold 4,196,352 gradient elements per micro-batch where the weight
        backward holds 57,344 (32 MB instead of 0.4 MB in float64; 64 MB
        instead of 2 MB with 4 in flight in float32). It stays in W at any
        ``in_flight``, with its extra FLOPs."""
        width, batch = 2048, 8
        i_flops, w_flops, fused = self.run_split_and_fused(
            reused_layer(4),
            linear_params(1, width=width),
            batch=batch,
            width=width,
            n_microbatches=1,
            in_flight=in_flight,
        )
        self.assertEqual(self.moved, [False])
        self.assertEqual(i_flops, fused // 2)

    @parametrize("in_flight", [None, 1, 4])
    @parametrize("uses", [2, 4])
    def test_reused_matmul_layer_skips_the_chain_in_weight_backward(
        self, uses, in_flight
    ):
        """Linear(256, 256) + ReLU applied 2 and 4 times to 32 rows: its weight
        gradients (65,792 elements) are more than the weight backward holds (the
        saved gradients and the ReLU results between the uses, (2N - 1) * 32 *
        256), so the group stays in W at any ``in_flight``. There each use's
        weight and bias gradients are computed from the gradient saved at that
        use and the input its matmul saved, without the dX chain between the
        uses: I + W cost a fused backward (the chain re-run cost 1.25x and
        1.375x), I does dX only, the bytes held between I and W are those of
        the old path, and the gradients are bitwise equal to a fused backward's
        (the uses are summed in the engine's order)."""
        width, batch = 256, 32
        i_flops, w_flops, fused = self.run_split_and_fused(
            reused_layer(uses),
            linear_params(1, width=width),
            batch=batch,
            width=width,
            exact=True,
            in_flight=in_flight,
        )
        self.assertEqual(self.moved, [False])
        self.assertEqual(self.direct, [True])
        self.assertEqual(i_flops, fused // 2)
        self.assertEqual(w_flops, fused // 2)
        held, _ = self.held_bytes(
            reused_layer(uses),
            linear_params(1, width=width),
            batch,
            width=width,
            in_flight=in_flight,
        )
        stock, _ = self.held_bytes(
            reused_layer(uses),
            linear_params(1, width=width),
            batch,
            width=width,
            keep_graph=True,
        )
        self.assertEqual(stock, (2 * uses - 1) * batch * width * 8)
        self.assertEqual(held, stock)

    @parametrize(
        "form", ["linear_3d", "matmul", "transpose_once", "bias_free", "one_weight"]
    )
    def test_reused_matmul_layer_forms(self, form):
        """Forms of a reused matmul layer, between two layers used once, on 4
        uses of 3 rows, or 2 x 2 (weight gradients larger than what W holds, so
        the group stays in W): ``F.linear`` on (batch, seq, width) inputs (addmm on
        a view), ``x @ w + b`` (mm whose weight edge is the AccumulateGrad
        itself; the bias is its own group), ``w.t()`` taken once for all uses (a
        region node that every use reaches), ``F.linear`` without bias (mm), and
        one weight with a bias per use (one group). I + W cost a fused backward,
        gradients equal its; the layers used once keep their plain split (no
        plan, their dW in W). The rows are too few for the weight gradients to
        fit in the saved gradients (4 * 4 * 16 < 272), and the later layer keeps
        the chain's activations alive (4 * 3 * 16 and 4 * 4 * 16 elements of
        saved gradients, 256 + 16 of weight gradients)."""

        def stage(x, params):
            x = plain_stack(x, params[:2])[0]
            w, b, biases = params[2], params[3], params[3:-2]
            wt = w.t()
            for i in range(4):
                if form == "matmul":
                    x = torch.relu(x @ w + b)
                elif form == "transpose_once":
                    x = torch.relu(x @ wt + b)
                elif form == "bias_free":
                    x = torch.relu(F.linear(x, w))
                elif form == "one_weight":
                    x = torch.relu(F.linear(x, w, biases[i]))
                else:
                    x = torch.relu(F.linear(x, w, b))
            return plain_stack(x, params[-2:])

        params = linear_params(3)
        if form == "bias_free":
            del params[3]
        elif form == "one_weight":
            params[3:4] = [
                torch.nn.Parameter(torch.randn(WIDTH, dtype=torch.float64))
                for _ in range(4)
            ]
        seq = 2 if form == "linear_3d" else None
        batch = 2 if seq else 3
        i_flops, w_flops, fused = self.run_split_and_fused(
            stage, params, batch=batch, seq=seq
        )
        self.assertEqual(i_flops + w_flops, fused)
        matmul = 2 * batch * (seq or 1) * WIDTH * WIDTH
        self.assertEqual((i_flops, w_flops), (6 * matmul, 6 * matmul))
        # the layers used once: no plan, their dW in W as before; ``x @ w + b``
        # makes the bias a group of its own, which fits and moves
        self.assertEqual(self.direct.index(True), 1)
        self.assertEqual(sum(self.direct), 1)
        bias_group = form in ("matmul", "transpose_once")
        moved = [False, False, True, False] if bias_group else [False] * 3
        self.assertEqual(self.moved, moved)

    def test_reused_block_of_matmul_layers(self):
        """A transformer-like block applied twice (ALBERT-style) between two
        layers used once, on (batch, seq, width) inputs: a norm with a weight,
        gated q / k projections, an output projection and a two-layer MLP, with
        residuals. Each projection is its own group whose weight backward would
        re-run the chain through both blocks (2.03x a fused backward without the
        matmul plan at 6 rows); with it I + W cost a fused backward, and the
        gradients equal its."""

        def stage(x, params):
            inp, q, k, o, up, down, out, g = params
            x = F.linear(x, inp)
            for _ in range(2):
                h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g
                gate = torch.relu(F.linear(h, q)) * torch.tanh(F.linear(h, k))
                x = x + F.linear(gate, o)
                x = x + F.linear(torch.relu(F.linear(x, up)), down)
            return [F.linear(x, out)]

        torch.manual_seed(0)
        shapes = [(WIDTH, WIDTH)] * 4 + [(2 * WIDTH, WIDTH), (WIDTH, 2 * WIDTH)]
        params = [
            torch.nn.Parameter(torch.randn(s, dtype=torch.float64) / s[-1] ** 0.5)
            for s in [*shapes, (WIDTH, WIDTH)]
        ]
        params.append(torch.nn.Parameter(torch.ones(WIDTH, dtype=torch.float64)))
        i_flops, w_flops, fused = self.run_split_and_fused(
            stage, params, batch=2, seq=3
        )
        self.assertEqual(i_flops + w_flops, fused)
        # q, k, o, up and down keep their weight gradients in W, by the plan;
        # the norm's weight (not a matmul) fits in its saved gradients and moves
        self.assertEqual(sum(self.direct), 5)
        self.assertEqual(sum(self.moved), 1)

    def test_reused_matmul_layer_weight_backward_hooks_and_order(self):
        """The matmul plan in the I, I, W, W order of zero-bubble schedules:
        each parameter's AccumulateGrad runs once per weight backward (its
        post-accumulate-grad hooks fire there, not in I), the sum over two
        micro-batches equals two fused backwards', and ``param_groups`` can be
        run twice with ``retain_graph=True``."""
        width, batch = 64, 4
        params = linear_params(1, width=width)
        ref_params = clone_params(params)
        fired = []
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: fired.append(i))
        stage = reused_layer(4)
        torch.manual_seed(1)
        pending = []
        for _ in range(2):
            x = torch.randn(batch, width, dtype=torch.float64, requires_grad=True)
            grads = [torch.randn(batch, width, dtype=torch.float64)]
            torch.autograd.backward(stage(x.detach(), ref_params), grads)
            outputs = stage(x, params)
            _, param_groups = stage_backward_input(outputs, grads, [x], iter(params))
            del outputs
            self.assertEqual(["direct" in g for g in param_groups], [True])
            pending.append(param_groups)
        self.assertEqual(fired, [])
        once = [
            g.clone() for g in stage_backward_weight(iter(params), pending[0], True)
        ]
        self.assertEqual(sorted(fired), [0, 1])
        for p in params:
            p.grad = None
        stage_backward_weight(iter(params), pending[0])
        for p, g in zip(params, once, strict=True):
            self.assertTrue(torch.equal(p.grad, g))
        stage_backward_weight(iter(params), pending[1])
        self.assertEqual(sorted(fired), [0, 0, 0, 1, 1, 1])
        for param, ref in zip(params, ref_params, strict=True):
            torch.testing.assert_close(param.grad, ref.grad)

    def test_tensor_hook_registered_after_input_backward_runs_once(self):
        """A tensor hook registered on the reused weight between I and W: the
        matmul plan would call it once per use when it captures each use's
        gradient, so W runs the group from its intermediates instead; the hook
        runs once and its result is what accumulates."""
        width, batch = 64, 4
        params = linear_params(1, width=width)
        ref_params = clone_params(params)
        x = torch.randn(batch, width, dtype=torch.float64, requires_grad=True)
        grads = [torch.randn(batch, width, dtype=torch.float64)]
        outputs = reused_layer(4)(x, params)
        _, param_groups = stage_backward_input(outputs, grads, [x], iter(params))
        del outputs
        self.assertEqual(["direct" in g for g in param_groups], [True])
        calls = []
        for ps in (params, ref_params):
            ps[0].register_hook(lambda g: (calls.append(1), 2 * g)[1])
        stage_backward_weight(iter(params), param_groups)
        self.assertEqual(len(calls), 1)
        torch.autograd.backward(reused_layer(4)(x.detach(), ref_params), grads)
        self.assertEqual(len(calls), 2)
        for param, ref in zip(params, ref_params, strict=True):
            torch.testing.assert_close(param.grad, ref.grad)

    @parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
    @parametrize("form", ["early_transpose", "two_early_transposes"])
    def test_reused_weight_summed_in_the_engine_order(self, form, dtype):
        """The engine adds a weight's gradients in the order the nodes that
        produce them run, by decreasing sequence number: for a use through its
        own ``w.t()``, the ``t`` node's, not its matmul's. With that ``w.t()``
        taken before the other uses' matmuls (``x @ w`` three times, then the
        early ``w.t()``), its gradient comes last. The matmul plan sums the
        uses in that order: the weight gradients are bitwise equal to a fused
        backward's (summed in the matmuls' order they differ in the last bits:
        1e-15 in float64, 1e-6 in float32, 0.06 in bfloat16)."""
        width, batch = 64, 8
        torch.manual_seed(0)
        w = torch.nn.Parameter((torch.randn(width, width) / width**0.5).to(dtype))

        def stage(x, params):
            (w,) = params
            if form == "early_transpose":
                wt = w.t()
                h = x @ w
                h = torch.relu(h) @ w
                h = torch.relu(h) @ w
                return [torch.relu(h) @ wt]
            wt1, wt2 = w.t(), w.t()
            h = x @ wt2
            h = torch.relu(h) @ w
            h = torch.relu(h) @ wt1
            return [torch.relu(h) @ w]

        params, ref_params = [w], clone_params([w])
        for _ in range(2):
            x = torch.randn(batch, width, dtype=dtype, requires_grad=True)
            ref_x = x.detach().clone().requires_grad_()
            grads = [torch.randn(batch, width, dtype=dtype)]
            torch.autograd.backward(stage(ref_x, ref_params), grads)
            outputs = stage(x, params)
            _, param_groups = stage_backward_input(outputs, grads, [x], iter(params))
            del outputs
            self.assertEqual(["direct" in g for g in param_groups], [True])
            stage_backward_weight(iter(params), param_groups)
            self.assertTrue(torch.equal(x.grad, ref_x.grad))
            self.assertTrue(torch.equal(params[0].grad, ref_params[0].grad))

    @parametrize("in_flight", [None, 1])
    def test_reused_weight_with_an_undefined_use_gradient_keeps_its_plan(
        self, in_flight
    ):
        """A custom Function whose backward returns ``None`` for one input
        leaves the gradient of the use behind it undefined. Here that use and
        another share one ``w.t()``; the plan checked in I keeps that ``w.t()``
        shared and W follows it, adding nothing for the use without a gradient
        (the engine's input buffers skip an undefined gradient too), instead of
        re-running the group from its intermediates (the dX chain between the
        uses again: I + W cost 1.375x a fused backward). I + W cost a fused
        backward; the gradients are bitwise equal to its."""

        class DropSecond(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                return a.clone()

            @staticmethod
            def backward(ctx, grad):
                return grad, None

        def stage(x, params):
            w, b = params
            wt = w.t()
            h = torch.relu(x @ w) @ w
            dropped = torch.relu(h) @ wt
            kept = torch.addmm(b, torch.relu(h), wt)
            return [torch.relu(DropSecond.apply(kept, dropped)) @ w]

        width, batch = 64, 4
        followed = []
        direct_weight_backward = _backward._direct_weight_backward

        def spy(*args, **kwargs):
            followed.append(direct_weight_backward(*args, **kwargs))
            return followed[-1]

        with mock.patch.object(_backward, "_direct_weight_backward", spy):
            i_flops, w_flops, fused = self.run_split_and_fused(
                stage,
                linear_params(1, width=width),
                batch=batch,
                width=width,
                exact=True,
                in_flight=in_flight,
            )
        self.assertEqual(self.direct, [True])
        self.assertEqual(i_flops + w_flops, fused)
        self.assertEqual(followed, [True, True])

    @parametrize("in_flight", [None, 1])
    def test_custom_function_reached_only_by_an_undefined_use_gradient(self, in_flight):
        """The engine calls a custom Function that only a use without a
        gradient reaches, with a zero gradient (``materialize_grads``), and its
        backward may still add to the weight's gradient (a weight-decay term).
        W cannot leave that part out: it runs the group from its
        intermediates, and the gradients are bitwise equal to a fused
        backward's."""

        class DropSecond(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                return a.clone()

            @staticmethod
            def backward(ctx, grad):
                return grad, None

        class AddWeightDecay(torch.autograd.Function):
            @staticmethod
            def forward(ctx, w):
                ctx.save_for_backward(w)
                return w.view_as(w)

            @staticmethod
            def backward(ctx, grad):
                (w,) = ctx.saved_tensors
                return grad + 1e-2 * w

        def stage(x, params):
            w, b = params
            h = torch.relu(x @ w) @ w
            kept = torch.addmm(b, torch.relu(h), w.t())
            dropped = torch.relu(h) @ AddWeightDecay.apply(w).t()
            return [torch.relu(DropSecond.apply(kept, dropped)) @ w]

        width, batch = 64, 4
        followed = []
        direct_weight_backward = _backward._direct_weight_backward

        def spy(*args, **kwargs):
            followed.append(direct_weight_backward(*args, **kwargs))
            return followed[-1]

        with mock.patch.object(_backward, "_direct_weight_backward", spy):
            self.run_split_and_fused(
                stage,
                linear_params(1, width=width),
                batch=batch,
                width=width,
                exact=True,
                in_flight=in_flight,
            )
        self.assertEqual(followed, [False, False])

    def reused_layer_flops(self, uses, batch, wrap, in_flight=None):
        """I and W FLOPs of Linear(256, 256) + ReLU (float32) applied ``uses``
        times to ``batch`` rows inside ``wrap``, whether its group moved to I
        or got a matmul plan, and the weight gradients."""
        width = 256
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(width, width) / width**0.5)
        b = torch.nn.Parameter(torch.randn(width))
        x = torch.randn(batch, width, requires_grad=True)
        out = wrap(reused_layer(uses), x, [w, b])[0]
        (_, param_groups), i_flops = count_flops(
            stage_backward_input,
            [out.float()],
            [torch.randn(batch, width)],
            [x],
            iter([w, b]),
            in_flight=in_flight,
        )
        (moved,) = ["param_grads" in g for g in param_groups]
        (direct,) = ["direct" in g for g in param_groups]
        _, w_flops = count_flops(stage_backward_weight, iter([w, b]), param_groups)
        return i_flops, w_flops, moved, direct, (w.grad, b.grad)

    @parametrize("uses", [2, 4, 8])
    def test_checkpointed_reused_layer_has_no_plan(self, uses):
        """Under non-reentrant activation checkpointing the matmuls' saved
        inputs are packed by saved-tensors hooks into a holder, not a tensor: W
        would unpack them, each unpack outside a backward recomputing the
        checkpointed forward, once per use (W at 4 uses
        cost 1.8x the old path's, at 8 uses 3.1x). The group gets no plan: I and
        W cost what they cost without the plan, and the gradients are equal."""

        def checkpointed(stage, x, params):
            return [checkpoint(lambda x: stage(x, params)[0], x, use_reentrant=False)]

        with_plan = self.reused_layer_flops(uses, 8, checkpointed)
        with no_matmul_plan():
            without = self.reused_layer_flops(uses, 8, checkpointed)
        self.assertFalse(with_plan[3])
        self.assertEqual(with_plan[:3], without[:3])
        for grad, ref in zip(with_plan[4], without[4], strict=True):
            self.assertTrue(torch.equal(grad, ref))

    @parametrize("batch", [48, 64])
    def test_reused_layer_plan_w_cannot_follow_keeps_old_rule(self, batch):
        """Under CPU autocast to bfloat16 the weight's cast is cached and shared
        by the uses, below each use's own ``w.t()``: W cannot follow a matmul
        plan (a node reached from one use's own part and from the others). The
        plan is checked in I, so the group gets none and keeps the rule of a
        group without one: at ``in_flight=1`` it moves to I (4 uses, 48 and 64
        rows), and I + W cost a fused backward instead of re-running the
        chain in W (1.375x)."""

        def autocast(stage, x, params):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return stage(x, params)

        with_plan = self.reused_layer_flops(4, batch, autocast, in_flight=1)
        with no_matmul_plan():
            without = self.reused_layer_flops(4, batch, autocast, in_flight=1)
        self.assertFalse(with_plan[3])
        self.assertTrue(with_plan[2])
        self.assertEqual(with_plan[:3], without[:3])
        self.assertEqual(with_plan[1], 0)
        for grad, ref in zip(with_plan[4], without[4], strict=True):
            self.assertTrue(torch.equal(grad, ref))

    def test_reused_layer_that_is_not_a_matmul_has_no_plan(self):
        """A weight reused through another op (an elementwise scale) keeps the
        rule of a group whose weight backward re-runs the chain: no plan."""

        def stage(x, params):
            for _ in range(4):
                x = torch.tanh(x * params[0])
            return [x]

        self.run_split_and_fused(stage, linear_params(1)[1:], batch=1)
        self.assertEqual(self.direct, [False])

    def test_activations_kept_by_another_group_are_not_counted(self):
        """A layer after the reused one: its weight backward starts above the
        reused layer's chain and keeps all of it alive, so moving the reused
        layer would free only its saved gradients (4 uses of 3 rows: 192
        elements, less than 272). It keeps the old path and holds no more."""

        def stage(x, params):
            x = reused_layer(4)(x, params[:2])[0]
            return plain_stack(x, params[2:])

        params = linear_params(2)
        self.run_split_and_fused(stage, params, batch=3)
        self.assertEqual(self.moved, [False, False])
        held, _ = self.held_bytes(stage, linear_params(2), 3)
        stock, _ = self.held_bytes(stage, linear_params(2), 3, keep_graph=True)
        self.assertEqual(held, stock)

    @parametrize("batch, moves", [(4, False), (5, True)])
    def test_layers_sharing_a_chain_move_together(self, batch, moves):
        """A block of two layers applied twice: each layer is its own group, and
        both groups' intermediates reach the chain between the uses, so its
        activations are freed only if both move. Alone, each would trade 272
        elements of weight gradients for 2 * batch * 16 of saved gradients;
        together 544 for 4 * batch * 16 plus the 3 * batch * 16 of the ReLU
        results they free: enough with 5 rows, not with 4."""

        def block(x, params):
            for _ in range(2):
                x = plain_stack(x, params)[0]
            return [x]

        i_flops, w_flops, fused = self.run_split_and_fused(
            block, linear_params(2), batch=batch
        )
        self.assertEqual(self.moved, [moves, moves])
        self.assertEqual(i_flops + w_flops, fused)  # staying: matmul plan
        held, _ = self.held_bytes(block, linear_params(2), batch)
        stock, _ = self.held_bytes(block, linear_params(2), batch, keep_graph=True)
        self.assertEqual(stock, 7 * batch * WIDTH * 8)
        self.assertEqual(held, 2 * 272 * 8 if moves else stock)

    def test_retained_outputs_keep_the_graph(self):
        """A last stage keeps its outputs until W (it returns them), which keeps
        the whole graph alive: nothing is freed by moving, so 4 uses of 3 rows
        keep the old path."""
        params = linear_params(1)
        x = torch.randn(3, WIDTH, dtype=torch.float64, requires_grad=True)
        outputs = reused_layer(4)(x, params)
        _, param_groups = stage_backward_input(
            outputs,
            [torch.ones_like(outputs[0])],
            [x],
            iter(params),
            retained_outputs=outputs,
        )
        self.assertEqual(["param_grads" in g for g in param_groups], [False])
        stage_backward_weight(iter(params), param_groups)

    def test_last_stage_passes_the_outputs_it_keeps(self):
        """The last stage of a schedule passes the outputs it keeps until W (it
        returns them: nothing they reach is counted as freed) and the most
        micro-batches it has between I and W, from the schedule's actions: 1
        for ZBV with both stages on one rank (fake process group). 4 uses of 3
        rows then move: 80 elements more per micro-batch than the 192 of saved
        gradients, once in flight (for a group that must re-run the chain,
        ``no_matmul_plan``; a matmul layer stays and skips the chain in W).
        Gradients equal a fused backward's."""

        class Reused(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w, self.b = linear_params(1)

            def forward(self, x):
                return reused_layer(4)(x, (self.w, self.b))[0]

        class Plain(Reused):
            def forward(self, x):
                return plain_stack(x, (self.w, self.b))[0]

        moved, in_flight, kept = [], [], []

        def record(*args, **kwargs):
            result = stage_backward_input(*args, **kwargs)
            moved.extend("param_grads" in g for g in result[1])
            in_flight.append(kwargs["in_flight"])
            kept.append(kwargs["retained_outputs"])
            return result

        dist.init_process_group("fake", rank=0, world_size=1, store=FakeStore())
        try:
            mods = [Plain(), Reused()]
            refs = [copy.deepcopy(m) for m in mods]
            stages = [
                PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(mods)
            ]

            def loss_fn(out, target):
                return ((out - target) ** 2).sum()

            schedule = ScheduleZBVZeroBubble(
                stages, 2, loss_fn=loss_fn, scale_grads=False
            )
            torch.manual_seed(1)
            x = torch.randn(6, WIDTH, dtype=torch.float64)
            target = torch.randn(6, WIDTH, dtype=torch.float64)
            with (
                mock.patch.object(_stage, "stage_backward_input", record),
                no_matmul_plan(),
            ):
                schedule.step(x, target=target)
        finally:
            dist.destroy_process_group()
        self.assertEqual(moved, [True, True])  # one group, two micro-batches
        self.assertEqual(in_flight, [1, 1])
        self.assertEqual(
            [[t.shape for t in tree_leaves(k)] for k in kept], [[(3, WIDTH)]] * 2
        )
        loss_fn(refs[1](refs[0](x)), target).backward()
        for mod, ref in zip(mods, refs, strict=True):
            for p, r in zip(mod.parameters(), ref.parameters(), strict=True):
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


RANDOM_PROGRAMS, RANDOM_SEED = 100, 0


def random_program(rng):
    """2 to 8 ops over the stage input and 4 weights: a matmul with any weight
    (``x @ w`` or ``F.linear``; a weight may be used several times, in a chain
    or in parallel), tanh, relu, a sum or product of two earlier values; a
    weight penalty in the loss in 1 of 5."""
    ops = []
    for _ in range(rng.randint(2, 8)):
        kind = rng.choice(["mm", "mm", "linear", "tanh", "relu", "add", "mul"])
        ops.append((kind, rng.randrange(4), rng.random(), rng.random()))
    return ops, rng.random() < 0.2


def run_program(program, x, weights):
    ops, penalty = program
    values = [x]
    for kind, w, a, b in ops:
        # mostly the last value, sometimes an earlier one (a skip connection)
        v = values[-1] if a < 0.6 else values[int(a * len(values))]
        other = values[int(b * len(values))]
        if kind == "mm":
            out = v @ weights[w]
        elif kind == "linear":
            out = F.linear(v, weights[w])
        elif kind == "tanh":
            out = torch.tanh(v)
        elif kind == "relu":
            out = torch.relu(v)
        elif kind == "add":
            out = v + other
        else:
            out = v * torch.tanh(other)
        values.append(out)
    if penalty:
        return [(values[-1] ** 2).sum() + (weights[0] ** 2).sum()]
    return [values[-1]]


def count_flops(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and its FLOPs (a FlopCounterMode resets its
    counts on entry, so one counter per call)."""
    counter = FlopCounterMode(display=False)
    with counter:
        result = fn(*args, **kwargs)
    return result, counter.get_total_flops()


class StageBackwardSplitRandomProgramTests(TestCase):
    @parametrize("in_flight", [None, 1, 4])
    def test_random_programs_match_fused_backward(self, in_flight):
        """Seeded random stages (``random_program``), two micro-batches run as
        I, I, W, W: every input and weight gradient equals a fused float64
        backward's, nothing raises, and the input plus weight backwards cost no
        more FLOPs than the fused backwards. ``in_flight=None`` is the default
        call. With 3 rows a reused weight's gradients fit in its saved gradients,
        so every group whose weight backward would re-run a chain moves, whatever
        ``in_flight`` (at 1 row the memory rule keeps some in W, as designed)."""
        kwargs = {} if in_flight is None else {"in_flight": in_flight}
        rng = random.Random(RANDOM_SEED)
        failures = []
        for n in range(RANDOM_PROGRAMS):
            program = random_program(rng)
            penalty = program[1]
            torch.manual_seed(n)
            weights = [
                torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64) / 2)
                for _ in range(4)
            ]
            ref_weights = clone_params(weights)
            xs = [torch.randn(3, 4, dtype=torch.float64) for _ in range(2)]
            grads = [
                None if penalty else [torch.randn(3, 4, dtype=torch.float64)]
                for _ in range(2)
            ]
            fused_flops, ref_dxs = 0, []
            for x, g in zip(xs, grads):
                ref_x = x.clone().requires_grad_()
                outputs = run_program(program, ref_x, ref_weights)
                _, flops = count_flops(torch.autograd.backward, outputs, g)
                fused_flops += flops
                ref_dxs.append(ref_x.grad)
            try:
                split_flops, dxs, pending = 0, [], []
                for x, g in zip(xs, grads):
                    x = x.clone().requires_grad_()
                    outputs = run_program(program, x, weights)
                    (dinputs, groups), flops = count_flops(
                        stage_backward_input, outputs, g, [x], iter(weights), **kwargs
                    )
                    del outputs  # as a stage does after the input backward
                    split_flops += flops
                    dxs.append(dinputs[0])
                    pending.append(groups)
                for groups in pending:
                    _, flops = count_flops(stage_backward_weight, iter(weights), groups)
                    split_flops += flops
                for dx, ref_dx in zip(dxs, ref_dxs, strict=True):
                    torch.testing.assert_close(dx, ref_dx)
                for w, ref in zip(weights, ref_weights, strict=True):
                    if ref.grad is None:
                        self.assertIsNone(w.grad)
                    else:
                        torch.testing.assert_close(w.grad, ref.grad)
                self.assertLessEqual(split_flops, fused_flops)
            except Exception as e:
                message = str(e).strip().splitlines() or [""]
                failures.append(f"program {n}: {type(e).__name__}: {message[-1][:80]}")
        self.assertFalse(
            failures,
            f"{len(failures)} of {RANDOM_PROGRAMS} random programs failed:\n"
            + "\n".join(failures),
        )


instantiate_parametrized_tests(StageBackwardSplitReuseTests)
instantiate_parametrized_tests(StageBackwardSplitRandomProgramTests)


if __name__ == "__main__":
    run_tests()
