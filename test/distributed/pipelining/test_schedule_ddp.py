# Owner(s): ["oncall: distributed"]
"""Pipeline stages wrapped in DDP on a (dp, pp) = (2, 2) mesh: after every step each
rank's gradients equal a single-process reference averaged over the data-parallel
replicas, and DDP reduces every bucket exactly once per step, for the zero-bubble
schedules (split dX/dW backward) and Interleaved1F1B (fused backward, the control)."""

import collections

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

DP, PP, N_STAGES = 2, 2, 4
DIM, BATCH, N_MICROBATCHES, N_STEPS = 4, 8, 4, 2
V_LAYOUT = {0: [0, 3], 1: [1, 2]}
LOOP_LAYOUT = {0: [0, 2], 1: [1, 3]}
SCHEDULES = {
    ScheduleZBVZeroBubble: V_LAYOUT,
    ScheduleDualPipeV: V_LAYOUT,
    ScheduleInterleavedZeroBubble: LOOP_LAYOUT,
    ScheduleInterleaved1F1B: LOOP_LAYOUT,  # no dX/dW split: the control
}
DDP_CONFIGS = {
    "default": {},
    "find_unused_parameters": {"find_unused_parameters": True},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
}


class Block(torch.nn.Module):
    def __init__(self, with_unused: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64) * 0.1)
        if with_unused:
            self.unused = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(x @ self.w + self.b)


def build(with_unused: bool):
    torch.manual_seed(0)
    return [Block(with_unused) for _ in range(N_STAGES)]


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def data(step: int, dp_rank: int):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    x = torch.randn(BATCH, DIM, dtype=torch.float64, generator=g)
    y = torch.randn(BATCH, DIM, dtype=torch.float64, generator=g)
    return x, y


def reference_grads(step: int, with_unused: bool):
    """Gradients of one process running the whole model, averaged over replicas."""
    modules = build(with_unused)
    for dp_rank in range(DP):
        x, y = data(step, dp_rank)
        for xm, ym in zip(
            x.chunk(N_MICROBATCHES), y.chunk(N_MICROBATCHES), strict=True
        ):
            out = xm
            for module in modules:
                out = module(out)
            (loss_fn(out, ym) / (N_MICROBATCHES * DP)).backward()
    return modules


def counting_allreduce_hook(calls):
    def hook(process_group, bucket):
        calls[bucket.index()] += 1
        return default_hooks.allreduce_hook(process_group, bucket)

    return hook


class ScheduleDDPTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return DP * PP

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @parametrize("config", list(DDP_CONFIGS))
    def test_ddp_stages(self, config):
        dist.init_process_group(
            backend="gloo",
            store=dist.FileStore(self.file_name, self.world_size),
            rank=self.rank,
            world_size=self.world_size,
        )
        mesh = init_device_mesh("cpu", (DP, PP), mesh_dim_names=("dp", "pp"))
        dp_rank, pp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
        ddp_kwargs = DDP_CONFIGS[config]
        with_unused = ddp_kwargs.get("find_unused_parameters", False)
        references = [reference_grads(step, with_unused) for step in range(N_STEPS)]
        for schedule_cls, layouts in SCHEDULES.items():
            layout = layouts[pp_rank]
            modules = build(with_unused)
            calls = {i: collections.Counter() for i in layout}
            stages = []
            for i in layout:
                ddp = DDP(
                    modules[i],
                    process_group=mesh.get_group("dp"),
                    bucket_cap_mb=1e-6,
                    **ddp_kwargs,
                )
                ddp.register_comm_hook(
                    mesh.get_group("dp"), counting_allreduce_hook(calls[i])
                )
                stages.append(
                    PipelineStage(
                        ddp,
                        i,
                        N_STAGES,
                        torch.device("cpu"),
                        group=mesh.get_group("pp"),
                    )
                )
            schedule = schedule_cls(
                stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
            )
            for step in range(N_STEPS):
                x, y = data(step, dp_rank)
                if 0 in layout:
                    schedule.step(x, target=y)
                else:
                    schedule.step(target=y)
                for stage, i in zip(stages, layout, strict=True):
                    msg = f"{schedule_cls.__name__}, step {step}, stage {i}"
                    # One all-reduce per bucket of this step; DDP rebuilds its buckets
                    # (here one per parameter) at the first forward of the second step.
                    n_buckets = len(stage.submod.reducer._get_zeros_like_grad_buckets())
                    self.assertEqual(
                        dict(calls[i]), dict.fromkeys(range(n_buckets), 1), msg=msg
                    )
                    calls[i].clear()
                    for (name, p), ref in zip(
                        modules[i].named_parameters(),
                        references[step][i].parameters(),
                        strict=True,
                    ):
                        torch.testing.assert_close(
                            p.grad, ref.grad, msg=f"{msg} {name}"
                        )
                        if p.grad is not None:
                            p.grad.zero_()
            dist.barrier()
        dist.destroy_process_group()


instantiate_parametrized_tests(ScheduleDDPTest)

if __name__ == "__main__":
    run_tests()
