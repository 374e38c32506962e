"""What a compile costs eager DTensor code afterwards: stock torch vs the overlay, one run.

    python benchmarks/dtensor_compile_cache.py [--compiles N] [--out FILE]

"[DTensor] Keep traced ops out of the native sharding cache from Python" empties DTensor's
native sharding cache when a trace starts, so after a compile the eager ops recompute their
shardings once. This measures that, in one process per variant (stock, overlay), rank 0 of 2
on the fake process group: a tensor-parallel MLP step (forward and backward, Colwise +
Rowwise) in eager, warmed up; then N times: compile a small DTensor function from scratch
(`torch._dynamo.reset()`, aot_eager), and time the first eager MLP step after it. Reports,
per variant, the median CPU ms of a warm step, of the first step after a compile, of the
compile itself, the native cache's misses in that first step, and the compiled
function's output mesh type (a trace's FakeScriptObject leaking into eager would show
there). Writes reports/dtensor_compile_cache.json (--out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 2


def cpu_ms(fn) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1e3


def native_cache_misses() -> int:
    from torch.distributed.tensor import debug

    return debug._get_fast_path_sharding_prop_cache_stats()[1]


def worker(compiles: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    batch = torch.rand(4, 16)

    def step():
        model(batch).sum().backward()

    def compiled_function(w):
        return (w * 2).redistribute(mesh, [Replicate()]) + 1

    w = DTensor.from_local(torch.rand(4, 8), mesh, [Shard(0)], run_check=False)
    for _ in range(5):
        step()
    warm = statistics.median(cpu_ms(step) for _ in range(20))
    first_after, compile_ms, misses, mesh_types = [], [], [], set()
    for _ in range(compiles):
        torch._dynamo.reset()
        fn = torch.compile(compiled_function, backend="aot_eager", fullgraph=True)
        compile_ms.append(cpu_ms(lambda fn=fn: fn(w)))
        misses_before = native_cache_misses()
        first_after.append(cpu_ms(step))
        misses.append(native_cache_misses() - misses_before)
        mesh_types.add(type(compiled_function(w).device_mesh).__name__)
    return {
        "warm_step_ms": warm,
        "first_step_after_compile_ms": statistics.median(first_after),
        "compile_ms": statistics.median(compile_ms),
        "native_cache_misses_in_first_step": statistics.median(misses),
        "eager_output_mesh_after_compile": sorted(mesh_types),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compiles", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "dtensor_compile_cache.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.compiles)))
        return

    sys.path.insert(0, str(REPO))
    from tools.active import environment, materialize

    results = {}
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        plan = materialize(REPO, tree)
        for label, env in (("stock", environment(None)), ("overlay", environment(tree))):
            command = [sys.executable, __file__, "--worker", "--compiles", str(args.compiles)]
            out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"the {label} worker failed:\n{out.stderr[-3000:]}")
            results[label] = json.loads(out.stdout.strip().splitlines()[-1])

    print(f"overlay: {plan.summary()}; rank 0 of {WORLD_SIZE}, fake process group; "
          f"median of {args.compiles} compiles, CPU ms")  # fmt: skip
    keys = ["warm_step_ms", "first_step_after_compile_ms", "compile_ms"]
    keys.append("native_cache_misses_in_first_step")
    print(f"{'':34}{'stock':>10}{'overlay':>10}")
    for key in keys:
        print(f"{key:34}{results['stock'][key]:10.2f}{results['overlay'][key]:10.2f}")
    for label, r in results.items():
        extra = r["first_step_after_compile_ms"] - r["warm_step_ms"]
        print(f"{label}: first eager step after a compile costs {extra:+.2f} ms over a warm "
              f"step; eager output mesh after a compile: {', '.join(r['eager_output_mesh_after_compile'])}")  # fmt: skip
    report = {"overlay": plan.summary(), "compiles": args.compiles, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
