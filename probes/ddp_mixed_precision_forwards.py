"""Probe: can DDP mixed precision (``mixed_precision=_MixedPrecision(...)``) run a
backward that follows several forwards, as pipeline micro-batches do?

DDP's mixed-precision path needs an accelerator: its constructor calls
``torch.Stream()``, which on a CUDA wheel without a GPU raises "CUDA driver version
is insufficient". On the CPU this probe replaces the three accelerator calls of that
path with CPU stand-ins (a CPU ``torch.Stream``, no-op ``torch.Event`` and
``wait_stream``: exact on the CPU, which runs in order). It is a probe, not a test.

1. One gloo rank: k forwards of one DDP module, then one backward. Counts how often
   DDP's mixed-precision hook fires the reducer per parameter, and whether DDP raises.
2. Two gloo ranks as data-parallel replicas, every stage DDP(mixed_precision),
   ScheduleZBVZeroBubble, ScheduleDualPipeV, ScheduleInterleavedZeroBubble,
   ScheduleInterleaved1F1B (4 micro-batches, 2 steps): what each step raises, or
   whether the grads equal a float64 reference (tolerance 1e-5: the forward runs in
   float32).

    python probes/ddp_mixed_precision_forwards.py
    torch-overlay run -- python probes/ddp_mixed_precision_forwards.py
"""

import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_CPUStream = torch.Stream


class _NoOpEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def wait(self, *args, **kwargs):
        pass


class _CurrentStream:
    def wait_stream(self, stream):
        pass


torch.Stream = lambda *args, **kwargs: _CPUStream(device="cpu")
torch.Event = _NoOpEvent
torch.accelerator.current_stream = lambda *args, **kwargs: _CurrentStream()

from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import (  # noqa: E402
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.nn.parallel.distributed import _MixedPrecision  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test/distributed/pipelining"))
from test_schedule_ddp_manual_scale_grads import (  # noqa: E402
    N_MICROBATCHES,
    Block,
    data,
    loss_fn,
)
from test_schedule_ddp_metadata import reference_grads  # noqa: E402

MP = {
    "param_dtype": torch.float32,
    "reduce_dtype": torch.float64,
    "buffer_dtype": torch.float64,
}
SCHEDULES = {
    ScheduleZBVZeroBubble: 2,
    ScheduleDualPipeV: 2,
    ScheduleInterleavedZeroBubble: 4,
    ScheduleInterleaved1F1B: 4,
}


def build(n):
    torch.manual_seed(0)
    return [Block() for _ in range(n)]


def forwards_then_backward(store_path):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    calls = []
    fire = DDP._fire_reducer_autograd_hook

    def recording_fire(self, idx, *unused):
        calls.append(idx)
        return fire(self, idx, *unused)

    DDP._fire_reducer_autograd_hook = recording_fire
    for k in (1, 2, 3):
        module = torch.nn.Linear(4, 4).double()
        ddp = DDP(module, mixed_precision=_MixedPrecision(**MP))
        calls.clear()
        outs = [ddp(torch.randn(2, 4, dtype=torch.float64)) for _ in range(k)]
        try:
            sum(o.sum() for o in outs).backward()
            result = "no error"
        except RuntimeError as e:
            result = str(e).split(".")[0]
        print(
            f"{k} forward(s), 1 backward: reducer fired for parameter indices "
            f"{sorted(calls)}: {result}"
        )
    DDP._fire_reducer_autograd_hook = fire
    dist.destroy_process_group()


def schedules(rank, world_size, store_path):
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, world_size),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    dp_group = dist.new_group(list(range(world_size)))
    pp_groups = [dist.new_group([r]) for r in range(world_size)]
    for schedule_cls, n_stages in SCHEDULES.items():
        name = schedule_cls.__name__
        modules = build(n_stages)
        stages = [
            PipelineStage(
                DDP(m, process_group=dp_group, mixed_precision=_MixedPrecision(**MP)),
                i,
                n_stages,
                torch.device("cpu"),
                group=pp_groups[rank],
            )
            for i, m in enumerate(modules)
        ]
        schedule = schedule_cls(
            stages,
            n_microbatches=N_MICROBATCHES,
            loss_fn=lambda out, target: loss_fn(out.double(), target),
        )
        for step in range(2):
            x, y = data(step, rank)
            try:
                schedule.step(x, target=y)
            except RuntimeError as e:
                cause = e.__cause__ or e
                if rank == 0:
                    print(f"{name}, step {step}: {str(cause).split('.')[0]}")
                break
            reference = reference_grads(build(n_stages), step, world_size)
            worst = max(
                (p.grad.double() - r.grad).abs().max().item()
                for m, ref in zip(modules, reference, strict=True)
                for p, r in zip(m.parameters(), ref.parameters(), strict=True)
            )
            for m in modules:
                m.zero_grad(set_to_none=True)
            if rank == 0:
                print(f"{name}, step {step}: max grad error {worst:.2e}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        forwards_then_backward(os.path.join(tmp, "store1"))
        mp.spawn(schedules, args=(2, os.path.join(tmp, "store2")), nprocs=2, join=True)
