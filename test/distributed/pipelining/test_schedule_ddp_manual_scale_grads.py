# Owner(s): ["oncall: distributed"]
"""A pipeline stage whose DDP module requires manual backward finalization gets its
reduced gradients only from the caller's finalize_backward() after step(), so a
schedule's scale_grads=True, which divides the gradients at the end of step(),
cannot be honoured: every rank refuses the combination at the start of step(),
before anything is computed or exchanged.

Its setup (two gloo ranks, float64 blocks and data, DDP with a recording comm
hook) is also imported by the other DDP pipelining tests."""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleInterleaved1F1B,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests

DIM, BATCH, N_MICROBATCHES = 4, 8, 4
# stages per rank; both ranks are data-parallel replicas holding every stage
STAGES_PER_RANK = {Schedule1F1B: 1, ScheduleInterleaved1F1B: 2}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64) * 0.1)

    def forward(self, x):
        return torch.tanh(x @ self.w + self.b)


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def data(step, dp_rank):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    x = torch.randn(BATCH, DIM, dtype=torch.float64, generator=g)
    y = torch.randn(BATCH, DIM, dtype=torch.float64, generator=g)
    return x, y


def recording_ddp(module, dp_group, calls, tag=(), **ddp_kwargs):
    """``module`` in DDP with one parameter per bucket (once DDP rebuilt its
    buckets after the first backward) and, unless ``calls`` is None, a comm hook
    that appends ``(*tag, bucket index, bucket parameters)`` to ``calls`` and
    all-reduces the bucket."""
    ddp = DDP(module, process_group=dp_group, bucket_cap_mb=1e-6, **ddp_kwargs)
    if calls is not None:

        def hook(state, bucket):
            calls.append((*tag, bucket.index(), bucket.parameters()))
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(dp_group, hook)
    return ddp


class TwoRankGlooTestCase(MultiProcessTestCase):
    """Two spawned ranks; ``init_gloo()`` joins them in a gloo process group."""

    @property
    def world_size(self) -> int:
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def init_gloo(self):
        dist.init_process_group(
            backend="gloo",
            store=dist.FileStore(self.file_name, self.world_size),
            rank=self.rank,
            world_size=self.world_size,
        )


class ScheduleDDPManualScaleGradsTest(TwoRankGlooTestCase):
    def test_ddp_manual_finalization_scale_grads_refused(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls, n_stages in STAGES_PER_RANK.items():
            with self.subTest(schedule=schedule_cls.__name__):
                torch.manual_seed(0)
                modules = [Block() for _ in range(n_stages)]
                calls = []
                stages = []
                for i, module in enumerate(modules):
                    ddp = recording_ddp(module, dp_group, calls, (i,))
                    ddp.require_manual_backward_finalization = True
                    stages.append(
                        PipelineStage(
                            ddp, i, n_stages, torch.device("cpu"), group=pp_group
                        )
                    )
                schedule = schedule_cls(
                    stages if n_stages > 1 else stages[0],
                    n_microbatches=N_MICROBATCHES,
                    loss_fn=loss_fn,
                    scale_grads=True,
                )
                x, y = data(0, self.rank)
                with self.assertRaisesRegex(
                    RuntimeError,
                    r"scale_grads=True\) divides the gradients of stage 0 .*"
                    r"require_manual_backward_finalization=True.*"
                    r"Pass scale_grads=False",
                ):
                    schedule.step(x, target=y)
                self.assertEqual(calls, [])
                for module in modules:
                    for p in module.parameters():
                        self.assertIsNone(p.grad)
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
