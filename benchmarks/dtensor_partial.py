"""Collectives and time per op on Partial DTensors: stock torch vs the overlay, one run.

    python benchmarks/dtensor_partial.py [--reps N] [--numel N]

Runs itself twice as a worker (stock, then with the overlay's active patches) and prints,
per case, the collectives one op issues and its median wall time, with overlay/stock
ratios. Two ranks are simulated in one process (LocalTensorMode over the fake process
group), so collective counts are exact, while times measure DTensor dispatch plus local
compute of both simulated ranks on this CPU, not network cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 2


def cases(numel: int):
    """(name, setup) pairs; setup returns a callable that runs the op once."""
    import torch
    from torch.distributed.tensor import Partial, Replicate, Shard

    def cast(dtype_in, dtype_out, reduce_op="sum"):
        def setup(make):
            dt = make(Partial(reduce_op), dtype_in)
            return lambda: dt.to(dtype_out)

        return setup

    def round_trip(setup_make):
        dt = setup_make(Partial("sum"), torch.float32)
        return lambda: dt.to(torch.bfloat16).float()

    def view_dtype(make):
        dt = make(Partial("sum"), torch.float32)
        return lambda: dt.view(torch.int32)

    def addcmul(make):
        out, p = make(Replicate(), torch.float32), make(Partial("sum"), torch.float32)
        return lambda: out.addcmul_(p, p, value=0.0)

    def select_slice(reduce_op):
        def setup(make):
            dt = make(Partial(reduce_op), torch.float32)
            return lambda: dt[1:][:4].select(0, 1)

        return setup

    def reduce_avg(dtype, target):
        def setup(make):
            dt = make(Partial("avg"), dtype)
            return lambda: dt.redistribute(dt.device_mesh, [target])

        return setup

    def adam(foreach):
        def setup(make):
            weight = torch.nn.Parameter(make(Replicate(), torch.float32))
            weight.grad = make(Partial("sum"), torch.float32)
            optimizer = torch.optim.Adam([weight], lr=1e-3, foreach=foreach)
            return optimizer.step

        return setup

    return [
        ("P(sum) f32 -> bf16", cast(torch.float32, torch.bfloat16)),
        ("P(sum) f32 -> bf16 -> f32", round_trip),
        ("P(sum) f32 -> f16", cast(torch.float32, torch.float16)),
        ("P(sum) f32 -> int32", cast(torch.float32, torch.int32)),
        ("P(max) int32 -> int8", cast(torch.int32, torch.int8, "max")),
        ("P(sum) f32 .view(int32)", view_dtype),
        ("P(sum) int8 -> int32", cast(torch.int8, torch.int32)),
        ("R.addcmul_(P, P)", addcmul),
        ("P(sum) slice", select_slice("sum")),
        ("P(product) slice", select_slice("product")),
        ("P(avg) f32 -> R", reduce_avg(torch.float32, Replicate())),
        ("P(avg) f32 -> S(0)", reduce_avg(torch.float32, Shard(0))),
        ("P(avg) bf16 -> R", reduce_avg(torch.bfloat16, Replicate())),
        ("P(avg) int32 -> R", reduce_avg(torch.int32, Replicate())),
        ("P(avg) int64 -> S(0)", reduce_avg(torch.int64, Shard(0))),
        ("Adam.step, 1 P(sum) grad", adam(False)),
        ("Adam(foreach).step, 1 P(sum) grad", adam(True)),
    ]


def worker(reps: int, numel: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.distributed.tensor import DTensor, init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    dist.init_process_group("fake", rank=0, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    mode = LocalTensorMode(frozenset(range(WORLD_SIZE)))

    def make(placement, dtype):
        local = {r: (torch.rand(numel) * 4 - 1).to(dtype) for r in range(WORLD_SIZE)}
        return DTensor.from_local(LocalTensor(local), mesh, [placement], run_check=False)

    results = {}
    for name, setup in cases(numel):
        run = setup(make)
        comm = CommDebugMode()
        try:
            with mode, comm:
                run()  # also warms the sharding-propagation caches
            times = []
            for _ in range(reps):
                with mode:
                    start = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - start)
            results[name] = {
                "collectives": comm.get_total_counts(),
                "ms": 1e3 * statistics.median(times),
            }
        except RuntimeError as error:
            results[name] = {"error": str(error).splitlines()[0][:60]}
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--numel", type=int, default=1 << 16)
    args = parser.parse_args()
    if args.worker:
        worker(args.reps, args.numel)
        return
    sys.path.insert(0, str(REPO))
    from tools.active import run_stock_and_overlay

    worker_command = [sys.executable, __file__, "--worker", "--reps", str(args.reps)]
    worker_command += ["--numel", str(args.numel)]
    plan, stock_out, overlay_out = run_stock_and_overlay(REPO, worker_command)
    stock, overlay = (json.loads(out.strip().splitlines()[-1]) for out in (stock_out, overlay_out))
    print(f"overlay: {plan.summary()}; {WORLD_SIZE} simulated ranks, {args.numel} elements, "
          f"median of {args.reps}")  # fmt: skip
    header = f"{'case':36} {'collectives stock -> overlay':>29} {'ms stock':>9} {'ms overlay':>11} {'time ratio':>11}"
    print(header)
    print("-" * len(header))
    for name in stock:
        s, o = stock[name], overlay[name]
        if "error" in s or "error" in o:
            print(
                f"{name:36} {s.get('error', s.get('collectives'))!s:>14} -> {o.get('error', o.get('collectives'))!s}"
            )
            continue
        print(f"{name:36} {s['collectives']:>14} -> {o['collectives']:<12} {s['ms']:>9.3f} {o['ms']:>11.3f} "
              f"{o['ms'] / s['ms']:>10.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
