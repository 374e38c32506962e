"""DTensor sharding-propagation cost on a cache MISS: stock torch vs the overlay, one run.

    python benchmarks/dtensor_propagation_miss.py [--reps N] [--rep-ms MS | --calls N]
                                                  [--quick] [--only TEXT] [--meshes 1,2,3]
                                                  [--noise] [--out FILE]

`dtensor_dispatch.py` times cache hits. Tracing (torch.compile, export) bypasses the
sharding-propagation caches, so every traced op pays the miss cost, and that cost grows
with the mesh's dimensions (single-dim rules are expanded over every mesh dim). This script
clears every sharding-propagation cache (the Python LRU cache of propagate_op_sharding, the
tensor-meta cache and the native fast-path cache) before each call and times that one call,
for every op a DTensor patch of the dtensor-partial topic touches, on a 1-D (2), 2-D (2x2)
and 3-D (2x2x2) mesh.

Two long-lived workers, one on stock torch and one with the overlay's active patches, are
driven with interleaved repetitions (stock rep i, overlay rep i, ...) by the driver of
`dtensor_dispatch.py`, imported from there. Each worker is rank 0 of 8 on the fake process
group; the 1-D and 2-D meshes are submeshes of the (2, 2, 2) mesh.
Inputs carry Partial(sum) on the last mesh dim: [P], [S(0), P], [S(0), R, P] (plus a few
product / bitwise rows). The time is the worker's CPU time per call (time.process_time).
A repetition is about --rep-ms of cleared-cache calls (at least one; the count is picked per
row from a timed call), so 1-D rows (about 1 ms a call) average dozens of calls and 3-D rows
(up to about 100 ms) one or two; --calls N fixes the count instead.

Two counts per row do not depend on the machine's load: the Python function calls of one
cleared-cache call (cProfile, C builtins included) and the collectives it issues
(CommDebugMode), each per variant. A row whose overlay issues more collectives than stock
pays for a reduction its patch makes on purpose (reduce first where keeping the Partial was
wrong); such rows are flagged "collective" as well.

Prints per row: median ms per call (stock, overlay), the overlay/stock ratio (median of
per-repetition ratios), Python calls per call (stock, overlay), collectives per call when
they differ, and flags rows slower than 1.05x. --noise runs stock torch in both workers: its
ratios are this machine's noise floor for the same settings. Writes
reports/dtensor_propagation_miss.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import operator
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dtensor_dispatch import (
    Worker,
    collectives_of,
    interleaved,
    reply_channel,
    selected_rows,
    serve,
    stock_and_overlay,
)

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 8
RATIO_LIMIT = 1.05


# --------------------------------------------------------------------------------------
# Worker side.


def cases(meshes):
    """(name, setup) pairs; setup() returns a callable that runs the op once."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    def placements(ndim, last, first):
        return {1: [last], 2: [first, last], 3: [first, Replicate(), last]}[ndim]

    def dtensor(mesh, last=None, dtype=torch.float32, shape=(8, 8), first=None):
        # first: the placement on the first of 2 or 3 mesh dims, Shard(0) unless given
        last = Partial() if last is None else last
        first = Shard(0) if first is None else first
        local = torch.ones(shape, dtype=dtype)
        full_shape = torch.Size(shape)
        return DTensor.from_local(
            local.narrow(first.dim, 0, shape[first.dim] // 2).contiguous()
            if mesh.ndim > 1
            else local,
            mesh,
            placements(mesh.ndim, last, first),
            run_check=False,
            shape=full_shape if mesh.ndim > 1 else None,
            stride=local.stride() if mesh.ndim > 1 else None,
        )

    def op(fn, last=None, dtype=torch.float32, shape=(8, 8), n_inputs=1, first=None):
        def make(mesh):
            def setup():
                xs = [
                    dtensor(mesh, Partial() if last is None else last, dtype, shape, first)
                    for _ in range(n_inputs)
                ]
                return lambda: fn(*xs)

            return setup

        return make

    def replicate_plus(fn, last=None, dtype=None):
        # fn(x, r): x carries ``last`` (Partial(sum) unless given), r is Replicate
        def make(mesh):
            def setup():
                x = dtensor(mesh, last, dtype or torch.float32)
                r = DTensor.from_local(
                    torch.ones(8, 8, dtype=x.dtype),
                    mesh,
                    [Replicate()] * mesh.ndim,
                    run_check=False,
                )
                return lambda: fn(x, r)

            return setup

        return make

    def mixed(fn, specs):
        # one DTensor per (last placement, dtype) in specs, passed in that order
        def make(mesh):
            def setup():
                xs = [dtensor(mesh, last, dtype) for last, dtype in specs]
                return lambda: fn(*xs)

            return setup

        return make

    def index_select(x):
        index = DTensor.from_local(
            torch.tensor([1, 0]), x.device_mesh, [Replicate()] * x.ndim, run_check=False
        )
        return x.index_select(0, index)

    def two(fn, other_shape):
        def make(mesh):
            def setup():
                x, y = dtensor(mesh), dtensor(mesh, shape=other_shape)
                return lambda: fn(x, y)

            return setup

        return make

    def index_fill(x):
        index = DTensor.from_local(
            torch.tensor([1, 0]), x.device_mesh, [Replicate()] * x.ndim, run_check=False
        )
        value = DTensor.from_local(
            torch.tensor(2.0), x.device_mesh, [Replicate()] * x.ndim, run_check=False
        )
        return aten.index_fill.int_Tensor(x, 1, index, value)

    aten, prims = torch.ops.aten, torch.ops.prims
    f32, bf16, i32, i64 = torch.float32, torch.bfloat16, torch.int32, torch.int64
    i8, u8 = torch.int8, torch.uint8
    product, bxor = Partial("product"), Partial("bxor")
    rows = [
        # casts and view(dtype)
        ("to(bf16)", op(lambda x: x.to(bf16))),
        ("to(f64)", op(lambda x: x.to(torch.float64))),
        ("to(int32)", op(lambda x: x.to(i32))),
        ("int64 .float()", op(lambda x: x.float(), dtype=i64)),
        ("prims.convert_element_type(bf16)", op(lambda x: prims.convert_element_type(x, bf16))),
        (
            "bf16 prims.convert_element_type(f32)",
            op(lambda x: prims.convert_element_type(x, f32), dtype=bf16),
        ),  # fmt: skip
        ("view(int32)", op(lambda x: x.view(i32))),
        # one-input pass-through, fill_, zero_
        ("clone", op(lambda x: x.clone())),
        ("detach", op(lambda x: x.detach())),
        ("alias", op(lambda x: aten.alias(x))),
        ("contiguous", op(lambda x: aten.contiguous(x))),
        ("fill_(1.5)", op(lambda x: x.fill_(1.5))),
        ("zero_", op(lambda x: x.zero_())),
        ("clone P(product)", op(lambda x: x.clone(), last=product)),
        ("clone int P(bxor)", op(lambda x: x.clone(), last=bxor, dtype=i64)),
        # views and selections
        ("t", op(lambda x: x.t())),
        ("t P(product)", op(lambda x: x.t(), last=product)),
        ("x[:, 1]", op(lambda x: x[:, 1])),
        ("x[1]", op(lambda x: x[1])),
        ("x[:, 2:]", op(lambda x: x[:, 2:])),
        ("x[:, 1] P(product)", op(lambda x: x[:, 1], last=product)),
        ("split", op(lambda x: x.split(4, dim=1))),
        ("unbind", op(lambda x: x.unbind(1))),
        ("cat", op(lambda x, y: torch.cat([x, y], dim=1), n_inputs=2)),
        ("cat P(product)", op(lambda x, y: torch.cat([x, y], dim=1), last=product, n_inputs=2)),
        # inputs that carry a Partial and need another redistribution (Shard(1) on the
        # first mesh dim, on 2-D and 3-D meshes): every rule is expanded
        ("x[:, 1] S(1)", op(lambda x: x[:, 1], first=Shard(1))),
        ("x[:, 1] S(1) P(product)", op(lambda x: x[:, 1], last=product, first=Shard(1))),
        ("cat S(1)", op(lambda x, y: torch.cat([x, y], dim=1), n_inputs=2, first=Shard(1))),
        (
            "cat S(1) P(product)",
            op(lambda x, y: torch.cat([x, y], 1), last=product, n_inputs=2, first=Shard(1)),
        ),  # fmt: skip
        ("index_select", op(index_select)),
        ("index_fill", op(index_fill)),
        ("slice_scatter", two(lambda x, y: torch.slice_scatter(x, y, 1, 0, 4), (8, 4))),
        (
            "select_backward",
            op(lambda g: aten.select_backward(g, [8, 8], 1, 1), shape=(8,)),
        ),  # fmt: skip
        (
            "slice_backward",
            op(lambda g: aten.slice_backward(g, [8, 8], 1, 0, 4, 1), shape=(8, 4)),
        ),  # fmt: skip
        # factories
        ("new_zeros", op(lambda x: x.new_zeros((8, 8)))),
        ("new_empty", op(lambda x: x.new_empty((8, 8)))),
        ("new_empty_strided", op(lambda x: x.new_empty_strided((8, 8), (8, 1)))),
        ("new_full", op(lambda x: x.new_full((8, 8), 2.0))),
        ("empty_like", op(lambda x: torch.empty_like(x))),
        ("zeros_like", op(lambda x: torch.zeros_like(x))),
        # pointwise / copy / redistribution
        (
            "_foreach_zero_ (4) R",
            op(lambda *xs: torch._foreach_zero_(list(xs)), last=Replicate(), n_inputs=4),
        ),  # fmt: skip
        ("copy_ P <- P", op(lambda x, y: x.copy_(y), n_inputs=2)),
        ("copy_ R <- R", op(lambda x, y: x.copy_(y), last=Replicate(), n_inputs=2)),
        ("P + R", replicate_plus(lambda x, r: x + r)),
        ("P.add_(R)", replicate_plus(lambda x, r: x.add_(r))),
        ("P + 0-dim int64", op(lambda x: x + torch.tensor(5))),
        (
            "maximum P(max) P(max)",
            op(lambda x, y: torch.maximum(x, y), last=Partial("max"), n_inputs=2),
        ),  # fmt: skip
        ("rsub(P, int64 R)", mixed(torch.rsub, [(Partial(), f32), (Replicate(), i64)])),
        ("P - int64 R", mixed(operator.sub, [(Partial(), f32), (Replicate(), i64)])),
        (
            "div(int32 R, int32 R, out=P(avg))",
            mixed(
                lambda a, b, out: torch.div(a, b, out=out),
                [(Replicate(), i32), (Replicate(), i32), (Partial("avg"), f32)],
            ),
        ),  # fmt: skip
        (
            "maximum(uint8 R, int8 P(min), out=uint8 P(min))",
            mixed(
                lambda a, b, out: torch.maximum(a, b, out=out),
                [(Replicate(), u8), (Partial("min"), i8), (Partial("min"), u8)],
            ),
        ),  # fmt: skip
        (
            "maximum(uint8 P(max), int8 P(max), out=uint8 P(max))",
            mixed(
                lambda a, b, out: torch.maximum(a, b, out=out),
                [(Partial("max"), u8), (Partial("max"), i8), (Partial("max"), u8)],
            ),
        ),  # fmt: skip
        ("R.addcmul_(x, x), x = P", replicate_plus(lambda x, r: r.addcmul_(x, x, value=0.5))),
        # 0020 / 0012: an integer or bool Partial(sum) meets a float operand (reduced or
        # converted first); a 0-dim float64 operand the op narrows into float32
        ("int64 P + f32 R", mixed(operator.add, [(Partial(), i64), (Replicate(), f32)])),
        ("bool P + f32 R", mixed(operator.add, [(Partial(), torch.bool), (Replicate(), f32)])),
        ("int32 P * 0.5", op(lambda x: x * 0.5, dtype=i32)),
        ("P + 0-dim f64", op(lambda x: x + torch.tensor(0.5, dtype=torch.float64))),
        # a Partial(max/min) through add/sub/neg: kept for floating dtypes, reduced
        # first for an integer computation (its arithmetic wraps)
        ("P(max) + R", mixed(operator.add, [(Partial("max"), f32), (Replicate(), f32)])),
        ("int32 P(max) + R", mixed(operator.add, [(Partial("max"), i32), (Replicate(), i32)])),
        ("neg P(max)", op(lambda x: -x, last=Partial("max"))),
        ("int32 neg P(max)", op(lambda x: -x, last=Partial("max"), dtype=i32)),
        # matmul-like ops: a Partial(sum) and a floating Partial(avg) pass through, an
        # integer Partial(avg) is reduced first (its average truncates)
        ("P @ R", replicate_plus(torch.mm)),
        ("P(avg) @ R", replicate_plus(torch.mm, last=Partial("avg"))),
        ("int64 P @ R", replicate_plus(torch.mm, dtype=i64)),
        ("int64 P(avg) @ R", replicate_plus(torch.mm, last=Partial("avg"), dtype=i64)),
        # norms and pooling
        ("vector_norm(2)", op(lambda x: torch.linalg.vector_norm(x))),
        (
            "vector_norm(inf) P(max)",
            op(lambda x: torch.linalg.vector_norm(x, float("inf")), last=Partial("max")),
        ),  # fmt: skip
        ("linalg._powsum(2)", op(lambda x: aten.linalg__powsum(x, 2))),
        ("nansum", op(lambda x: torch.nansum(x))),
        (
            "_foreach_powsum(2) (2)",
            op(lambda x, y: aten._foreach_powsum([x, y], 2), n_inputs=2),
        ),  # fmt: skip
        (
            "avg_pool2d int64",
            op(lambda x: torch.nn.functional.avg_pool2d(x, 2), dtype=i64, shape=(2, 4, 4)),
        ),  # fmt: skip
        ("avg_pool2d", op(lambda x: torch.nn.functional.avg_pool2d(x, 2), shape=(2, 4, 4))),
        # linear ops that keep a Partial(sum) unless they promote an integer or bool
        ("sum", op(lambda x: x.sum())),
        ("sum(dim=1)", op(lambda x: x.sum(1))),
        ("int64 sum", op(lambda x: x.sum(), dtype=i64)),
        ("cumsum", op(lambda x: x.cumsum(1))),
        ("mean", op(lambda x: x.mean(), last=Partial("avg"))),
        ("x * 0.5", op(lambda x: x * 0.5)),
        ("x / 2", op(lambda x: x / 2)),
        ("int64 x * 2", op(lambda x: x * 2, dtype=i64)),
        ("P + P", op(lambda x, y: x + y, n_inputs=2)),
        ("_foreach_mul(0.5) (2)", op(lambda x, y: torch._foreach_mul([x, y], 0.5), n_inputs=2)),
    ]
    return [(f"{name} [{mesh.ndim}-D]", make(mesh)) for mesh in meshes for name, make in rows]


def clear_caches() -> None:
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()


def time_miss(run, calls: int) -> dict:
    cpu = 0.0
    gc.disable()
    try:
        for _ in range(calls):
            clear_caches()
            start = time.process_time()
            run()
            cpu += time.process_time() - start
    finally:
        gc.enable()
    return {"ms": 1e3 * cpu / calls}


def python_calls_of(run, calls: int = 3) -> int:
    """Python function calls (C builtins included) of one cleared-cache call: a count that
    does not depend on the machine's load."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    for _ in range(calls):
        clear_caches()
        profile.enable()
        run()
        profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return round(sum(entry[1] for entry in stats.values()) / calls)


def prepare_miss(run, rep_ms: float) -> dict:
    """Warm up (imports, lazy registrations), count collectives and Python calls of one
    cleared-cache call, and pick how many calls a repetition of about rep_ms makes."""
    run()
    clear_caches()
    collectives, _ = collectives_of(lambda: (clear_caches(), run()))
    calls = python_calls_of(run)
    per_call_ms = min(time_miss(run, 1)["ms"] for _ in range(3))
    return {
        "collectives": collectives,
        "python_calls": calls,
        "calls_per_rep": max(1, min(1000, round(rep_ms / max(per_call_ms, 1e-3)))),
    }


def worker(ndims: list[int], rep_ms: float) -> None:
    reply = reply_channel()

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    mesh3 = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    by_ndim = {1: mesh3["c"], 2: mesh3["b", "c"], 3: mesh3}

    def prepare_row(setup, request):
        run = setup()
        return run, prepare_miss(run, rep_ms)

    serve(
        reply,
        dict(cases([by_ndim[n] for n in ndims])),
        {
            "prepare": prepare_row,
            "rep": lambda runs, request: time_miss(runs[request["row"]], request["calls"]),
        },
    )


# --------------------------------------------------------------------------------------
# Driver side: dtensor_dispatch.py's.


def summarize(name: str, prepared: dict, reps: dict) -> dict:
    row: dict = {"name": name}
    for label in ("stock", "overlay"):
        errors = [r["error"] for r in [prepared[label], *reps[label]] if "error" in r]
        if errors:
            row[label] = {"error": errors[0]}
        elif not reps[label]:
            row[label] = {"error": "not timed (the other variant failed)"}
        else:
            times = [r["ms"] for r in reps[label]]
            row[label] = {
                "median_ms": statistics.median(times),
                "min_ms": min(times),
                "calls_per_rep": prepared[label]["calls_per_rep"],
                "python_calls": prepared[label]["python_calls"],
                "collectives": prepared[label]["collectives"],
            }
    if any("error" in row[label] for label in ("stock", "overlay")):
        row["ratio"], row["flags"] = None, ["error"]
        return row
    paired = [o["ms"] / s["ms"] for s, o in zip(reps["stock"], reps["overlay"], strict=True)]
    row["ratio"] = statistics.median(paired)
    row["flags"] = ["slower"] if row["ratio"] > RATIO_LIMIT else []
    stock_comms = sum(row["stock"]["collectives"].values())
    if sum(row["overlay"]["collectives"].values()) > stock_comms:
        row["flags"].append("collective")
    return row


@contextlib.contextmanager
def two_stock_workers(args: list[str]):
    """Like stock_and_overlay, with stock torch in both workers (--noise)."""
    sys.path.insert(0, str(REPO))
    from tools.active import environment

    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        workers = {
            label: Worker(label, environment(None), __file__, args, Path(scratch))
            for label in ("stock", "overlay")
        }
        try:
            yield "stock torch in both workers (--noise)", None, workers
        finally:
            for w in workers.values():
                w.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=11, help="repetitions per row and variant")
    parser.add_argument(
        "--rep-ms", type=float, default=40.0,
        help="CPU ms of cleared-cache calls per repetition (at least one call)",
    )  # fmt: skip
    parser.add_argument(
        "--calls", type=int, help="cleared-cache calls per repetition, instead of --rep-ms"
    )
    parser.add_argument("--quick", action="store_true", help="3 repetitions of 1 call")
    parser.add_argument("--only", action="append", help="rows whose name contains TEXT")
    parser.add_argument("--meshes", default="1,2,3", help="mesh dims to run, e.g. 3 or 1,2,3")
    parser.add_argument(
        "--noise", action="store_true", help="stock torch in both workers: the noise floor"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "reports" / "dtensor_propagation_miss.json"
    )
    args = parser.parse_args()
    ndims = [int(n) for n in args.meshes.split(",")]
    if args.worker:
        worker(ndims, args.rep_ms)
        return
    if args.quick:
        args.reps, args.calls = 3, 1

    def calls_of(prepared: dict) -> dict:
        return {"calls": args.calls or prepared["calls_per_rep"]}

    started = time.monotonic()
    workers_of = two_stock_workers if args.noise else functools.partial(stock_and_overlay, __file__)
    with workers_of(["--meshes", args.meshes, "--rep-ms", str(args.rep_ms)]) as (
        plan, overlay_files, workers,
    ):  # fmt: skip
        rows = []
        for name in selected_rows(workers, args.only):
            prepared, reps = interleaved(workers, name, args.reps, calls_of)
            row = summarize(name, prepared, reps)
            rows.append(row)
            s, o = row["stock"], row["overlay"]
            if row["ratio"] is None:
                print(f"{name:44} stock {s.get('error', 'ok')} | overlay {o.get('error', 'ok')}")
                continue
            comms = ""
            if s["collectives"] != o["collectives"]:
                comms = f"  collectives {sum(s['collectives'].values())} -> " \
                        f"{sum(o['collectives'].values())}"  # fmt: skip
            print(f"{name:44} {s['median_ms']:9.2f} {o['median_ms']:9.2f} "
                  f"{row['ratio']:6.2f}x {s['python_calls']:7d} {o['python_calls']:7d} "
                  f"{o['python_calls'] / s['python_calls']:6.3f}{comms}  "
                  f"{', '.join(row['flags'])}", flush=True)  # fmt: skip
    wall_s = time.monotonic() - started

    timed = [r for r in rows if r["ratio"] is not None]
    worst = max(timed, key=lambda r: r["ratio"], default=None)
    flagged = [r["name"] for r in rows if "slower" in r["flags"] or "error" in r["flags"]]
    summary = plan if isinstance(plan, str) else plan.summary()
    per_rep = f"{args.calls} call(s)" if args.calls else f"~{args.rep_ms:g} ms of calls"
    print(f"overlay: {summary}; rank 0 of {WORLD_SIZE} on the fake process group; "
          f"{args.reps} interleaved repetitions of {per_rep}; columns: row, stock ms, "
          f"overlay ms (median CPU ms per cache-missing call), ratio, Python calls per "
          f"call (stock, overlay, ratio); wall {wall_s:.0f} s")  # fmt: skip
    if worst:
        print(f"worst ratio: {worst['ratio']:.2f}x ({worst['name']}); "
              f"{len(flagged)} row(s) flagged (> {RATIO_LIMIT}x or error)")  # fmt: skip
    report = {
        "overlay_files": overlay_files,
        "partial": bool(args.only or args.quick or args.meshes != "1,2,3" or args.noise),
        "noise": args.noise,
        "overlay": summary,
        "reps": args.reps,
        "rep_ms": None if args.calls else args.rep_ms,
        "calls": args.calls,
        "wall_s": round(wall_s),
        "ratio_limit": RATIO_LIMIT,
        "worst": {"row": worst["name"], "ratio": worst["ratio"]} if worst else None,
        "flagged": flagged,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
