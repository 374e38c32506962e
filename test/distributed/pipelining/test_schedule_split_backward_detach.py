# Owner(s): ["oncall: distributed"]
"""Zero-bubble schedules (split dX/dW backward) give the gradients of a single-process
reference on stages with view outputs, parameter-only outputs and outputs used
inside the stage, free what the loss saved before the last stage's weight backward and
the graphs of the step once it ran, and leave a parameter returned as an output
requiring grad; Interleaved1F1B (fused backward) is the control."""

import collections
import gc
import weakref

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests

DIM, BATCH, N_MICROBATCHES = 4, 8, 4
V_LAYOUT = {0: [0, 3], 1: [1, 2]}
LOOP_LAYOUT = {0: [0, 2], 1: [1, 3]}
SCHEDULES = {
    ScheduleZBVZeroBubble: V_LAYOUT,
    ScheduleDualPipeV: V_LAYOUT,
    ScheduleInterleavedZeroBubble: LOOP_LAYOUT,
    ScheduleInterleaved1F1B: LOOP_LAYOUT,  # no dX/dW split: the control
}


def param(*shape):
    return torch.nn.Parameter(torch.randn(*shape, dtype=torch.float64) * 0.5)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = param(DIM, DIM)

    def forward(self, x):
        return torch.tanh(x @ self.w)


class ParameterOutput(torch.nn.Module):
    """A view output, and an output that only depends on a parameter."""

    def __init__(self):
        super().__init__()
        self.w, self.pos = param(DIM, DIM), param(DIM, DIM)

    def forward(self, x):
        return torch.tanh(x @ self.w).view(-1, DIM), self.pos[0] * 1.0


class OutputUsedInside(torch.nn.Module):
    """An output that the stage also uses for another output."""

    def __init__(self):
        super().__init__()
        self.w, self.wc = param(DIM, DIM), param(DIM, DIM)

    def forward(self, x, pos):
        h1 = torch.tanh(x @ self.w + pos)
        return h1, h1 @ self.wc


class ReturnsParameter(torch.nn.Module):
    """A last stage that returns one of its parameters as an output."""

    def __init__(self):
        super().__init__()
        self.w, self.t = param(DIM, DIM), param(DIM, DIM)

    def forward(self, x):
        return torch.tanh(x @ self.w), self.t


class Sum(torch.nn.Module):
    def forward(self, h1, h2):
        return h1 + h2


MODELS = {
    "outputs": (Linear, ParameterOutput, OutputUsedInside, Sum),
    "parameter_returned": (Linear, Linear, Linear, ReturnsParameter),
}


def build(model):
    torch.manual_seed(0)
    return [cls() for cls in MODELS[model]]


def count_accumulations(modules):
    """How often AccumulateGrad ran for each parameter (post-accumulate-grad hooks)."""
    counts = collections.Counter()
    for module in modules:
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(lambda p: counts.update([p]))
    return counts


def loss_fn(output, target):
    if isinstance(output, tuple):
        output, scale = output
        return ((output - target) ** 2).mean() * scale.mean()
    return ((output - target) ** 2).mean()


def recording_loss_fn(saved):
    """loss_fn, recording a weak reference to every tensor its graph saves."""

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    def recording(output, target):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return loss_fn(output, target)

    return recording


def record_alive_at_weight_backward(stages, saved):
    """Count, at each weight backward of the last stage, the loss-saved tensors alive."""
    alive = []
    for stage in stages:
        if not stage.is_last:
            continue
        original = stage.backward_weight_one_chunk

        def backward_weight_one_chunk(*args, original=original, **kwargs):
            gc.collect()
            alive.append(sum(ref() is not None for ref in saved))
            return original(*args, **kwargs)

        stage.backward_weight_one_chunk = backward_weight_one_chunk
    return alive


class ScheduleSplitBackwardDetachTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _reference(self, model, x, y):
        modules = build(model)
        for xm, ym in zip(
            x.chunk(N_MICROBATCHES), y.chunk(N_MICROBATCHES), strict=True
        ):
            out = modules[0](xm)
            for module in modules[1:]:
                out = module(*out) if isinstance(out, tuple) else module(out)
            (loss_fn(out, ym) / N_MICROBATCHES).backward()
        return modules

    def check_matches_reference(self, model):
        dist.init_process_group(
            backend="gloo",
            store=dist.FileStore(self.file_name, self.world_size),
            rank=self.rank,
            world_size=self.world_size,
        )
        torch.manual_seed(1)
        x = torch.randn(BATCH, DIM, dtype=torch.float64)
        y = torch.randn(BATCH, DIM, dtype=torch.float64)
        reference = self._reference(model, x, y)
        weight_backwards_of_last_stage = 0
        for schedule_cls, layout in SCHEDULES.items():
            with self.subTest(schedule=schedule_cls.__name__):
                modules = build(model)
                accumulations = count_accumulations(modules)
                stages = [
                    PipelineStage(modules[i], i, 4, torch.device("cpu"))
                    for i in layout[self.rank]
                ]
                saved = []  # weak references to what the loss's graph saves
                alive_at_w = record_alive_at_weight_backward(stages, saved)
                schedule = schedule_cls(
                    stages,
                    n_microbatches=N_MICROBATCHES,
                    loss_fn=recording_loss_fn(saved),
                )
                losses, outputs = [], None
                if self.rank == 0:
                    outputs = schedule.step(x, target=y, losses=losses)
                else:
                    outputs = schedule.step(target=y, losses=losses)
                # With the losses and outputs still held, as a trainer does, the
                # graphs of the step are freed (guard: stock frees them too).
                gc.collect()
                self.assertEqual([ref() for ref in saved if ref() is not None], [])
                del outputs, losses  # held until here on purpose
                if model == "outputs":
                    # No parameter feeds the loss, so W never runs the loss
                    # function's graph: what it saved is freed after I, before
                    # the last stage's W, as on stock.
                    weight_backwards_of_last_stage += len(alive_at_w)
                    self.assertEqual(sum(alive_at_w), 0)
                # A parameter returned as an output keeps requiring grad.
                for i in layout[self.rank]:
                    for name, p in modules[i].named_parameters():
                        self.assertTrue(p.requires_grad, msg=f"stage {i} {name}")
                for i in layout[self.rank]:
                    for (name, p), ref in zip(
                        modules[i].named_parameters(),
                        reference[i].parameters(),
                        strict=True,
                    ):
                        msg = f"stage {i} {name}"
                        torch.testing.assert_close(p.grad, ref.grad, msg=msg)
                        # one AccumulateGrad per micro-batch, as in a fused backward
                        self.assertEqual(accumulations[p], N_MICROBATCHES, msg=msg)
                dist.barrier()
        if model == "outputs" and any(
            3 in lay[self.rank] for lay in SCHEDULES.values()
        ):
            # the check above ran (ZBV has the last stage run W for a micro-batch)
            self.assertGreater(weight_backwards_of_last_stage, 0)
        dist.destroy_process_group()

    def test_view_and_parameter_outputs(self):
        self.check_matches_reference("outputs")

    def test_last_stage_returns_a_parameter(self):
        self.check_matches_reference("parameter_returned")


if __name__ == "__main__":
    run_tests()
