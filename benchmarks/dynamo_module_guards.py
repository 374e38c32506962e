"""Dynamo guards on a deep unspecialized nn.Module: stock torch vs the overlay, in one run.

    python benchmarks/dynamo_module_guards.py [--blocks 32] [--backend eager] [--reps N]
        [--compiles N] [--quick] [--stand-in-merged-leaf] [--overlay NAME=PATH ...]
        [--out FILE]

Compiles a transformer-like model of --blocks blocks (per block: two RMSNorm, an attention
module with four nn.Linear, a feed-forward module with three nn.Linear; user modules and
builtin modules are both unspecialized, as under default torch.compile settings) in one
long-lived worker process per variant: stock torch, and the overlay's active patches (the
project's torch_overlay by default; --overlay NAME=PATH adds or replaces variants, PATH
being an overlay git repository such as a clone with a new commit). Requests are
interleaved between the workers (variant order alternates every repetition) so that machine
noise hits all variants alike. Each worker reports:

* guards of the compiled frame by leaf-guard type, read from the guard manager tree
  (``torch._dynamo.eval_frame._debug_get_cache_entry_list``), with the
  ``not ___dict_contains(name, module.__dict__)`` checks (NOT_PRESENT_IN_GENERIC_DICT)
  counted apart: the leaves that hold them (one per name as DICT_CONTAINS leaves, or one
  per module ``__dict__`` where the guard manager merges them into a
  DICT_NOT_CONTAINS_KEYS leaf), the names they check, and how many distinct
  (module object, name) pairs these cover;
* guard evaluation: the guard manager's ``check`` on the frame's own locals, repeated
  (CPU us per check, median over repetitions);
* compile time: the first call after ``torch._dynamo.reset()`` (tracing, guard building,
  backend), median over --compiles fresh compiles;
* steady-state call time of the compiled model on a tiny input (so guard evaluation and
  Dynamo's call overhead are a visible share of it), CPU us per call;
* frames compiled after a warm-up of several calls (must stay 1) and whether the compiled
  output equals eager.

--stand-in-merged-leaf adds a variant "<overlay>+stand-in" of each overlay whose worker gives
the guard manager a stand-in ``add_dict_not_contains_key_guard`` (what the source-only
patch "[dynamo] One leaf for the absent-key checks of a dict: DICT_NOT_CONTAINS_KEYS" binds
in C++), made of one LAMBDA leaf per module ``__dict__`` (``set.isdisjoint``, a Python
callable): its guard counts are what a build with the C++ leaf installs; its times are the
stand-in's, not the C++ leaf's.

Prints one table with the overlay/stock ratios (median of per-repetition ratios where the
measurement is repeated) and writes the numbers to reports/dynamo_module_guards.json.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIM = 16
STAND_IN_ENV = "DYNAMO_MODULE_GUARDS_STAND_IN"


# --------------------------------------------------------------------------------------
# Worker side: runs in each variant's process.


def build_model(blocks: int):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(DIM, DIM)
            self.wk = nn.Linear(DIM, DIM)
            self.wv = nn.Linear(DIM, DIM)
            self.wo = nn.Linear(DIM, DIM)

        def forward(self, x):
            scores = self.wq(x) @ self.wk(x).transpose(-2, -1)
            return self.wo(torch.softmax(scores, dim=-1) @ self.wv(x))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(DIM, 2 * DIM)
            self.w2 = nn.Linear(2 * DIM, DIM)
            self.w3 = nn.Linear(DIM, 2 * DIM)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = nn.RMSNorm(DIM)
            self.attention = Attention()
            self.ffn_norm = nn.RMSNorm(DIM)
            self.feed_forward = FeedForward()

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Block() for _ in range(blocks))
            self.norm = nn.RMSNorm(DIM)
            self.output = nn.Linear(DIM, DIM)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.output(self.norm(x))

    torch.manual_seed(0)
    return Model()


class Bench:
    def __init__(self, blocks: int, backend: str):
        import torch

        torch.set_num_threads(1)  # the workers share this machine's cores
        self.torch = torch
        self.blocks = blocks
        self.backend = backend
        self.x = torch.randn(2, 4, DIM)
        self.model = None
        self.compiled = None

    def compile(self) -> dict:
        """A fresh model, compiled from scratch; time the first call."""
        torch = self.torch
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        self.model = build_model(self.blocks)
        self.counter = CompileCounterWithBackend(self.backend)
        self.compiled = torch.compile(self.model, backend=self.counter)
        gc.collect()
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        out = self.compiled(self.x)
        cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
        self.same_as_eager = bool(torch.allclose(out, self.model(self.x)))
        return {"compile_s": cpu, "compile_wall_s": wall}

    def guard_manager(self):
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(type(self.model).forward.__code__)
        if len(entries) != 1:
            raise RuntimeError(f"expected one cache entry, found {len(entries)}")
        return entries[0].guard_manager

    def guard_counts(self) -> dict:
        """Leaf guards by type, over the whole guard manager tree."""
        gm = self.guard_manager()
        counts: collections.Counter = collections.Counter()
        not_present: list[tuple[str, str]] = []  # (dict source, key)
        absent_key_leaves = 0

        def walk(mgr):
            nonlocal absent_key_leaves
            for leaf in mgr.get_leaf_guards():
                kind = type(leaf).__name__
                counts[kind] += 1
                keys = [
                    part.split("(", 1)[1].split(",", 1)[0].strip("'\"")
                    for part in leaf.verbose_code_parts()
                    if part.startswith("not ___dict_contains(")
                ]
                if keys:
                    absent_key_leaves += 1
                    not_present.extend((mgr.get_source(), key) for key in keys)
            children = list(mgr.get_child_managers())
            if hasattr(mgr, "get_key_value_managers"):
                for key_mgr, value_mgr in mgr.get_key_value_managers().values():
                    children += [m for m in (key_mgr, value_mgr) if m is not None]
            for child in children:
                walk(child)

        walk(gm.root)
        for leaf in gm.root.get_epilogue_lambda_guards():
            counts[type(leaf).__name__] += 1
        total = sum(v for k, v in counts.items() if not k.startswith(" "))
        # distinct (module object, name) pairs the NOT_PRESENT guards cover: a module
        # reached through two sources would be guarded twice
        frame = {"L": {"self": self.model, "x": self.x}}
        pairs = set()
        for source, key in not_present:
            try:
                pairs.add((id(eval(source, frame)), key))  # noqa: S307 - our own guard sources
            except Exception:
                pairs.add((source, key))
        per_name = collections.Counter(key for _, key in not_present)
        return {
            "by_type": dict(counts),
            "total": total,
            "absent_key_leaves": absent_key_leaves,
            "absent_key_names": len(not_present),
            "not_present_pairs": len(pairs),
            "not_present_names": dict(per_name.most_common()),
        }

    def warm(self) -> dict:
        for _ in range(5):
            self.compiled(self.x)
        return {"frames": self.counter.frame_count, "same_as_eager": self.same_as_eager}

    def prepare(self, what: str, rep_ms: float) -> dict:
        run = self.runner(what)
        run()
        calls, start = 0, time.process_time()
        while calls < 5 or time.process_time() - start < 0.02:
            run()
            calls += 1
        per_call = (time.process_time() - start) / calls
        return {"calls_per_rep": max(1, min(100_000, round(rep_ms / 1e3 / per_call)))}

    def runner(self, what: str):
        if what == "guard_check":
            check = self.guard_manager().check
            frame_locals = {"self": self.model, "x": self.x}
            if not check(frame_locals):
                raise RuntimeError("the guards fail on the frame's own locals")
            return lambda: check(frame_locals)
        if what == "call":
            compiled, x = self.compiled, self.x
            return lambda: compiled(x)
        raise ValueError(what)

    def rep(self, what: str, calls: int) -> dict:
        run = self.runner(what)
        gc.disable()
        try:
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                run()
            cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
        finally:
            gc.enable()
        return {"us": 1e6 * cpu / calls, "wall_us": 1e6 * wall / calls}


def install_stand_in() -> None:
    from torch._C._dynamo.guards import GuardManager

    if hasattr(GuardManager, "add_dict_not_contains_key_guard"):
        raise SystemExit("this torch has add_dict_not_contains_key_guard: no stand-in needed")
    # The same stand-in the guard-count test uses (the binding's behaviour with a LAMBDA
    # leaf), so that the benchmark times what the test counts.
    test_dir = Path(__file__).resolve().parents[1] / "test" / "dynamo"
    path = test_dir / "test_module_dict_guard_count.py"
    # The test imports its sibling test_modules_dict_shadow.py by name, as test/dynamo
    # files do when run from their directory.
    if str(test_dir) not in sys.path:
        sys.path.insert(0, str(test_dir))
    spec = importlib.util.spec_from_file_location("module_dict_guard_count", path)
    test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test)
    GuardManager.add_dict_not_contains_key_guard = test._stand_in_add_dict_not_contains_key_guard


def worker(blocks: int, backend: str) -> None:
    """Answer one JSON request per stdin line with one JSON line on the original stdout."""
    import os

    reply_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything torch prints goes to stderr, not into the replies

    if os.environ.get(STAND_IN_ENV) == "1":
        install_stand_in()
    bench = Bench(blocks, backend)

    def reply(message: dict) -> None:
        reply_stream.write(json.dumps(message) + "\n")
        reply_stream.flush()

    import torch

    reply({"torch": torch.__version__})
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request.pop("cmd")
        try:
            if cmd == "compile":
                reply(bench.compile())
            elif cmd == "counts":
                reply(bench.guard_counts())
            elif cmd == "warm":
                reply(bench.warm())
            elif cmd == "prepare":
                reply(bench.prepare(**request))
            elif cmd == "rep":
                reply(bench.rep(**request))
        except Exception as error:
            first_line = (str(error).strip().splitlines() or [""])[0]
            reply({"error": f"{type(error).__name__}: {first_line[:200]}"})


# --------------------------------------------------------------------------------------
# Driver side.


class Worker:
    def __init__(self, label, env, args, log_dir: Path):
        self.label = label
        self.log = log_dir / f"{label}.stderr"
        command = [
            sys.executable, __file__, "--worker",
            "--blocks", str(args.blocks), "--backend", args.backend,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )
        self.hello = self.receive()

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            sys.stderr.write(self.log.read_text())
            raise SystemExit(f"the {self.label} worker exited (stderr above)")
        return json.loads(line)

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self.receive()
        if "error" in reply:
            raise SystemExit(f"{self.label}: {request}: {reply['error']}")
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def interleaved(workers: dict, reps: int, **request) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {label: [] for label in workers}
    for i in range(reps):
        for label, w in list(workers.items())[:: 1 if i % 2 == 0 else -1]:
            out[label].append(w.ask(**request))
    return out


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def timing(results: dict[str, list[dict]], key: str, base: str) -> dict:
    row = {}
    for label, reps in results.items():
        values = [r[key] for r in reps]
        row[label] = {
            "median": statistics.median(values),
            "iqr": quartiles(values),
            "min": min(values),
        }
        if label != base:
            ratios = [o[key] / s[key] for s, o in zip(results[base], reps, strict=True)]
            row[label]["ratio"] = statistics.median(ratios)
            row[label]["ratio_iqr"] = quartiles(ratios)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--backend", default="eager", choices=["eager", "aot_eager"])
    parser.add_argument("--reps", type=int, default=31, help="timed repetitions per variant")
    parser.add_argument("--rep-ms", type=float, default=20.0, help="ms per repetition")
    parser.add_argument("--compiles", type=int, default=5, help="fresh compiles per variant")
    parser.add_argument("--quick", action="store_true", help="smoke test: few short reps")
    parser.add_argument(
        "--stand-in-merged-leaf",
        action="store_true",
        help="add a variant <overlay>+stand-in per overlay, with a Python stand-in for the "
        "C++ add_dict_not_contains_key_guard binding (counts as with the C++ leaf; times "
        "are the stand-in's)",
    )
    parser.add_argument(
        "--overlay",
        action="append",
        metavar="NAME=PATH",
        help="an overlay git repository to measure as variant NAME (repeatable; "
        "default: overlay=<repo>/torch_overlay)",
    )
    parser.add_argument(
        "--repo", type=Path, default=REPO, help="project checkout (tools/, patches/)"
    )
    parser.add_argument(
        "--out", type=Path, help="default: <repo>/reports/dynamo_module_guards.json"
    )
    args = parser.parse_args()
    args.out = args.out or args.repo / "reports" / "dynamo_module_guards.json"
    if args.quick:
        args.reps, args.rep_ms, args.compiles = 3, 5.0, 1
    if args.worker:
        worker(args.blocks, args.backend)
        return

    sys.path.insert(0, str(args.repo))
    from tools.active import environment, materialize, tree_digest

    overlays = {}
    for spec in args.overlay or [f"overlay={args.repo / 'torch_overlay'}"]:
        name, _, path = spec.partition("=")
        if not path or name == "stock":
            raise SystemExit(f"--overlay wants NAME=PATH with NAME != stock, got {spec!r}")
        overlays[name] = Path(path).resolve()

    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        envs, plans, digests = {"stock": environment(None)}, {}, {}
        for name, path in overlays.items():
            tree = Path(scratch) / name / "tree"
            plans[name] = materialize(args.repo, tree, overlay=path)
            digests[name] = tree_digest(tree)
            envs[name] = environment(tree)
            if args.stand_in_merged_leaf:
                envs[f"{name}+stand-in"] = {**envs[name], STAND_IN_ENV: "1"}
        workers = {label: Worker(label, env, args, Path(scratch)) for label, env in envs.items()}

        compiles = interleaved(workers, args.compiles, cmd="compile")
        counts = {label: w.ask(cmd="counts") for label, w in workers.items()}
        warm = {label: w.ask(cmd="warm") for label, w in workers.items()}
        timed = {}
        for what in ("guard_check", "call"):
            prepared = {
                label: w.ask(cmd="prepare", what=what, rep_ms=args.rep_ms)
                for label, w in workers.items()
            }
            results: dict[str, list[dict]] = {label: [] for label in workers}
            for i in range(args.reps):
                for label, w in list(workers.items())[:: 1 if i % 2 == 0 else -1]:
                    calls = prepared[label]["calls_per_rep"]
                    results[label].append(w.ask(cmd="rep", what=what, calls=calls))
            timed[what] = timing(results, "us", "stock")
        for w in workers.values():
            w.close()

    labels = list(workers)
    compile_row = timing(compiles, "compile_s", "stock")
    print(
        f"{args.blocks} blocks, backend={args.backend}, torch {workers['stock'].hello['torch']}; "
        + "; ".join(f"{n}: {p.summary()}" for n, p in plans.items())
    )
    print(
        f"timings: CPU time, median of {args.reps} interleaved repetitions of ~{args.rep_ms:g} ms "
        f"(compile: median of {args.compiles} fresh compiles); ratio = variant / stock"
    )
    kinds = sorted({k for c in counts.values() for k in c["by_type"]})
    width = max(12, 2 + max(len(label) for label in labels))
    rwidth = max(16, 2 + max(len(label + "/stock") for label in labels))
    header = f"{'':42}" + "".join(f"{label:>{width}}" for label in labels)
    header += "".join(f"{label + '/stock':>{rwidth}}" for label in labels[1:])
    print(header)
    print("-" * len(header))

    def line(name, values, ratios, fmt):
        text = f"{name:42}" + "".join(f"{fmt(v):>{width}}" for v in values)
        text += "".join(f"{r:>{rwidth}}" for r in ratios)
        print(text)

    def count_ratio(a, b):
        return f"{b / a:.2f}x" if a else ("-" if not b else "new")

    print("guards (leaf guards in the guard manager tree)")
    sub_kinds = [k for k in kinds if k.startswith(" ")]
    rest = [k for k in kinds if not k.startswith(" ") and k != "DICT_CONTAINS"]
    for kind in ["total", "DICT_CONTAINS", *sub_kinds, *rest]:
        if kind == "total":
            values = [counts[label]["total"] for label in labels]
        else:
            values = [counts[label]["by_type"].get(kind, 0) for label in labels]
        if (
            kind not in ("total", "DICT_CONTAINS")
            and not kind.startswith(" ")
            and len(set(values)) == 1
        ):
            continue  # unchanged kinds: in the JSON report
        line(f"  {kind.strip()}", values, [count_ratio(values[0], v) for v in values[1:]], str)
    for key, name in (
        ("absent_key_leaves", "  leaves holding NOT_PRESENT checks"),
        ("absent_key_names", "  names they check"),
        ("not_present_pairs", "  distinct (module, name) of NOT_PRESENT"),
    ):
        values = [counts[label][key] for label in labels]
        line(name, values, [count_ratio(values[0], v) for v in values[1:]], str)
    unchanged = [
        k for k in kinds
        if not k.startswith(" ") and k != "DICT_CONTAINS"
        and len({counts[label]["by_type"].get(k, 0) for label in labels}) == 1
    ]  # fmt: skip
    stock_counts = counts["stock"]["by_type"]
    print("  (unchanged: " + ", ".join(f"{k} {stock_counts[k]}" for k in unchanged) + ")")

    def timing_line(name, row, scale, unit):
        values = [row[label]["median"] * scale for label in labels]
        ratios = [f"{row[label]['ratio']:.3f}x" for label in labels[1:]]
        text = f"{name:42}" + "".join(f"{v:>{width}.1f}" for v in values)
        text += "".join(f"{r:>{rwidth}}" for r in ratios)
        print(text + f"   ({unit})")

    print("time")
    timing_line("  guard check per call", timed["guard_check"], 1, "us")
    timing_line("  compiled call, steady state", timed["call"], 1, "us")
    timing_line("  compile (first call after reset)", compile_row, 1e3, "ms")
    for label in labels[1:]:
        extra = counts[label]["total"] - counts["stock"]["total"]
        check = timed["guard_check"]
        dt = check[label]["median"] - check["stock"]["median"]
        dt_min = check[label]["min"] - check["stock"]["min"]
        if extra:
            print(
                f"  {label}: {extra:+d} guards: guard check {dt:+.2f} us (median, "
                f"{1e3 * dt / extra:+.1f} ns per added guard), {dt_min:+.2f} us (fastest "
                f"repetitions, {1e3 * dt_min / extra:+.1f} ns per added guard)"
            )
    print("sanity: " + "; ".join(
        f"{label}: {warm[label]['frames']} frame(s) after 6 calls, "
        f"{'same as eager' if warm[label]['same_as_eager'] else 'DIFFERS FROM EAGER'}"
        for label in labels
    ))  # fmt: skip

    report = {
        "partial": bool(args.quick),
        "blocks": args.blocks,
        "backend": args.backend,
        "reps": args.reps,
        "rep_ms": args.rep_ms,
        "compiles": args.compiles,
        "variants": {
            name: {"path": str(path), "summary": plans[name].summary(), "files": digests[name]}
            for name, path in overlays.items()
        },
        "guards": counts,
        "sanity": warm,
        "guard_check_us": timed["guard_check"],
        "call_us": timed["call"],
        "compile_s": compile_row,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
