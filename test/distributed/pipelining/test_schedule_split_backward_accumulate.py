# Owner(s): ["oncall: distributed"]
"""Zero-bubble schedules (split dX/dW backward) accumulate weight gradients through
AccumulateGrad: one accumulation per parameter and micro-batch, as in a fused
backward, and the gradients of a single-process reference on stages with shared
weights and with weights summed before use; Interleaved1F1B (fused backward) is
the control."""

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


class SharedBlock(torch.nn.Module):
    """ALBERT-style reuse (l1, l2, l1) and a bias shared by two products."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.bias = (param(DIM, DIM) for _ in range(3))

    def forward(self, x):
        h = torch.tanh(torch.tanh(x @ self.l1 + self.bias[0]) @ self.l2 + self.bias[0])
        return torch.tanh(h @ self.l1)


class SummedWeights(torch.nn.Module):
    """Two weights summed before use: both get the same gradient tensor."""

    def __init__(self):
        super().__init__()
        self.wa, self.wb = param(DIM, DIM), param(DIM, DIM)

    def forward(self, x):
        return torch.tanh(x @ (self.wa + self.wb))


MODELS = {
    "shared_weights": (Linear, SharedBlock, SharedBlock, Linear),
    "summed_weights": (Linear, SummedWeights, SummedWeights, Linear),
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


class ScheduleSplitBackwardAccumulateTest(MultiProcessTestCase):
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
        for schedule_cls, layout in SCHEDULES.items():
            with self.subTest(schedule=schedule_cls.__name__):
                modules = build(model)
                accumulations = count_accumulations(modules)
                stages = [
                    PipelineStage(modules[i], i, 4, torch.device("cpu"))
                    for i in layout[self.rank]
                ]
                saved = []  # weak references to what the loss's graph saves
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
        dist.destroy_process_group()

    def test_shared_weights(self):
        self.check_matches_reference("shared_weights")

    def test_weights_summed_before_use(self):
        self.check_matches_reference("summed_weights")


if __name__ == "__main__":
    run_tests()
