"""DDP-wrapped pipeline stages: collectives, bytes and step time, stock torch vs the overlay.

    python benchmarks/pipelining_ddp.py [--reps N] [--layers N]

Runs itself twice as a worker (stock, then with the overlay's active patches). Each worker
is one gloo rank (world size 1) holding the two stages of a V or loop layout, each stage a
stack of --layers Linear(64, 64) wrapped in DDP with a comm hook that counts the buckets it
is given and their bytes and returns them unchanged (one rank: an all-reduce would too), so
the counts are exactly what the reducer asks for and the time is the schedule's own. For
ScheduleZBVZeroBubble, ScheduleDualPipeV, ScheduleInterleavedZeroBubble (split dX/dW
backward) and ScheduleInterleaved1F1B (fused backward), 4 micro-batches, it prints per step
(median over --reps steps after 2 warm-up steps): buckets reduced and their bytes, with the
DDP buckets each stage has (the target: each bucket once per step), and the step's CPU ms.
The first step is shown apart (metadata inference runs in it).

Overlay only: the CPU time of the pass over a DDP stage's parameters that the stage's
last weight backward makes before arming the reducer (which of DDP's parameters that W
reaches), per call and per parameter ('pre-check').

Times are CPU time of the thread that runs the schedule (``time.thread_time()``; on CPU
the forward, the backward and the comm hook all run on it), with one intra-op thread
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``): ``time.process_time()`` would also
count the process's other threads, whose spinning dominated it on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEDULES = (
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
    "ScheduleInterleavedZeroBubble",
    "ScheduleInterleaved1F1B",
)
WIDTH, N_MICROBATCHES = 64, 4


def run_schedule(name: str, layers: int, reps: int, store_path: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, schedules
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.manual_seed(0)
    reduced = []  # bytes of the bucket, one entry per call of the hook

    def counting_hook(state, bucket):
        reduced.append(bucket.buffer().numel() * bucket.buffer().element_size())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    def stack():
        return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))

    modules = [DDP(stack(), bucket_cap_mb=0.01) for _ in range(2)]
    for module in modules:
        module.register_comm_hook(None, counting_hook)
    stages = [PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(modules)]

    def loss_fn(output, target):
        return ((output - target) ** 2).mean()

    schedule = getattr(schedules, name)(stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)
    # The overlay's per-step pass over the DDP parameters at each stage's last W.
    precheck = []  # (CPU seconds, parameters) per call
    stage_cls = type(stages[0])
    original = getattr(stage_cls, "_ddp_parameters_missed_by_weight_backward", None)
    own = "_ddp_parameters_missed_by_weight_backward" in vars(stage_cls)
    if original is not None:

        def timed(self, *args, **kwargs):
            start = time.thread_time()
            try:
                return original(self, *args, **kwargs)
            finally:
                precheck.append((time.thread_time() - start, len(self._ddp_reduced_params)))

        stage_cls._ddp_parameters_missed_by_weight_backward = timed
    x, y = torch.randn(16, WIDTH), torch.randn(16, WIDTH)
    steps = []
    try:
        for step in range(2 + reps):
            if step == 2:
                precheck.clear()
            reduced.clear()
            for module in modules:
                module.zero_grad()
            start = time.thread_time()
            schedule.step(x, target=y)
            steps.append(((time.thread_time() - start) * 1e3, len(reduced), sum(reduced)))
    except RuntimeError as error:
        return {"error": str(error).strip().splitlines()[0][:90]}
    finally:
        dist.destroy_process_group()
        if original is not None:
            if own:
                stage_cls._ddp_parameters_missed_by_weight_backward = original
            else:
                del stage_cls._ddp_parameters_missed_by_weight_backward
    buckets = sum(len(m.reducer._get_zeros_like_grad_buckets()) for m in modules)
    later = steps[2:]
    return {
        "first": {"reduced": steps[0][1], "bytes": steps[0][2]},
        "reduced": statistics.median(s[1] for s in later),
        "bytes": statistics.median(s[2] for s in later),
        "ms": statistics.median(s[0] for s in later),
        "buckets": buckets,
        "precheck_us": 1e6 * sum(t for t, _ in precheck) / max(len(precheck), 1),
        "precheck_us_per_param": 1e6
        * sum(t for t, _ in precheck)
        / max(sum(n for _, n in precheck), 1),
    }


def worker(layers: int, reps: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported (run_schedule)
    rows = {}
    for name in SCHEDULES:
        with tempfile.TemporaryDirectory() as scratch:  # FileStore deletes its file itself
            rows[name] = run_schedule(name, layers, reps, f"{scratch}/store")
    print(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    if args.worker:
        worker(args.layers, args.reps)
        return
    sys.path.insert(0, str(REPO))
    from tools.active import run_stock_and_overlay

    command = [sys.executable, __file__, "--worker", "--reps", str(args.reps)]
    command += ["--layers", str(args.layers)]
    plan, stock_out, overlay_out = run_stock_and_overlay(REPO, command)
    stock, overlay = (json.loads(out.strip().splitlines()[-1]) for out in (stock_out, overlay_out))
    print(f"overlay: {plan.summary()}; 2 DDP stages of {args.layers} x Linear({WIDTH}, {WIDTH}) "
          f"on 1 gloo rank, {N_MICROBATCHES} micro-batches, median of {args.reps} steps; "
          "CPU time of the schedule's thread, 1 intra-op thread")  # fmt: skip
    print("columns: stock | overlay; 'reduced' = buckets the reducer hands the comm hook per "
          "step (target: 'buckets', each once)")  # fmt: skip
    header = (f"{'schedule':31} {'buckets':>7} {'step 1 reduced':>16} {'reduced/step':>14} "
              f"{'KiB/step':>17} {'thread CPU ms/step':>24} {'pre-check us/call, /param':>26}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for name in SCHEDULES:
        s, o = stock[name], overlay[name]
        if "error" in s or "error" in o:
            print(f"{name:31} stock: {s.get('error', 'ok')} | overlay: {o.get('error', 'ok')}")
            continue
        print(f"{name:31} {o['buckets']:7} {s['first']['reduced']:7} | {o['first']['reduced']:6} "
              f"{s['reduced']:6g} | {o['reduced']:5g} {s['bytes'] / 1024:8.1f} | "
              f"{o['bytes'] / 1024:6.1f} {s['ms']:8.2f} | {o['ms']:6.2f} | "
              f"{o['ms'] / s['ms']:5.2f}x {o['precheck_us']:15.1f}, {o['precheck_us_per_param']:8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
