"""Python function calls of one DTensor model compile, stock torch vs the overlay: where the
overlay adds work while compiling, measured independently of machine load.

    python benchmarks/dtensor_compile_calls.py [--model block|llama] [--without TEXT ...]
                                               [--out FILE]

The models and the compiling step are those of `dtensor_compile_time.py` (2x2 mesh, rank 0
of 4 on the fake process group, SimpleFSDP x TP, aot_eager, every sharding cache emptied
and Dynamo reset before the compile). Each variant (stock, the overlay, and per
`--without TEXT` the overlay with the patch whose subject contains TEXT reverse-applied; a
`+` joins several, taken out in the order given, later patches first) runs in its own
process: it compiles once to warm imports and lazy registrations, then counts, with
`sys.setprofile`, every Python function call ("call" events; builtins are not counted) of
a second compile and attributes each to the innermost region below that it runs in. The
counts are deterministic for a given tree, so a difference of a few hundred calls between
variants is real, where wall-clock ratios on a loaded machine are not.

Regions ("other" = calls in that region not inside a region further down the list):
dynamo's frame compile, guard building, AOTAutograd's metadata collection, the
partitioner, DTensor's dispatch (OpDispatcher.dispatch and the slow path that C++ calls
on a native-cache miss), its local-op computation (the op on the local tensors, as the
Python path runs it: stock runs the same op from C++ on a native-cache hit, so those
calls show up under the enclosing region there), the overlay's traced-op tail
(`_dispatch_traced_op`) and traced-cache lookup (`propagate_op_sharding_traced`),
sharding propagation misses (`propagate_op_sharding_non_cached`, with the number of
calls), redistribution, DTensor flatten/unflatten.

Prints, per region, the calls of each variant and the difference from stock; writes
reports/dtensor_compile_calls.json (--out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]

# (file name, function name) -> region; the innermost region entered owns a call.
REGIONS = {
    ("convert_frame.py", "_compile"): "dynamo frame compile, other",
    ("guards.py", "build_guards"): "dynamo guard building",
    ("collect_metadata_analysis.py", "inner"): "AOT metadata collection, other",
    ("partitioners.py", "min_cut_rematerialization_partition"): "partitioner",
    ("partitioners.py", "default_partition"): "partitioner",
    ("_dispatch.py", "dispatch"): "DTensor dispatch, other",
    ("_dispatch.py", "_propagate_op_sharding_dispatch_slow_path"): "DTensor dispatch, other",
    ("_dispatch.py", "_dispatch_get_local_results_slow_path"): "DTensor local op (Python path)",
    ("_dispatch.py", "_dispatch_traced_op"): "DTensor traced-op tail (overlay)",
    ("_sharding_prop.py", "propagate_op_sharding_traced"): "traced sharding cache lookup",
    ("_sharding_prop.py", "propagate_op_sharding_non_cached"): "sharding propagation (miss)",
    ("_redistribute.py", "redistribute_local_tensor"): "redistribute",
    ("_api.py", "__tensor_unflatten__"): "DTensor flatten/unflatten",
    ("_api.py", "__tensor_flatten__"): "DTensor flatten/unflatten",
}
OUTSIDE = "outside dynamo"
MISS = "sharding propagation (miss)"


def worker(model_name: str) -> dict:
    """Count the Python calls of one compile of ``model_name`` in this process."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from dtensor_compile_time import MESH_SHAPE, WORLD_SIZE, build, clear_sharding_caches
    from torch.distributed.tensor import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    inductor_config.force_disable_caches = True
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=("dp", "tp"))
    model, inputs = build(model_name, mesh)

    def step() -> None:
        torch._dynamo.reset()
        clear_sharding_caches()
        compiled = torch.compile(model, backend="aot_eager")
        model.zero_grad(set_to_none=True)
        compiled(inputs).sum().backward()

    counts: dict[str, int] = {}
    misses = [0]
    stack = [OUTSIDE]
    frames: list[object] = []

    def profile(frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            region = REGIONS.get((code.co_filename.rsplit("/", 1)[-1], code.co_name))
            owner = region or stack[-1]
            counts[owner] = counts.get(owner, 0) + 1
            if region:
                misses[0] += region == MISS
                stack.append(region)
                frames.append(frame)
        elif event == "return" and frames and frames[-1] is frame:
            frames.pop()
            stack.pop()

    step()  # imports, lazy registrations
    sys.setprofile(profile)
    step()
    sys.setprofile(None)
    return {"calls": counts, "total": sum(counts.values()), "misses": misses[0]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=["block", "llama"], default="block")
    parser.add_argument(
        "--without", action="append", default=[],
        help="add a variant: the overlay without the patch(es) whose subject contains TEXT",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "dtensor_compile_calls.json")
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker)
        sys.__stdout__.write("RESULT " + json.dumps(result) + "\n")
        return

    sys.path.insert(0, str(REPO))
    from dtensor_compile_time import without_patch

    from tools.active import environment, materialize

    results: dict[str, dict] = {}
    removed: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        materialize(REPO, tree)
        envs = {"stock": environment(None), "overlay": environment(tree)}
        for i, text in enumerate(args.without):
            other = Path(scratch) / f"tree-without-{i}"
            materialize(REPO, other)
            label = f"overlay - {text}"
            removed[label] = [without_patch(other, part) for part in text.split("+")]
            envs[label] = environment(other)
        for label, env in envs.items():
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", args.model],
                cwd=REPO, env=env, capture_output=True, text=True,
            )  # fmt: skip
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"the {label} worker failed")
            results[label] = json.loads(lines[-1][len("RESULT ") :])
            print(f"{label}: {results[label]['total']} Python calls", flush=True)

    stock = results["stock"]
    regions = sorted(
        {r for res in results.values() for r in res["calls"]},
        key=lambda r: -abs(results["overlay"]["calls"].get(r, 0) - stock["calls"].get(r, 0)),
    )
    labels = list(results)
    print(f"\nPython calls of one {args.model} compile, by region (diff: variant - stock)")
    print(f"{'region':36s}" + "".join(f"{label[:22]:>24s}" for label in labels))
    for region in ["TOTAL", *regions]:
        row = f"{region:36s}"
        for label in labels:
            res = results[label]
            n = res["total"] if region == "TOTAL" else res["calls"].get(region, 0)
            base = stock["total"] if region == "TOTAL" else stock["calls"].get(region, 0)
            row += f"{n:>14d}" + (f" ({n - base:+7d})" if label != "stock" else " " * 10)
        print(row)
    print(
        "sharding propagation misses: "
        + ", ".join(f"{k} {v['misses']}" for k, v in results.items())
    )
    for label, subjects in removed.items():
        print(f"{label}: reverse-applied {subjects}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"model": args.model, "results": results, "removed": removed}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
