"""Compile time of DTensor models: stock torch vs the overlay, measured in one run.

    python benchmarks/dtensor_compile_time.py [--reps N] [--backend B ...] [--only TEXT]
                                              [--without TEXT ...] [--no-profile] [--out FILE]

Models, on a 2-D (dp=2, tp=2) mesh, rank 0 of 4 on the fake process group:
- "block": one Llama-style transformer block (RMSNorm, attention with sdpa, SwiGLU MLP),
  tensor parallel (ColwiseParallel wq/wk/wv/w1/w3, RowwiseParallel wo/w2) and data parallel
  the way SimpleFSDP (torchtitan's compile-first FSDP) does it: every parameter is a 2-D
  DTensor, Shard(0) (or _StridedShard(0) under a tp Shard(0)) on dp, and a parametrization
  all-gathers it on dp and hands the module the tp DTensor.
- "llama": a small Llama-style model (embedding, 2 such blocks, final norm, output
  projection; ColwiseParallel output with a replicated result), the same way.

A repetition compiles the model from scratch (`torch._dynamo.reset()`, every
sharding-propagation cache emptied, as in a job's one compile; fresh `torch.compile`) and
times its first step (forward, `.sum()`, backward): the worker's CPU
time, so other processes on the machine do not inflate it. The workers are the ones of
`dtensor_dispatch.py` (its `Worker` driver: one long-lived process on stock torch, one with
the overlay's active patches, and one per `--without TEXT`, the overlay with the patch
whose subject contains TEXT reverse-applied), driven with interleaved repetitions (stock
rep i, overlay rep i, ...). Inductor's FX graph cache and AOTAutograd's cache are off, so
each repetition traces, lowers and generates code again; the C++ kernels that inductor
generates, the same each time, are built by the compiler (in subprocesses, whose CPU time
is not counted) once per variant and then loaded from its own cache dir
(`--fresh-kernels`: all caches off, every kernel built again, much slower on a loaded
machine for the same counted time).

Where the time goes: after the timed repetitions each variant compiles once more under
cProfile, and the report gives the cumulative CPU seconds (profiled, so inflated) of:
dynamo's frame compile as a whole, its guard building, AOTAutograd's metadata
collection (the functionalized analysis pass over the graph), DTensor's Python dispatch
while tracing (the slow path that C++ dispatchDTensorOp calls on a native-cache miss, and
within it the overlay's traced-op tail, which runs in Python the local op that stock runs
from C++), sharding propagation (propagate_op_sharding_non_cached,
the miss path every traced op takes), redistribution, the backend compile (inductor's
compile_fx_inner) and the top functions by own time that differ most between stock and
overlay.

Prints per model and backend: median CPU s of the compiling step per variant, the
overlay/stock ratio (median of the per-repetition ratios, with their IQR), and flags
ratios above 1.05x; also the ratio of the medians and of the fastest compiles (on a
loaded machine other processes only add CPU time, through cache and core contention); then the profile breakdown. Writes reports/dtensor_compile_time.json.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dtensor_dispatch import Worker, quartiles  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MESH_SHAPE = (2, 2)  # (dp, tp)
WORLD_SIZE = MESH_SHAPE[0] * MESH_SHAPE[1]
RATIO_LIMIT = 1.05

# (label, file suffix, function name): the cumulative time of each in a profiled compile.
PROFILE_KEYS = [
    ("dynamo frame compile (all)", "torch/_dynamo/convert_frame.py", "_compile"),
    ("  dynamo guard building", "torch/_dynamo/guards.py", "build_guards"),
    ("  AOT metadata collection", "_aot_autograd/collect_metadata_analysis.py", "inner"),
    # DTensor's entry point is C++ (dispatchDTensorOp); Python sees its slow path, which on
    # stock is propagation only and with the overlay, for a traced op with a native cache
    # key, also runs the local op and wraps it (_dispatch_traced_op, stock does it in C++).
    (
        "  DTensor Python slow path",
        "torch/distributed/tensor/_dispatch.py",
        "_propagate_op_sharding_dispatch_slow_path",
    ),  # fmt: skip
    (
        "    traced-op tail (overlay)",
        "torch/distributed/tensor/_dispatch.py",
        "_dispatch_traced_op",
    ),
    (
        "  sharding propagation (miss)",
        "distributed/tensor/_sharding_prop.py",
        "propagate_op_sharding_non_cached",
    ),  # fmt: skip
    ("  redistribute", "torch/distributed/tensor/_redistribute.py", "redistribute_local_tensor"),
    ("  inductor compile_fx_inner", "torch/_inductor/compile_fx.py", "compile_fx_inner"),
]


# --------------------------------------------------------------------------------------
# Worker side: runs in each variant's process.


def build(name: str, mesh):
    """The model, parallelized, and its input batch."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch.nn.utils import parametrize

    dim, n_heads, hidden, vocab, seq, batch = 256, 8, 512, 1024, 32, 2
    head_dim = dim // n_heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x):
            bs, seqlen, _ = x.shape
            q, k, v = (
                w(x).view(bs, seqlen, -1, head_dim).transpose(1, 2)
                for w in (self.wq, self.wk, self.wv)
            )
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(dim, hidden, bias=False)
            self.w2 = nn.Linear(hidden, dim, bias=False)
            self.w3 = nn.Linear(dim, hidden, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.attention, self.feed_forward = Attention(), FeedForward()

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Llama(nn.Module):
        def __init__(self, n_layers=2):
            super().__init__()
            self.tok_embeddings = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList(Block() for _ in range(n_layers))
            self.norm = RMSNorm()
            self.output = nn.Linear(dim, vocab, bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for layer in self.layers:
                h = layer(h)
            return self.output(self.norm(h))

    block_plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    tp_mesh = mesh["tp"]
    torch.manual_seed(0)
    if name == "block":
        model = Block()
        parallelize_module(model, tp_mesh, block_plan)
        inputs = torch.rand(batch, seq, dim)
    else:
        model = Llama()
        for layer in model.layers:
            parallelize_module(layer, tp_mesh, block_plan)
        parallelize_module(model, tp_mesh, {"output": ColwiseParallel(output_layouts=Replicate())})
        inputs = torch.randint(0, vocab, (batch, seq))

    class ReplicateOnDP(nn.Module):
        """SimpleFSDP's parametrization: all-gather on dp, keep the tp sharding."""

        def __init__(self, tp_placement):
            super().__init__()
            self.tp_placement = tp_placement

        def forward(self, p):
            tp_placement = self.tp_placement or Replicate()
            gathered = p.redistribute(mesh, [Replicate(), tp_placement]).to_local()
            if self.tp_placement is None:
                return gathered
            return DTensor.from_local(gathered, tp_mesh, [self.tp_placement], run_check=False)

    dp = mesh.size(0)
    for module in list(model.modules()):
        for pname, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                tp_placement, local = param.placements[0], param.to_local()
            else:
                tp_placement, local = None, param.detach()
            dp_placement = (
                _StridedShard(0, split_factor=mesh.size(1))
                if tp_placement == Shard(0)
                else Shard(0)
            )
            shard = local.chunk(dp, dim=0)[0].clone()
            two_d = DTensor.from_local(
                shard, mesh, [dp_placement, tp_placement or Replicate()], run_check=False
            )
            module.register_parameter(pname, nn.Parameter(two_d))
            parametrize.register_parametrization(
                module, pname, ReplicateOnDP(tp_placement), unsafe=True
            )
    return model, inputs


def clear_sharding_caches() -> None:
    """Every sharding-propagation cache of this process, the overlay's traced-op cache too."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    traced = getattr(DTensor._op_dispatcher.sharding_propagator, "_traced_cache", None)
    if traced is not None:
        traced.clear()


def worker() -> None:
    """Answer one JSON request per stdin line with one JSON line on the original stdout."""
    import os

    reply_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch.distributed.tensor import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    if FRESH_KERNELS:
        inductor_config.force_disable_caches = True
    else:
        # every repetition traces, lowers and generates code again (no FX graph or
        # AOTAutograd cache); the C++ kernels it generates, the same each time, are built
        # once (in "prepare") into this variant's own cache dir and loaded after that
        import torch._functorch.config as functorch_config

        inductor_config.fx_graph_cache = False
        inductor_config.fx_graph_remote_cache = False
        functorch_config.enable_autograd_cache = False
        functorch_config.enable_remote_autograd_cache = False
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=("dp", "tp"))
    rows = [f"{model} / {backend}" for model in ("block", "llama") for backend in BACKENDS]
    built: dict[str, tuple] = {}

    def reply(message: dict) -> None:
        reply_stream.write(json.dumps(message) + "\n")
        reply_stream.flush()

    def compile_step(row: str) -> float:
        model_name, backend = row.split(" / ")
        if model_name not in built:
            built[model_name] = build(model_name, mesh)
        model, inputs = built[model_name]
        torch._dynamo.reset()
        clear_sharding_caches()  # a job compiles once, with cold caches
        compiled = torch.compile(model, backend=backend)
        model.zero_grad(set_to_none=True)
        start = time.process_time()
        compiled(inputs).sum().backward()
        return time.process_time() - start

    def profile(row: str) -> dict:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        compile_step(row)
        profiler.disable()
        stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
        total = sum(tt for _, _, tt, _, _ in stats.values())
        keyed = {}
        for label, suffix, func in PROFILE_KEYS:
            keyed[label] = sum(
                ct
                for (file, _, name), (_, _, _, ct, _) in stats.items()
                if name == func and file.replace("\\", "/").endswith(suffix)
            )
        own = {
            f"{Path(file).parent.name}/{Path(file).name}:{name}": tt
            for (file, _, name), (_, _, tt, _, _) in stats.items()
            if tt > 0.005
        }
        return {"total_s": total, "keyed_s": keyed, "own_s": own}

    reply({"rows": rows})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["cmd"] == "prepare":  # imports, lazy registrations, first build
                compile_step(request["row"])
                reply({"ok": True})
            elif request["cmd"] == "rep":
                reply({"s": compile_step(request["row"])})
            elif request["cmd"] == "profile":
                reply(profile(request["row"]))
        except Exception as error:  # a row the variant refuses: report it, keep going
            first_line = (str(error).strip().splitlines() or [""])[0]
            reply({"error": f"{type(error).__name__}: {first_line[:200]}"})


BACKENDS: list[str] = ["aot_eager"]
FRESH_KERNELS = False


# --------------------------------------------------------------------------------------
# Driver side.


def without_patch(tree: Path, text: str) -> str:
    """Reverse-apply, in the materialized tree, the overlay commit whose subject contains
    ``text``; return its subject."""
    overlay = REPO / "torch_overlay"
    log = subprocess.run(
        ["git", "log", "--format=%H %s"], cwd=overlay, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    matches = [line.split(" ", 1) for line in log if text in line.split(" ", 1)[1]]
    if len(matches) != 1:
        raise SystemExit(f"--without {text!r} matches {len(matches)} overlay commits")
    sha, subject = matches[0]
    diff = subprocess.run(
        ["git", "diff", "--full-index", f"{sha}^", sha, "--", "*.py"],
        cwd=overlay, capture_output=True, check=True,
    ).stdout  # fmt: skip
    proc = subprocess.run(["git", "apply", "-R", "-"], cwd=tree, input=diff, capture_output=True)
    if proc.returncode:
        raise SystemExit(f"cannot take out {subject!r}:\n{proc.stderr.decode().strip()}")
    return subject


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5, help="compiles per row and variant")
    parser.add_argument(
        "--backend", action="append", choices=["aot_eager", "inductor"],
        help="backends to compile with (default: aot_eager)",
    )  # fmt: skip
    parser.add_argument("--only", action="append", help="rows whose name contains TEXT")
    parser.add_argument(
        "--without", action="append", default=[],
        help="add a variant: the overlay without the patch whose subject contains TEXT"
        " (A+B: several, later patches first)",
    )  # fmt: skip
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile breakdown")
    parser.add_argument(
        "--fresh-kernels", action="store_true",
        help="inductor: build the C++ kernels again in every compile (all caches off; the"
        " compiler runs in subprocesses, whose CPU time is not counted)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "dtensor_compile_time.json")
    args = parser.parse_args()
    BACKENDS[:] = args.backend or ["aot_eager"]
    global FRESH_KERNELS
    FRESH_KERNELS = args.fresh_kernels
    if args.worker:
        worker()
        return

    sys.path.insert(0, str(REPO))
    from tools.active import environment, materialize

    worker_args = [arg for backend in BACKENDS for arg in ("--backend", backend)]
    worker_args += ["--fresh-kernels"] if FRESH_KERNELS else []
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        plan = materialize(REPO, tree)
        envs = {"stock": environment(None), "overlay": environment(tree)}
        removed = {}
        for i, text in enumerate(args.without):
            other = Path(scratch) / f"tree-without-{i}"
            materialize(REPO, other)
            removed[f"overlay - {text}"] = "; ".join(
                without_patch(other, part) for part in text.split("+")
            )
            envs[f"overlay - {text}"] = environment(other)
        workers = {
            label: Worker(label, env, __file__, worker_args, Path(scratch))
            for label, env in envs.items()
        }
        names = [
            n for n in workers["stock"].rows if not args.only or any(t in n for t in args.only)
        ]
        rows = []
        for name in names:
            prepared = {label: w.ask(cmd="prepare", row=name) for label, w in workers.items()}
            times: dict[str, list[float]] = {label: [] for label in workers}
            errors = {label: p["error"] for label, p in prepared.items() if "error" in p}
            if not errors:
                order = list(workers.items())
                for i in range(args.reps):  # interleaved, each variant first in turn
                    for label, w in order[i % len(order) :] + order[: i % len(order)]:
                        answer = w.ask(cmd="rep", row=name)
                        if "error" in answer:
                            errors[label] = answer["error"]
                            break
                        times[label].append(answer["s"])
            profiles = {}
            if not errors and not args.no_profile:
                profiles = {label: w.ask(cmd="profile", row=name) for label, w in workers.items()}
            rows.append(summarize(name, times, errors, profiles))
            print_row(rows[-1])
        for w in workers.values():
            w.close()

    print(f"overlay: {plan.summary()}; rank 0 of {WORLD_SIZE} ({MESH_SHAPE[0]} dp x "
          f"{MESH_SHAPE[1]} tp) on the fake process group; median of {args.reps} interleaved "
          f"compiles, CPU s of the first fwd+bwd step")  # fmt: skip
    for label, subject in removed.items():
        print(f"  {label}: {subject}")
    timed = [r for r in rows if r.get("ratios")]
    worst = max(
        ((r["name"], label, ratio) for r in timed for label, ratio in r["ratios"].items()
         if label == "overlay"),
        key=lambda t: t[2], default=None,
    )  # fmt: skip
    if worst:
        print(f"worst overlay/stock ratio: {worst[2]:.3f}x ({worst[0]})")
    report = {
        "overlay": plan.summary(),
        "mesh": list(MESH_SHAPE),
        "reps": args.reps,
        "ratio_limit": RATIO_LIMIT,
        "without": removed,
        "worst": {"row": worst[0], "ratio": worst[2]} if worst else None,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


def summarize(name: str, times: dict, errors: dict, profiles: dict) -> dict:
    row: dict = {"name": name, "errors": errors, "times_s": times, "profiles": profiles}
    if errors:
        return row
    row["median_s"] = {label: statistics.median(t) for label, t in times.items()}
    row["min_s"] = {label: min(t) for label, t in times.items()}
    row["ratios"], row["ratio_iqr"] = {}, {}
    row["ratio_of_medians"], row["ratio_of_mins"] = {}, {}
    for label, t in times.items():
        if label == "stock":
            continue
        paired = [o / s for s, o in zip(times["stock"], t, strict=True)]
        row["ratios"][label] = statistics.median(paired)
        row["ratio_iqr"][label] = quartiles(paired)
        row["ratio_of_medians"][label] = row["median_s"][label] / row["median_s"]["stock"]
        # other processes only ever add CPU time (cache and core contention), so the
        # fastest compile of each variant is the least disturbed one
        row["ratio_of_mins"][label] = row["min_s"][label] / row["min_s"]["stock"]
    return row


def print_row(row: dict) -> None:
    print(f"== {row['name']}")
    for label, error in row["errors"].items():
        print(f"  {label}: {error}")
    if row["errors"]:
        return
    for label, median in row["median_s"].items():
        line = f"  {label:32} {median:8.2f} s"
        if label in row["ratios"]:
            r1, r3 = row["ratio_iqr"][label]
            flag = "  slower" if row["ratios"][label] > RATIO_LIMIT else ""
            line += f"  {row['ratios'][label]:.3f}x stock (IQR {r1:.3f}-{r3:.3f}){flag}"
            line += (f"; medians {row['ratio_of_medians'][label]:.3f}x,"
                     f" fastest {row['ratio_of_mins'][label]:.3f}x")  # fmt: skip
        print(line)
    profiles = row["profiles"]
    if not profiles:
        return
    labels = list(profiles)
    print("  profiled compile, cumulative CPU s (cProfile inflates Python time):")
    print(f"    {'':34}" + "".join(f"{label[:16]:>17}" for label in labels))
    print(f"    {'total (own times summed)':34}"
          + "".join(f"{profiles[label]['total_s']:17.2f}" for label in labels))  # fmt: skip
    for key, _, _ in PROFILE_KEYS:
        print(f"    {key:34}" + "".join(f"{profiles[label]['keyed_s'][key]:17.2f}" for label in labels))  # fmt: skip
    own = {label: profiles[label]["own_s"] for label in labels}
    funcs = set().union(*own.values())
    diffs = sorted(
        funcs, key=lambda f: own["overlay"].get(f, 0) - own["stock"].get(f, 0), reverse=True
    )
    print("    own time, largest overlay - stock:")
    for func in diffs[:8]:
        print(f"      {func[:60]:60}" + "".join(f"{own[label].get(func, 0):9.3f}" for label in labels))  # fmt: skip


if __name__ == "__main__":
    main()
