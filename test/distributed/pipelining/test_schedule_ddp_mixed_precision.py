# Owner(s): ["oncall: distributed"]
"""A pipeline stage whose module is DistributedDataParallel with mixed_precision
set is refused: DDP's mixed precision registers its reducer hooks at every
forward and removes them at the end of the backward that reduces, so a backward
after several forwards of the module (one per micro-batch, and the forward that
infers the stage's metadata) raises "Expected to mark a variable ready only
once" in the middle of the step, with DDP alone too; and it casts parameters and
gradients back up and drops its hooks at the end of the autograd pass in which
a bucket completes, which a split weight backward runs as several passes.

Two data-parallel replicas (world size 2, gloo), each holding every stage, DDP
(bf16 parameters, fp32 reduction and buffers) on every stage, under
ScheduleZBVZeroBubble, ScheduleDualPipeV, ScheduleInterleavedZeroBubble and
ScheduleInterleaved1F1B: every rank raises the same error at the first step,
before any forward (every parameter still float64, DDP casts it in its forward
pre-hook, and no gradient).

DDP's mixed precision creates streams and events, which a machine without an
accelerator cannot create: there they are replaced by no-ops
(ddp_mixed_precision_streams), which is exact since CPU ops run synchronously in
issue order."""

import contextlib
from unittest import mock

import torch
import torch.distributed as dist
from test_schedule_ddp import build, DP, SCHEDULES
from test_schedule_ddp_manual_scale_grads import (
    data,
    loss_fn,
    N_MICROBATCHES,
    TwoRankGlooTestCase,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.parallel.distributed import _MixedPrecision
from torch.testing._internal.common_utils import run_tests


class _NoStream(contextlib.nullcontext):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass


class _NoEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def wait(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass


@contextlib.contextmanager
def ddp_mixed_precision_streams():
    """DDP's mixed precision creates streams and events (torch.Stream,
    torch.Event, torch.accelerator.current_stream) in its constructor and
    forward, which a machine without an accelerator cannot create. There they
    are replaced by no-ops, which is exact: CPU ops run synchronously in issue
    order, so a stream's ordering and an event's wait add nothing. With an
    accelerator the real ones are used."""
    if torch.accelerator.is_available():
        yield
        return
    with (
        mock.patch.object(torch, "Stream", _NoStream),
        mock.patch.object(torch, "Event", _NoEvent),
        mock.patch.object(
            torch.accelerator, "current_stream", lambda *a, **k: _NoStream()
        ),
    ):
        yield


class ScheduleDDPMixedPrecisionTest(TwoRankGlooTestCase):
    def test_ddp_mixed_precision_refused(self):
        # DDP(mixed_precision=...) on every stage: the first step raises the
        # same error on both ranks before any forward (DDP alone fails in the
        # middle of the step, see the module docstring).
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        mixed = _MixedPrecision(
            param_dtype=torch.bfloat16,
            reduce_dtype=torch.float32,
            buffer_dtype=torch.float32,
        )
        messages = []
        for schedule_cls, n_stages in SCHEDULES.items():
            with self.subTest(schedule=schedule_cls.__name__):
                modules = build(n_stages)
                with ddp_mixed_precision_streams():
                    stages = [
                        PipelineStage(
                            DDP(module, process_group=dp_group, mixed_precision=mixed),
                            i,
                            n_stages,
                            torch.device("cpu"),
                            group=pp_group,
                        )
                        for i, module in enumerate(modules)
                    ]
                    schedule = schedule_cls(
                        stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                    )
                    x, y = data(0, self.rank)
                    stage_list = ", ".join(map(str, range(n_stages)))
                    with self.assertRaisesRegex(
                        RuntimeError,
                        rf"Stages \[{stage_list}\] are DistributedDataParallel "
                        "modules with mixed_precision set.*Nothing was run.*"
                        r"fully_shard\(\) with MixedPrecisionPolicy",
                    ) as raised:
                        schedule.step(x, target=y)
                messages.append(str(raised.exception))
                # No forward ran: DDP casts the parameters to bf16 in its
                # forward's pre-hook.
                for module in modules:
                    for p in module.parameters():
                        self.assertEqual(p.dtype, torch.float64)
                        self.assertIsNone(p.grad)
        gathered = [None] * DP
        dist.all_gather_object(gathered, messages, group=dp_group)
        self.assertEqual(gathered[0], gathered[1])
        self.assertEqual(len(gathered[0]), len(SCHEDULES))
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
