# Owner(s): ["oncall: distributed"]
"""A Parameter shared by two stages on the same rank (tied embedding / head) gets the
gradient of a single-process reference with scale_grads=True: it is divided by the number
of micro-batches once, after both stages have accumulated into it. The schedules still do
that through each stage's ``scale_grads`` / ``perform_reduce_grad``, once per stage and
step, so a subclass that overrides them keeps working, and a stage's grads are final when
its hook returns."""

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

DIM, N_MICROBATCHES = 4, 4
# Stages on each rank: V layouts place stages 0 and 3 on rank 0, loop layouts 0 and 2.
V_LAYOUT = {0: [0, 3], 1: [1, 2]}
LOOP_LAYOUT = {0: [0, 2], 1: [1, 3]}
SCHEDULES = {
    ScheduleZBVZeroBubble: V_LAYOUT,
    ScheduleDualPipeV: V_LAYOUT,
    ScheduleInterleavedZeroBubble: LOOP_LAYOUT,
    ScheduleInterleaved1F1B: LOOP_LAYOUT,  # no dX/dW split: the control
}


class TiedIn(torch.nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.weight = tied

    def forward(self, x):
        return torch.tanh(x @ self.weight)


class TiedOut(TiedIn):
    def forward(self, x):
        return x @ self.weight.t()


class Hidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(DIM, DIM, dtype=torch.float64)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def build(layout):
    """The four stage modules; the tied weight is used by both stages on rank 0."""
    torch.manual_seed(0)
    tied = torch.nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64) * 0.5)
    hidden = [Hidden(), Hidden()]
    tied_stages = layout[0]
    modules, next_hidden = [], iter(hidden)
    for index in range(4):
        if index == tied_stages[0]:
            modules.append(TiedIn(tied))
        elif index == tied_stages[1]:
            modules.append(TiedOut(tied))
        else:
            modules.append(next(next_hidden))
    return tied, hidden, modules


class RecordingStage(PipelineStage):
    """Records each parameter's grad when the schedule's scale_grads call returns."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.grads_after_scaling = []

    def scale_grads(self, grad_scale_factor):
        super().scale_grads(grad_scale_factor)
        grads = {id(p): p.grad.clone() for p in self.submod.parameters()}
        self.grads_after_scaling.append(grads)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def parameters(modules):
    return list(dict.fromkeys(p for m in modules for p in m.parameters()))


class ScheduleTiedWeightsTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _reference(self, layout, x, y):
        """Each parameter's grad, in the order of ``parameters(build(layout))``."""
        _, _, modules = build(layout)
        for xm, ym in zip(
            x.chunk(N_MICROBATCHES), y.chunk(N_MICROBATCHES), strict=True
        ):
            h = xm
            for module in modules:
                h = module(h)
            (loss_fn(h, ym) / N_MICROBATCHES).backward()
        return [p.grad for p in parameters(modules)]

    def test_tied_weight_is_scaled_once(self):
        dist.init_process_group(
            backend="gloo",
            store=dist.FileStore(self.file_name, self.world_size),
            rank=self.rank,
            world_size=self.world_size,
        )
        torch.manual_seed(1)
        x = torch.randn(8, DIM, dtype=torch.float64)
        y = torch.randn(8, DIM, dtype=torch.float64)
        for schedule_cls, layout in SCHEDULES.items():
            with self.subTest(schedule=schedule_cls.__name__):
                _, _, modules = build(layout)
                stages = [
                    RecordingStage(modules[i], i, 4, torch.device("cpu"))
                    for i in layout[self.rank]
                ]
                schedule = schedule_cls(
                    stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                )
                if self.rank == 0:
                    schedule.step(x, target=y)
                else:
                    schedule.step(target=y)
                reference = dict(
                    zip(
                        map(id, parameters(modules)),
                        self._reference(layout, x, y),
                        strict=True,
                    )
                )
                for stage in stages:
                    # One call per stage and step; the grads are final when it returns.
                    (recorded,) = stage.grads_after_scaling
                    for param in stage.submod.parameters():
                        torch.testing.assert_close(param.grad, reference[id(param)])
                        torch.testing.assert_close(
                            recorded[id(param)], reference[id(param)]
                        )
                dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
