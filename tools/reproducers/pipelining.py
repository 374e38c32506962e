"""Pipeline schedules: final gradients compared with a fused single-process backward.

Each scenario runs in spawned children with their own gloo process group (the DTensor
reproducers hold the fake one): one rank, or two for DDP, whose all-reduce changes nothing
over one rank; the children inherit the overlay from verify.
"""

from __future__ import annotations

import tempfile

from tools.reproducers import Outcome, in_spawned_child, in_spawned_ranks, reproducer


def _tied_weight_zbv(store_path: str, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    torch.manual_seed(0)
    tied = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    class TiedIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = tied

        def forward(self, x):
            return torch.tanh(x @ self.weight)

    class TiedOut(TiedIn):
        def forward(self, x):
            return x @ self.weight.t()

    def loss_fn(output, target):
        return ((output - target) ** 2).mean()

    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    device = torch.device("cpu")
    stages = [PipelineStage(TiedIn(), 0, 2, device), PipelineStage(TiedOut(), 1, 2, device)]
    ScheduleZBVZeroBubble(stages, n_microbatches=4, loss_fn=loss_fn).step(x, target=y)
    pipelined, tied.grad = tied.grad.clone(), None
    for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True):
        (loss_fn(TiedOut()(TiedIn()(xm)), ym) / 4).backward()
    queue.put(((pipelined - tied.grad).norm() / tied.grad.norm()).item())
    dist.destroy_process_group()


@reproducer(
    bug="A weight tied across the two stages of a rank (ZBV) is divided twice by scale_grads",
    upstream="-",
    patch="[pipelining] Scale a weight shared by stages on one rank once per step",
)
def tied_weight_scaled_twice() -> Outcome:
    with tempfile.TemporaryDirectory() as scratch:  # FileStore deletes its file itself
        error = in_spawned_child(_tied_weight_zbv, f"{scratch}/store", timeout=120)
    return Outcome(error < 1e-12, f"tied grad relative error {error:.2g} vs a fused backward")


DDP_WORLD_SIZE = 2  # over one rank DDP's all-reduce changes nothing, and the overlay skips it


def _ddp_stages(rank: int, store_path: str, schedule_name: str, queue) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.pipelining import PipelineStage, schedules
    from torch.nn.parallel import DistributedDataParallel as DDP

    # A peer left waiting by a rank that raised times out instead of hanging verify.
    store = dist.FileStore(store_path, DDP_WORLD_SIZE)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=DDP_WORLD_SIZE, timeout=timedelta(seconds=30)
    )
    torch.manual_seed(0)  # the same weights on every rank
    layers = [torch.nn.Linear(4, 4, dtype=torch.float64) for _ in range(2)]
    references = [torch.nn.Linear(4, 4, dtype=torch.float64) for _ in range(2)]
    for layer, reference in zip(layers, references, strict=True):
        reference.load_state_dict(layer.state_dict())
    calls = []

    def counting_hook(process_group, bucket):
        calls.append(1)
        return allreduce_hook(process_group, bucket)

    wrapped = [DDP(layer) for layer in layers]
    for module in wrapped:
        module.register_comm_hook(None, counting_hook)

    def loss_fn(output, target):
        return ((output - target) ** 2).mean()

    def batch(r: int, step: int):
        generator = torch.Generator().manual_seed(100 * step + r)  # different data per rank
        return [torch.randn(8, 4, dtype=torch.float64, generator=generator) for _ in range(2)]

    device = torch.device("cpu")
    # (dp, pp) = (2, 1): each rank runs the whole two-stage pipeline on its own data.
    pipeline_group, _ = dist.new_subgroups(group_size=1)
    per_step, error = [], None
    try:
        stages = [
            PipelineStage(m, i, 2, device, group=pipeline_group) for i, m in enumerate(wrapped)
        ]
        schedule = getattr(schedules, schedule_name)(stages, n_microbatches=4, loss_fn=loss_fn)
        for step in range(2):
            calls.clear()
            for module in layers + references:
                module.zero_grad()
            x, y = batch(rank, step)
            schedule.step(x, target=y)
            per_step.append(len(calls))
            # DDP's truth: the mean over ranks of each rank's gradients, without collectives.
            for r in range(DDP_WORLD_SIZE):
                xr, yr = batch(r, step)
                for xm, ym in zip(xr.chunk(4), yr.chunk(4), strict=True):
                    out = references[1](references[0](xm))
                    (loss_fn(out, ym) / 4 / DDP_WORLD_SIZE).backward()
            error = max(
                ((p.grad - r.grad).norm() / r.grad.norm()).item()
                for layer, reference in zip(layers, references, strict=True)
                for p, r in zip(layer.parameters(), reference.parameters(), strict=True)
            )
        queue.put((rank, (per_step, error, None)))
    except Exception as e:  # a peer still waiting times out (above) and reports too
        queue.put((rank, (per_step, error, str(e).strip().splitlines()[0][:70])))
    dist.destroy_process_group()


def _ddp_outcome(schedule_name: str) -> Outcome:
    with tempfile.TemporaryDirectory() as scratch:
        ranks = in_spawned_ranks(
            _ddp_stages, DDP_WORLD_SIZE, f"{scratch}/store", schedule_name, timeout=120
        )
    # Two one-bucket DDP stages: one all-reduce each per step, on every rank.
    ok = all(
        failure is None and per_step == [2, 2] and error is not None and error < 1e-12
        for per_step, error, failure in ranks
    )
    per_step, error, failure = max(
        ranks, key=lambda r: (r[2] is not None, r[1] if r[1] is not None else float("inf"))
    )  # the worst rank
    detail = f"all-reduces per step {per_step} (want [2, 2])"
    if error is not None:
        detail += f", grad relative error {error:.2g}"
    return Outcome(ok, detail + (f"; {failure}" if failure else ""))


@reproducer(
    bug="DDP-wrapped stages under ScheduleZBVZeroBubble (2 ranks, 2 steps): reduced never or twice",
    upstream="pytorch/pytorch#144530",
    patch="[pipelining] Reduce a DDP stage's gradients in its last weight backward with finalize_backward()",
)
def ddp_zero_bubble_reduces_once() -> Outcome:
    return _ddp_outcome("ScheduleZBVZeroBubble")


@reproducer(
    bug="DDP-wrapped stages under Interleaved1F1B: metadata inference arms DDP, step 1 reduces twice",
    upstream="-",
    patch="[pipelining] Run a DDP stage's forward under no_sync during metadata inference",
)
def ddp_first_step_reduces_twice() -> Outcome:
    return _ddp_outcome("ScheduleInterleaved1F1B")
