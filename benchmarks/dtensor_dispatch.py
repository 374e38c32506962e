"""DTensor dispatch cost per op: stock torch vs the overlay, measured in one run.

    python benchmarks/dtensor_dispatch.py [--reps N] [--quick] [--only TEXT] [--rank R]
                                          [--mesh SHAPE] [--out FILE]

Starts two long-lived worker processes, one on stock torch and one with the overlay's
active patches, and drives them with interleaved repetitions (stock rep i, overlay rep i,
stock rep i+1, ...) so that machine noise hits both alike. Each worker is rank 0 of 2 on the
fake process group (--rank 1: rank 1, for rules whose local work differs by rank): DTensor dispatch (C++ fast path, sharding propagation, redistribution)
runs as on a real rank, collectives are counted (CommDebugMode) but move no data, and local
tensors are tiny so the time is dispatch, not compute. A repetition times a batch of calls
(about --rep-ms long) and reports the time per call: the worker's CPU time
(time.process_time), so that time spent waiting for a core while other processes run does
not count; the wall time is kept in the JSON report too.

Prints per row: median CPU us per call (stock, overlay), the spread (interquartile range of the
repetitions), the overlay/stock ratio (median of the per-repetition ratios, with their
IQR), collectives per call and the bytes this rank would send for them (ring algorithm);
then the size of the sharding-propagation caches in each worker. Flags rows slower than
1.05x and rows whose caches keep growing after warm-up (one entry per distinct value, say).
Writes everything, with the worst ratio, to reports/dtensor_dispatch.json (--out).

--mesh 2x2 (or 2x2x2, 3x2, ...) times, instead, the rows of `mesh_cases` on a mesh of that
shape (rank 0 of its size): an operand split from Replicate into Partial(sum) on several
mesh dims, with a float32 operand of the same move as control. Such a run is partial (its
report does not stand for the full run).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD_SIZE = 2
RATIO_LIMIT = 1.05


# --------------------------------------------------------------------------------------
# Worker side: runs in each variant's process.


def cases(mesh):
    """(name, setup) pairs; setup() returns a callable that runs the op once."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    def dtensor(placement):
        # 8 x 8 globally, so t(), mm(x, x) and a Partial grad of a sharded param all fit
        rows = 8 // WORLD_SIZE if isinstance(placement, Shard) else 8
        return DTensor.from_local(torch.rand(rows, 8), mesh, [placement], run_check=False)

    def op(placement, fn):
        def setup():
            x = dtensor(placement)
            return lambda: fn(x)

        return setup

    def out_variant(placement, fn, out_shape):
        # fn(x, out): an out= op whose out holds the placement the op gives
        def setup():
            x = dtensor(placement)
            rows = out_shape[0] // WORLD_SIZE if isinstance(placement, Shard) else out_shape[0]
            out = DTensor.from_local(
                torch.rand(rows, *out_shape[1:]), mesh, [placement], run_check=False
            )
            return lambda: fn(x, out)

        return setup

    def partial_and_replicate(dtype, fn):
        # fn(x, y): x a float32 P(sum), y a Replicate of `dtype`; the op takes y
        # Replicate -> Partial(sum) locally (no collective)
        def setup():
            x = dtensor(Partial())
            y = DTensor.from_local(
                (torch.rand(8, 8) * 10).to(dtype), mesh, [Replicate()], run_check=False
            )
            return lambda: fn(x, y)

        return setup

    def scalar_tensor(placement, dtype, fn=torch.mul):
        # fn(x, t), t a plain 0-d tensor (not a DTensor). x is 8 x 4, so that the
        # Python scalar rows (8 x 8) do not share its native cache entries, which
        # torch 2.15.0 keys alike (it would run one row's plan for the other).
        def setup():
            rows = 8 // WORLD_SIZE if isinstance(placement, Shard) else 8
            x = DTensor.from_local(torch.rand(rows, 4), mesh, [placement], run_check=False)
            t = torch.tensor(0.5 if dtype.is_floating_point else 1, dtype=dtype)
            return lambda: fn(x, t)

        return setup

    def zero_dim_only(placement, dtype, fn):
        # fn(x, mask, t), t a plain 0-d tensor in an argument that a Python
        # scalar never reaches (the op's Python binding sends a scalar to its
        # Scalar overload), so no scalar shares its native cache entry
        def setup():
            x = dtensor(placement)
            mask = DTensor.from_local(torch.rand(8, 8) > 0.5, mesh, [Replicate()], run_check=False)
            t = torch.tensor(0.5 if dtype.is_floating_point else 2, dtype=dtype)
            return lambda: fn(x, mask, t)

        return setup

    def int_op(placement, dtype, fn):
        # fn(x), x an integer DTensor (a float Python scalar promotes it to the
        # default dtype, a float64 0-d tensor to float64)
        def setup():
            rows = 8 // WORLD_SIZE if isinstance(placement, Shard) else 8
            x = DTensor.from_local(
                (torch.rand(rows, 8) * 10).to(dtype), mesh, [placement], run_check=False
            )
            return lambda: fn(x)

        return setup

    def add_new_scalar(placement):
        x, counter = dtensor(placement), iter(range(1 << 62))
        return lambda: x + (next(counter) * 0.5 + 0.25)

    def fill_new_scalar():
        x, counter = dtensor(Shard(0)), iter(range(1 << 62))
        return lambda: x.fill_(next(counter) * 0.5)

    def copy_into(placement):
        def setup():
            dst, src = dtensor(placement), dtensor(placement)
            return lambda: dst.copy_(src)

        return setup

    def addcmul_twice():
        out, x = dtensor(Replicate()), dtensor(Partial())
        return lambda: out.addcmul_(x, x, value=0.0)

    def addcmul_distinct():
        out, x, y = dtensor(Replicate()), dtensor(Partial()), dtensor(Partial())
        return lambda: out.addcmul_(x, y, value=0.0)

    def foreach_add_distinct(n):
        def setup():
            outs = [dtensor(Replicate()) for _ in range(n)]
            xs = [dtensor(Partial()) for _ in range(n)]
            return lambda: torch._foreach_add_(outs, xs, alpha=0.0)

        return setup

    def adam(param_placement, grad_placement):
        def setup():
            weight = torch.nn.Parameter(dtensor(param_placement))
            weight.grad = dtensor(grad_placement)
            return torch.optim.Adam([weight], lr=1e-3).step

        return setup

    def tp_mlp():
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)
        )
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        batch = torch.rand(4, 16)
        return lambda: model(batch).sum().backward()

    def compiled(fn, requires_grad=True):
        # requires_grad=False: an inference graph (no output requires grad)
        def setup():
            weight = dtensor(Shard(0))
            if requires_grad:
                weight = torch.nn.Parameter(weight)
            compiled_fn = torch.compile(fn, backend="inductor")
            return lambda: compiled_fn(weight)

        return setup

    S, R, P = Shard(0), Replicate(), Partial()
    f32, bf16, i32, i64 = torch.float32, torch.bfloat16, torch.int32, torch.int64
    f64 = torch.float64
    return [
        ("fill_(1.5) S(0), same scalar", op(S, lambda x: x.fill_(1.5))),
        ("fill_(v) S(0), new scalar each call", fill_new_scalar),
        ("zero_() S(0)", op(S, lambda x: x.zero_())),
        ("fill_(0.0) P(sum)", op(P, lambda x: x.fill_(0.0))),
        ("zero_() P(sum)", op(P, lambda x: x.zero_())),
        ("to(f32, copy) R", op(R, lambda x: x.to(f32, copy=True))),
        ("to(bf16) R", op(R, lambda x: x.to(bf16))),
        ("to(int32) R", op(R, lambda x: x.to(i32))),
        ("to(bf16) S(0)", op(S, lambda x: x.to(bf16))),
        ("to(f32, copy) P(sum)", op(P, lambda x: x.to(f32, copy=True))),
        ("to(bf16) P(sum)", op(P, lambda x: x.to(bf16))),
        ("to(int32) P(sum)", op(P, lambda x: x.to(i32))),
        ("copy_ R <- R", copy_into(R)),
        ("copy_ P(sum) <- P(sum)", copy_into(P)),
        ("view(-1) S(0)", op(S, lambda x: x.view(-1))),
        ("t() S(0)", op(S, lambda x: x.t())),
        ("detach() S(0)", op(S, lambda x: x.detach())),
        ("clone() S(0)", op(S, lambda x: x.clone())),
        ("view(-1) P(sum)", op(P, lambda x: x.view(-1))),
        ("t() P(sum)", op(P, lambda x: x.t())),
        ("detach() P(sum)", op(P, lambda x: x.detach())),
        ("clone() P(sum)", op(P, lambda x: x.clone())),
        ("clone() P(product)", op(Partial("product"), lambda x: x.clone())),
        ("x[1] P(sum)", op(P, lambda x: x[1])),
        ("x[:, 2:] P(sum)", op(P, lambda x: x[:, 2:])),
        ("x[1] P(product)", op(Partial("product"), lambda x: x[1])),
        ("cat([x, x]) P(sum)", op(P, lambda x: torch.cat([x, x]))),
        ("x * x, x = P(sum)", op(P, lambda x: x * x)),
        ("torch.add(x, x), x = P(sum)", op(P, lambda x: torch.add(x, x))),
        ("R.addcmul_(x, x), x = P(sum)", addcmul_twice),
        ("R.addcmul_(x, y), x, y = P(sum)", addcmul_distinct),
        ("_foreach_add_(64 R, 64 distinct P(sum))", foreach_add_distinct(64)),
        ("_foreach_add_(256 R, 256 distinct P(sum))", foreach_add_distinct(256)),
        ("P(sum) - R, float32 R", partial_and_replicate(f32, lambda x, y: x - y)),
        ("P(sum) - R, int64 R", partial_and_replicate(i64, lambda x, y: x - y)),
        ("rsub(P(sum), R), int64 R", partial_and_replicate(i64, torch.rsub)),
        ("torch.mm(x, x), x = S(0)", op(S, lambda x: torch.mm(x, x))),
        # A Python scalar in a Tensor argument (a wrapped number) and the 0-d
        # tensors whose native cache key it shared (int64 / float64)
        ("x * 0.5 S(0), Python scalar", op(S, lambda x: x * 0.5)),
        ("x + 1 S(0), Python scalar", op(S, lambda x: x + 1)),
        ("x + 1 P(sum), Python scalar", op(P, lambda x: x + 1)),
        # mul/div of a Partial(sum/avg) by a Python scalar: the value decides the
        # plan (inf or a zero divisor reduce first); a finite factor stays a native
        # cache hit (the x * 0.5 / x / 2 rows above and below are S(0))
        ("x * 0.5 P(sum), Python scalar", op(P, lambda x: x * 0.5)),
        ("x / 2 P(sum), Python scalar", op(P, lambda x: x / 2)),
        ("x / 2 S(0), Python scalar", op(S, lambda x: x / 2)),
        ("x * 0.5 P(avg), Python scalar", op(Partial("avg"), lambda x: x * 0.5)),
        ("x * 2 P(sum), Python int", op(P, lambda x: x * 2)),
        ("x.mul_(0.5) P(sum), Python scalar", op(P, lambda x: x.mul_(0.5))),
        (
            "_foreach_mul(4 x P(sum), 0.5)",
            op(P, lambda x: torch._foreach_mul([x, x, x, x], 0.5)),
        ),
        ("x + 1 P(avg), Python scalar", op(Partial("avg"), lambda x: x + 1)),
        ("x + 1.0 P(max), Python scalar", op(Partial("max"), lambda x: x + 1.0)),
        ("x + s P(sum), new scalar each call", lambda: add_new_scalar(P)),
        ("int64 x * 2.5 S(0), Python scalar", int_op(S, i64, lambda x: x * 2.5)),
        ("int32 x * 0.5 R, Python scalar", int_op(R, i32, lambda x: x * 0.5)),
        ("x * float64 0-d tensor S(0)", scalar_tensor(S, f64)),
        ("x * float32 0-d tensor S(0)", scalar_tensor(S, f32)),
        ("x + int64 0-d tensor P(sum)", scalar_tensor(P, i64, torch.add)),
        # A float64 / int64 0-d tensor where no Python scalar can share its key
        (
            "_foreach_mul(4 x S(0), float64 0-d tensor)",
            zero_dim_only(S, f64, lambda x, m, t: torch._foreach_mul([x, x, x, x], t)),
        ),
        (
            "masked_fill(mask, float64 0-d tensor) R",
            zero_dim_only(R, f64, lambda x, m, t: x.masked_fill(m, t)),
        ),
        (
            "clamp(x, min=float64 0-d tensor) R",
            zero_dim_only(R, f64, lambda x, m, t: torch.clamp(x, min=t)),
        ),
        (
            "where(mask, x, float64 0-d tensor) R",
            zero_dim_only(R, f64, lambda x, m, t: torch.where(m, x, t)),
        ),
        ("x ** int64 0-d tensor S(0)", zero_dim_only(S, i64, lambda x, m, t: x**t)),
        ("sum(1, out=) S(0)", out_variant(S, lambda x, o: torch.sum(x, 1, out=o), (8,))),
        ("sum(1, out=) P(sum)", out_variant(P, lambda x, o: torch.sum(x, 1, out=o), (8,))),
        ("cumsum(1, out=) S(0)", out_variant(S, lambda x, o: torch.cumsum(x, 1, out=o), (8, 8))),
        ("cumsum_(1) S(0)", op(S, lambda x: x.cumsum_(1))),
        ("new_empty P(sum)", op(P, lambda x: x.new_empty((8, 8)))),
        ("new_empty_strided P(sum)", op(P, lambda x: x.new_empty_strided((8, 8), (8, 1)))),
        ("empty_like P(sum)", op(P, lambda x: torch.empty_like(x))),
        ("Adam.step R param, R grad", adam(R, R)),
        ("Adam.step R param, P(sum) grad", adam(R, P)),
        ("Adam.step S(0) param, P(sum) grad", adam(S, P)),
        ("TP MLP fwd+bwd (Colwise+Rowwise)", tp_mlp),
        ("compiled w.to_local(), w = S(0) param", compiled(lambda w: w.to_local())),
        ("compiled w.to_local().t()", compiled(lambda w: w.to_local().t())),
        ("compiled w.to_local().t(), inference graph", compiled(lambda w: w.to_local().t(), False)),
        ("compiled w.to_local() * 2 (no alias)", compiled(lambda w: w.to_local() * 2)),
        ("compiled (w * 2).to_local() (no alias)", compiled(lambda w: (w * 2).to_local())),
        ("compiled w * 2 (DTensor output)", compiled(lambda w: w * 2)),
    ]


def cache_sizes() -> dict[str, int]:
    """Entries in the sharding-propagation caches of this process. The C++ fast-path cache
    exposes only (hits, misses); every miss that computes a key inserts one entry."""
    from torch.distributed.tensor import debug
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    return {
        "native_fast_path": debug._get_fast_path_sharding_prop_cache_stats()[1],
        "python_sharding": debug._get_python_sharding_prop_cache_info().currsize,
        "python_tensor_meta": ShardingPropagator._propagate_tensor_meta_cached.cache_info().currsize,
    }


def ring_bytes(op_name: str, input_bytes: int) -> float:
    """Bytes one rank sends for a collective with a ring algorithm (NCCL's default)."""
    n = WORLD_SIZE
    if "all_reduce" in op_name:
        return 2 * (n - 1) / n * input_bytes
    if "reduce_scatter" in op_name or "all_to_all" in op_name:
        return (n - 1) / n * input_bytes
    if "all_gather" in op_name:
        return (n - 1) * input_bytes
    return input_bytes


def collectives_of(run) -> tuple[dict[str, int], int]:
    """Collectives one call issues, by name, and the bytes this rank would send for them."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops
    from torch.utils._pytree import tree_leaves

    class CommBytesMode(CommDebugMode):
        sent = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            packet = getattr(func, "_overloadpacket", None)
            if out is not NotImplemented and (
                packet in self.comm_registry or packet in c10d_collective_ops
            ):
                leaves = tree_leaves((args, kwargs))
                input_bytes = sum(t.nbytes for t in leaves if hasattr(t, "nbytes"))
                self.sent += ring_bytes(str(packet), input_bytes)
            return out

    with CommBytesMode() as comm:
        run()
    counts = {str(op).rsplit(".", 1)[-1]: n for op, n in comm.get_comm_counts().items()}
    return counts, round(comm.sent)


def prepare(run, rep_ms: float) -> dict:
    """Warm the caches, count collectives, and pick how many calls one repetition makes."""
    run()
    run()
    collectives, nbytes = collectives_of(run)
    calls, start = 0, time.process_time()
    while calls < 5 or time.process_time() - start < 0.02:
        run()
        calls += 1
    per_call = (time.process_time() - start) / calls
    return {
        "collectives": collectives,
        "bytes": nbytes,
        "calls_per_rep": max(1, min(10_000, round(rep_ms / 1e3 / per_call))),
    }


def time_rep(run, calls: int) -> dict:
    before = cache_sizes()
    gc.disable()  # a collection inside one variant's batch would be noise, not cost
    try:
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            run()
        cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
    finally:
        gc.enable()
    growth = sum(cache_sizes().values()) - sum(before.values())
    return {"us": 1e6 * cpu / calls, "wall_us": 1e6 * wall / calls, "cache_growth": growth}


def reply_channel():
    """The worker's replies go to the original stdout; anything torch prints goes to
    stderr, not into the replies. Call it before importing torch."""
    import os

    reply_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(message: dict) -> None:
        reply_stream.write(json.dumps(message) + "\n")
        reply_stream.flush()

    return reply


def serve(reply, setups: dict, handlers: dict) -> None:
    """Answer one JSON request per stdin line with one JSON line. `handlers` maps a
    request's "cmd" to a function of (runs, request) giving the reply, except "prepare",
    which is given the row's setup and the request and returns (run, reply); the run is
    kept under the row's name."""
    runs: dict[str, object] = {}
    reply({"rows": list(setups)})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["cmd"] == "prepare":
                run, message = handlers["prepare"](setups[request["row"]], request)
                runs[request["row"]] = run
                reply(message)
            else:
                reply(handlers[request["cmd"]](runs, request))
        except Exception as error:  # a row the variant refuses: report it, keep going
            first_line = (str(error).strip().splitlines() or [""])[0]
            reply({"error": f"{type(error).__name__}: {first_line[:100]}"})


def mesh_cases(mesh):
    """(name, setup) pairs for a mesh of 2 or more dims: operands moved from Replicate to
    Partial(sum) on every mesh dim (P^k: Partial(sum) on each of the k mesh dims), or pending
    on mesh dim 0 and split on the others, each with a float32 operand as control."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate

    k = mesh.ndim
    R, P = [Replicate()] * k, [Partial()] * k
    f32, i32, i64 = torch.float32, torch.int32, torch.int64

    def dtensor(placements, dtype=f32):
        local = (torch.rand(8, 8) * 10).to(dtype)
        return DTensor.from_local(local, mesh, placements, run_check=False)

    def sub(dtype):
        def setup():
            x, y = dtensor(P), dtensor(R, dtype)
            return lambda: x - y

        return setup

    def mul_out(placements, out_placements, dtype):
        def setup():
            c, f, o = dtensor(placements, dtype), dtensor(R), dtensor(out_placements)
            return lambda: torch.mul(c, f, out=o)

        return setup

    pending, split = [Partial()] + R[1:], [Replicate()] + P[1:]
    return [
        (f"P(sum)^{k} - R, float32 R", sub(f32)),
        (f"P(sum)^{k} - R, int64 R", sub(i64)),
        (f"P(sum)^{k} - R, int32 R", sub(i32)),
        (f"mul(R, R, out=P^{k}), float32 R", mul_out(R, P, f32)),
        (f"mul(R, R, out=P^{k}), int32 R", mul_out(R, P, i32)),
        ("mul([P, R..], R, out=[R, P..]), float32", mul_out(pending, split, f32)),
        ("mul([P, R..], R, out=[R, P..]), int32", mul_out(pending, split, i32)),
    ]


def worker(rep_ms: float, rank: int, shape: tuple[int, ...] = (WORLD_SIZE,)) -> None:
    reply = reply_channel()

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    global WORLD_SIZE
    WORLD_SIZE = math.prod(shape)
    torch.set_num_threads(1)  # two workers share this machine's cores
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", shape)

    def prepare_row(setup, request):
        run = setup()
        return run, prepare(run, rep_ms)

    serve(
        reply,
        dict(cases(mesh) if len(shape) == 1 else mesh_cases(mesh)),
        {
            "prepare": prepare_row,
            "rep": lambda runs, request: time_rep(runs[request["row"]], request["calls"]),
            "caches": lambda runs, request: cache_sizes(),
        },
    )


# --------------------------------------------------------------------------------------
# Driver side.


class Worker:
    """One variant's worker process, `script --worker ARGS...`: one JSON request and one
    JSON reply per line."""

    def __init__(self, label: str, env: dict[str, str], script: str, args: list[str],
                 log_dir: Path):  # fmt: skip
        self.label = label
        self.log = log_dir / f"{label}.stderr"
        self.proc = subprocess.Popen(
            [sys.executable, script, "--worker", *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )
        self.rows = self.receive()["rows"]

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            sys.stderr.write(self.log.read_text())
            raise SystemExit(f"the {self.label} worker exited (stderr above)")
        return json.loads(line)

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.receive()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


@contextlib.contextmanager
def stock_and_overlay(script: str, args: list[str]):
    """Start a worker of `script` on stock torch and one with the overlay's active patches
    (materialized in a scratch tree); yields (plan, overlay_files, workers)."""
    sys.path.insert(0, str(REPO))
    from tools.active import environment, materialize, tree_digest

    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        plan = materialize(REPO, tree)
        overlay_files = tree_digest(tree)  # so verify can tell a report made for other code
        workers = {
            "stock": Worker("stock", environment(None), script, args, Path(scratch)),
            "overlay": Worker("overlay", environment(tree), script, args, Path(scratch)),
        }
        try:
            yield plan, overlay_files, workers
        finally:
            for w in workers.values():
                w.close()


def selected_rows(workers: dict, only: list[str] | None) -> list[str]:
    names = [n for n in workers["stock"].rows if not only or any(t in n for t in only)]
    if not names:
        raise SystemExit(f"no row matches {only}")
    return names


def interleaved(workers: dict, name: str, reps: int, rep_request) -> tuple[dict, dict]:
    """Prepare row `name` in both workers, then run `reps` repetitions interleaved (stock
    rep i, overlay rep i, ...; each variant first every other repetition) so that machine
    noise hits both alike. rep_request(prepare's reply) gives a repetition's request; a
    repetition that errors ends the row. Returns (prepared, reps), each per variant."""
    prepared = {label: w.ask(cmd="prepare", row=name) for label, w in workers.items()}
    reps_by_label: dict[str, list] = {label: [] for label in workers}
    if not any("error" in p for p in prepared.values()):
        for i in range(reps):
            for label, w in list(workers.items())[:: 1 if i % 2 == 0 else -1]:
                request = rep_request(prepared[label])
                reps_by_label[label].append(w.ask(cmd="rep", row=name, **request))
            if any("error" in r[-1] for r in reps_by_label.values()):
                break
    return prepared, reps_by_label


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def summarize(name: str, prepared: dict, reps: dict) -> dict:
    row: dict = {"name": name}
    for label in ("stock", "overlay"):
        if "error" in prepared[label]:
            row[label] = {"error": prepared[label]["error"]}
            continue
        times = [r["us"] for r in reps[label]]
        calls = prepared[label]["calls_per_rep"] * len(times)
        row[label] = {
            "median_us": statistics.median(times),
            "median_wall_us": statistics.median(r["wall_us"] for r in reps[label]),
            "iqr_us": quartiles(times),
            "min_us": min(times),
            "max_us": max(times),
            "collectives": prepared[label]["collectives"],
            "bytes": prepared[label]["bytes"],
            "calls": calls,
            "cache_growth_per_call": sum(r["cache_growth"] for r in reps[label]) / calls,
        }
    if "error" in row["stock"] or "error" in row["overlay"]:
        row["ratio"] = None
        row["flags"] = ["error"]
        return row
    paired = [o["us"] / s["us"] for s, o in zip(reps["stock"], reps["overlay"], strict=True)]
    row["ratio"] = statistics.median(paired)
    row["ratio_iqr"] = quartiles(paired)
    row["flags"] = []
    if row["ratio"] > RATIO_LIMIT:
        changed = row["stock"]["collectives"] != row["overlay"]["collectives"]
        row["flags"].append("slower, collectives changed" if changed else "slower")
    if row["overlay"]["cache_growth_per_call"] > 0:
        row["flags"].append("cache grows (overlay)")
    if row["stock"]["cache_growth_per_call"] > 0:
        row["flags"].append("cache grows (stock)")
    return row


def collectives_text(result: dict) -> str:
    if "error" in result:
        return "error"
    total = sum(result["collectives"].values())
    return f"{total} ({result['bytes']} B)" if total else "0"


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'row':38} {'stock us':>9} {'IQR':>13} {'overlay us':>10} {'IQR':>13} "
        f"{'ratio':>7} {'ratio IQR':>11} {'coll. stock':>11} {'coll. overlay':>13}  flags"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        s, o = row["stock"], row["overlay"]
        medians, spreads = [], []
        for result in (s, o):
            if "error" in result:
                medians.append("error")
                spreads.append("")
            else:
                q1, q3 = result["iqr_us"]
                medians.append(f"{result['median_us']:.1f}")
                spreads.append(f"{q1:.1f}-{q3:.1f}")
        if row["ratio"] is None:
            ratio = f"{'-':>7} {'':>11}"
        else:
            r1, r3 = row["ratio_iqr"]
            ratio = f"{row['ratio']:>6.2f}x {f'{r1:.2f}-{r3:.2f}':>11}"
        print(
            f"{row['name']:38} {medians[0]:>9} {spreads[0]:>13} {medians[1]:>10} {spreads[1]:>13} {ratio} "
            f"{collectives_text(s):>11} {collectives_text(o):>13}  {', '.join(row['flags'])}"
        )
    for row in rows:
        for label in ("stock", "overlay"):
            if "error" in row[label]:
                print(f"  {row['name']} ({label}): {row[label]['error']}")
            elif row[label]["cache_growth_per_call"] > 0:
                growth = row[label]["cache_growth_per_call"]
                print(f"  {row['name']} ({label}): caches grow by {growth:.2f} entries per call")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=51, help="repetitions per row and variant")
    parser.add_argument("--rep-ms", type=float, default=5.0, help="ms per repetition")
    parser.add_argument("--quick", action="store_true", help="3 short repetitions (smoke test)")
    parser.add_argument("--only", action="append", help="rows whose name contains TEXT")
    parser.add_argument("--rank", type=int, default=0, choices=range(WORLD_SIZE),
                        help="the rank the workers play (default 0)")  # fmt: skip
    parser.add_argument("--mesh", default=str(WORLD_SIZE),
                        help="mesh shape, e.g. 2x2: time mesh_cases on it instead")  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "dtensor_dispatch.json")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.mesh.split("x"))
    if args.quick:
        args.reps, args.rep_ms = 3, 2.0
    if args.worker:
        worker(args.rep_ms, args.rank, shape)
        return

    worker_args = ["--rep-ms", str(args.rep_ms), "--rank", str(args.rank), "--mesh", args.mesh]
    with stock_and_overlay(__file__, worker_args) as (
        plan, overlay_files, workers,
    ):  # fmt: skip
        rows = []
        for name in selected_rows(workers, args.only):
            prepared, reps = interleaved(
                workers, name, args.reps, lambda p: {"calls": p["calls_per_rep"]}
            )
            rows.append(summarize(name, prepared, reps))
        caches = {label: w.ask(cmd="caches") for label, w in workers.items()}

    print(f"overlay: {plan.summary()}; rank {args.rank} of {math.prod(shape)} (mesh {args.mesh}) on the fake process group, "
          f"median of {args.reps} interleaved repetitions of ~{args.rep_ms:g} ms, CPU us per call")  # fmt: skip
    print_table(rows)
    print("sharding-propagation cache entries after the run:")
    for label, sizes in caches.items():
        print(f"  {label:8} " + ", ".join(f"{k} {v}" for k, v in sizes.items()))

    timed = [r for r in rows if r["ratio"] is not None]
    worst = max(timed, key=lambda r: r["ratio"], default=None)
    flagged = [r["name"] for r in rows if r["flags"]]
    if worst:
        print(f"worst ratio: {worst['ratio']:.2f}x ({worst['name']}); "
              f"{len(flagged)} row(s) flagged (> {RATIO_LIMIT}x, cache growth or error)")  # fmt: skip
    report = {
        "overlay_files": overlay_files,
        # verify: full run, rank 0, 1-D mesh of WORLD_SIZE
        "partial": bool(args.only or args.quick or args.rank or shape != (WORLD_SIZE,)),
        "overlay": plan.summary(),
        "world_size": math.prod(shape),
        "mesh": list(shape),
        "rank": args.rank,
        "reps": args.reps,
        "rep_ms": args.rep_ms,
        "ratio_limit": RATIO_LIMIT,
        "worst": {"row": worst["name"], "ratio": worst["ratio"]} if worst else None,
        "flagged": flagged,
        "caches": caches,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
