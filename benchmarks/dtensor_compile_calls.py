"""Python function calls of one DTensor model compile, stock torch vs the overlay: where the
overlay adds work while compiling, measured independently of machine load.

    python benchmarks/dtensor_compile_calls.py [--model block|llama ...] [--without TEXT ...]
                                               [--by-patch] [--backend B] [--top N]
                                               [--out FILE]

The models and the compiling step are those of `dtensor_compile_time.py` (2x2 mesh, rank 0
of 4 on the fake process group, SimpleFSDP x TP, aot_eager or `--backend inductor`, every
sharding cache emptied and Dynamo reset before the compile; no FX graph or AOTAutograd
cache, inductor's C++ kernels built by the warm-up compile and loaded by the counted one). Each variant (stock, the overlay, and per
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

Also counted, load-independent: calls of builtins (C functions, "c_call" events),
sharding-propagation misses, Dynamo graphs and their FX
nodes, AOTAutograd forward/backward graph nodes (the backend's forward and backward
compilers, wrapped to count), and the leaf guards of every frame Dynamo compiled (the guard-manager tree, as
`dynamo_module_guards.py` walks it).

--by-patch: where the overlay's extra calls go, by patch. The driver reads, for each
overlay commit, the functions its diff changes (hunks mapped onto the `def`s of the file
before and after the commit, by qualified name), and the workers attribute every call to
the innermost function on the stack that some patch changed ("owner"; calls with no
changed function on the stack go to "(no patched function on the stack)"). The diff of
calls per owner between stock and overlay is then summed per set of patches that change
the owner. Also printed: the functions whose own call counts differ most (by file and
qualified name), with the patches that change that function or, failing that, its file.

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
    (
        "_dispatch.py",
        "_propagate_op_sharding_dispatch_slow_path",
    ): "DTensor dispatch, other",
    (
        "_dispatch.py",
        "_dispatch_get_local_results_slow_path",
    ): "DTensor local op (Python path)",
    ("_dispatch.py", "_dispatch_traced_op"): "DTensor traced-op tail (overlay)",
    (
        "_sharding_prop.py",
        "propagate_op_sharding_traced",
    ): "traced sharding cache lookup",
    (
        "_sharding_prop.py",
        "propagate_op_sharding_non_cached",
    ): "sharding propagation (miss)",
    ("_redistribute.py", "redistribute_local_tensor"): "redistribute",
    ("_api.py", "__tensor_unflatten__"): "DTensor flatten/unflatten",
    ("_api.py", "__tensor_flatten__"): "DTensor flatten/unflatten",
}
OUTSIDE = "outside dynamo"
MISS = "sharding propagation (miss)"


def rel_path(filename: str) -> str:
    """``torch/...`` of a torch source file, stock or overlay tree; else the file name."""
    i = filename.find("/torch/")
    return filename[i + 1 :] if i >= 0 else filename.rsplit("/", 1)[-1]


def leaf_guards() -> int:
    """Leaf guards of every frame Dynamo compiled since the last reset."""
    from torch._dynamo.convert_frame import input_codes
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    total = 0

    def walk(mgr) -> None:
        nonlocal total
        total += len(mgr.get_leaf_guards())
        children = list(mgr.get_child_managers())
        if hasattr(mgr, "get_key_value_managers"):
            for key_mgr, value_mgr in mgr.get_key_value_managers().values():
                children += [m for m in (key_mgr, value_mgr) if m is not None]
        for child in children:
            walk(child)

    for ref in input_codes.seen:
        code = ref()
        for entry in _debug_get_cache_entry_list(code) if code is not None else []:
            walk(entry.guard_manager.root)
            total += len(entry.guard_manager.root.get_epilogue_lambda_guards())
    return total


def worker(
    model_name: str, changed_file: str | None = None, backend_name: str = "aot_eager"
) -> dict:
    """Count the Python calls of one compile of ``model_name`` in this process."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from dtensor_compile_time import (
        MESH_SHAPE,
        WORLD_SIZE,
        build,
        clear_sharding_caches,
    )
    from torch.distributed.tensor import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    # as dtensor_compile_time.py: no FX graph or AOTAutograd cache (every compile lowers
    # and generates code again); inductor's C++ kernels, built by the first compile in
    # subprocesses, are loaded from this variant's cache dir by the counted one
    import torch._functorch.config as functorch_config

    inductor_config.fx_graph_cache = False
    inductor_config.fx_graph_remote_cache = False
    functorch_config.enable_autograd_cache = False
    functorch_config.enable_remote_autograd_cache = False
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=("dp", "tp"))
    model, inputs = build(model_name, mesh)
    from torch._dynamo.backends.debugging import aot_eager, boxed_nop

    graphs = {
        "dynamo graphs": 0,
        "dynamo graph nodes": 0,
        "AOT fw nodes": 0,
        "AOT bw nodes": 0,
    }

    def counted(key):
        def compiler(gm, example_inputs):
            graphs[key] += len(gm.graph.nodes)
            return boxed_nop(gm, example_inputs)

        return compiler

    def backend(gm, example_inputs):  # aot_eager or inductor, counting its graphs' nodes
        graphs["dynamo graphs"] += 1
        graphs["dynamo graph nodes"] += len(gm.graph.nodes)
        if backend_name == "inductor":
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            def inner_compile(gm, example_inputs, **kwargs):
                key = "AOT bw nodes" if kwargs.get("is_backward") else "AOT fw nodes"
                graphs[key] += len(gm.graph.nodes)
                return compile_fx_inner(gm, example_inputs, **kwargs)

            return compile_fx(gm, example_inputs, inner_compile=inner_compile)
        return aot_eager(
            gm, example_inputs, fw_compiler=counted("AOT fw nodes"),
            bw_compiler=counted("AOT bw nodes"),
        )  # fmt: skip

    def step() -> None:
        torch._dynamo.reset()
        clear_sharding_caches()
        compiled = torch.compile(model, backend=backend)
        model.zero_grad(set_to_none=True)
        compiled(inputs).sum().backward()

    changed = set(map(tuple, json.loads(Path(changed_file).read_text()))) if changed_file else set()
    counts: dict[str, int] = {}
    misses = [0]
    stack = [OUTSIDE]
    frames: list[object] = []
    own: dict[object, int] = {}  # code object -> calls
    owned: dict[object, int] = {}  # owner code object (or None) -> calls
    c_owned: dict[object, int] = {}  # owner -> calls of builtins (C functions)
    is_changed: dict[object, bool] = {}
    owners: list[object] = [None]
    owner_frames: list[object] = []

    def profile(frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            own[code] = own.get(code, 0) + 1
            mine = is_changed.get(code)
            if mine is None:
                mine = is_changed[code] = (
                    rel_path(code.co_filename),
                    code.co_qualname,
                ) in changed
            if mine:
                owners.append(code)
                owner_frames.append(frame)
            owner = owners[-1]
            owned[owner] = owned.get(owner, 0) + 1
            region = REGIONS.get((code.co_filename.rsplit("/", 1)[-1], code.co_name))
            where = region or stack[-1]
            counts[where] = counts.get(where, 0) + 1
            if region:
                misses[0] += region == MISS
                stack.append(region)
                frames.append(frame)
        elif event == "c_call":
            c_owned[owners[-1]] = c_owned.get(owners[-1], 0) + 1
        elif event == "return":
            if frames and frames[-1] is frame:
                frames.pop()
                stack.pop()
            if owner_frames and owner_frames[-1] is frame:
                owner_frames.pop()
                owners.pop()

    step()  # imports, lazy registrations
    for key in graphs:
        graphs[key] = 0
    sys.setprofile(profile)
    step()
    sys.setprofile(None)
    graphs["leaf guards"] = leaf_guards()

    def name(code) -> str:
        if code is None:
            return NO_OWNER
        return f"{rel_path(code.co_filename)}:{code.co_qualname}"

    by_function: dict[str, int] = {}
    for code, n in own.items():
        by_function[name(code)] = by_function.get(name(code), 0) + n
    by_owner: dict[str, int] = {}
    for code, n in owned.items():
        by_owner[name(code)] = by_owner.get(name(code), 0) + n
    c_by_owner: dict[str, int] = {}
    for code, n in c_owned.items():
        c_by_owner[name(code)] = c_by_owner.get(name(code), 0) + n
    return {
        "calls": counts,
        "total": sum(counts.values()),
        "misses": misses[0],
        "stats": graphs,
        "by_function": by_function,
        "by_owner": by_owner,
        "c_by_owner": c_by_owner,
        "c_total": sum(c_by_owner.values()),
    }


NO_OWNER = "(no patched function on the stack)"


def _qualnames(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every def/class in ``source``, as
    ``co_qualname`` spells it."""
    import ast

    spans: list[tuple[int, int, str]] = []

    def visit(node, prefix: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.append((first, child.end_lineno, qual))
                is_fn = not isinstance(child, ast.ClassDef)
                visit(child, qual + (".<locals>." if is_fn else "."), is_fn)
            else:
                visit(child, prefix, in_function)

    try:
        visit(ast.parse(source), "", False)
    except SyntaxError:
        pass
    return spans


def _innermost(spans, line: int) -> str:
    best = None
    for first, last, qual in spans:
        if first <= line <= last and (best is None or last - first < best[1] - best[0]):
            best = (first, last, qual)
    return best[2] if best else "<module>"


def changed_functions(overlay: Path, repo: Path) -> dict[str, list[str]]:
    """``path:qualname`` -> labels (``NNNN subject``) of the overlay commits that change it,
    for every function a commit's Python diff touches (lines before and after)."""
    import re

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=overlay, capture_output=True, text=True, check=False
        ).stdout

    numbers = {}
    for patch in sorted((repo / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch")):
        head = patch.read_text(errors="replace").split("\n\n", 1)[0]
        m = re.search(r"^Subject: (?:\[PATCH[^\]]*\] )?(.*(?:\n .*)*)", head, re.MULTILINE)
        if m:
            numbers[" ".join(m.group(1).split())] = patch.name[:4]
    root = git("rev-list", "--max-parents=0", "HEAD").split()[0]
    result: dict[str, list[str]] = {}
    for line in git("log", "--reverse", "--format=%H %s", f"{root}..HEAD").splitlines():
        sha, subject = line.split(" ", 1)
        label = f"{numbers.get(subject, '????')} {subject}"
        touched: set[str] = set()
        path, spans = None, {}
        for diff_line in git("diff", "-U0", f"{sha}^", sha, "--", "*.py").splitlines():
            if diff_line.startswith("diff --git "):
                path = diff_line.split(" b/", 1)[1]
                spans = {
                    "old": _qualnames(git("show", f"{sha}^:{path}")),
                    "new": _qualnames(git("show", f"{sha}:{path}")),
                }
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", diff_line)
            if m and path:
                a, b = int(m.group(1)), int(m.group(2) or 1)
                c, d = int(m.group(3)), int(m.group(4) or 1)
                for side, start, count in (("old", a, b), ("new", c, d)):
                    for n in range(start, start + count):
                        touched.add(f"{path}:{_innermost(spans[side], n)}")
        for key in touched:
            result.setdefault(key, []).append(label)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--changed", help=argparse.SUPPRESS)
    parser.add_argument(
        "--model", action="append", choices=["block", "llama"],
        help="model(s) to compile (default: block)",
    )  # fmt: skip
    parser.add_argument(
        "--without", action="append", default=[],
        help="add a variant: the overlay without the patch(es) whose subject contains TEXT",
    )  # fmt: skip
    parser.add_argument(
        "--by-patch", action="store_true",
        help="attribute the overlay's extra calls to the patches that change the functions",
    )  # fmt: skip
    parser.add_argument(
        "--backend", choices=["aot_eager", "inductor"], default="aot_eager",
        help="backend to compile with (default: aot_eager)",
    )  # fmt: skip
    parser.add_argument("--top", type=int, default=25, help="rows of the per-function tables")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "dtensor_compile_calls.json")
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.changed, args.backend)
        sys.__stdout__.write("RESULT " + json.dumps(result) + "\n")
        return

    sys.path.insert(0, str(REPO))
    from dtensor_compile_time import without_patch

    from tools.active import environment, materialize

    models = args.model or ["block"]
    report: dict = {"models": {}, "removed": {}}
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        materialize(REPO, tree)
        envs = {"stock": environment(None), "overlay": environment(tree)}
        removed: dict[str, list[str]] = {}
        for i, text in enumerate(args.without):
            other = Path(scratch) / f"tree-without-{i}"
            materialize(REPO, other)
            label = f"overlay - {text}"
            removed[label] = [without_patch(other, part) for part in text.split("+")]
            envs[label] = environment(other)
        report["removed"] = removed
        patches: dict[str, list[str]] = {}
        extra: list[str] = []
        if args.by_patch:
            patches = changed_functions(REPO / "torch_overlay", REPO)
            changed_file = Path(scratch) / "changed.json"
            changed_file.write_text(json.dumps([key.split(":", 1) for key in patches]))
            extra = ["--changed", str(changed_file)]
        for model in models:
            results: dict[str, dict] = {}
            for label, env in envs.items():
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", model, "--backend", args.backend,
                     *extra],
                    cwd=REPO, env=env, capture_output=True, text=True,
                )  # fmt: skip
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode or not lines:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise SystemExit(f"the {label} worker failed")
                results[label] = json.loads(lines[-1][len("RESULT ") :])
                print(
                    f"{model} {label}: {results[label]['total']} Python calls",
                    flush=True,
                )
            report["models"][model] = {"results": results}
            print_regions(f"{model} / {args.backend}", results, removed)
            if args.by_patch:
                report["models"][model]["by_patch"] = print_by_patch(results, patches, args.top)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


def print_regions(model: str, results: dict, removed: dict) -> None:
    stock = results["stock"]
    regions = sorted(
        {r for res in results.values() for r in res["calls"]},
        key=lambda r: -abs(results["overlay"]["calls"].get(r, 0) - stock["calls"].get(r, 0)),
    )
    labels = list(results)
    print(f"\nPython calls of one {model} compile, by region (diff: variant - stock)")
    print(f"{'region':36s}" + "".join(f"{label[:22]:>24s}" for label in labels))
    for region in ["TOTAL", *regions]:
        row = f"{region:36s}"
        for label in labels:
            res = results[label]
            n = res["total"] if region == "TOTAL" else res["calls"].get(region, 0)
            base = stock["total"] if region == "TOTAL" else stock["calls"].get(region, 0)
            row += f"{n:>14d}" + (f" ({n - base:+7d})" if label != "stock" else " " * 10)
        print(row)
    print("counts (load-independent):")
    for key in ["sharding propagation misses", *stock.get("stats", {})]:
        row = f"  {key:34s}"
        for label in labels:
            res = results[label]
            n = res["misses"] if key == "sharding propagation misses" else res["stats"][key]
            base = stock["misses"] if key == "sharding propagation misses" else stock["stats"][key]
            row += f"{n:>14d}" + (
                f" ({n / base if base else 0:6.3f}x)" if label != "stock" else " " * 10
            )
        print(row)
    total = results["overlay"]["total"] / stock["total"]
    print(f"  Python calls, overlay/stock: {total:.4f}x")
    if "c_total" in stock:
        for label in labels[1:]:
            c_ratio = results[label]["c_total"] / stock["c_total"]
            both = (results[label]["c_total"] + results[label]["total"]) / (
                stock["c_total"] + stock["total"]
            )
            print(f"  builtin (C) calls, {label}/stock: {stock['c_total']} -> "
                  f"{results[label]['c_total']} ({c_ratio:.4f}x); Python + C: {both:.4f}x")  # fmt: skip
    for label, subjects in removed.items():
        print(f"{label}: reverse-applied {subjects}")


def print_by_patch(results: dict, patches: dict[str, list[str]], top: int) -> dict:
    """Tables: overlay - stock calls per owner function summed by patch set; functions whose
    own calls differ most."""
    stock, overlay = results["stock"], results["overlay"]

    def patch_set(key: str) -> str:
        labels = patches.get(key)
        if labels is None:  # the function is unchanged: the patches that change its file
            path = key.split(":", 1)[0]
            labels = sorted({lab for k, v in patches.items() if k.split(":", 1)[0] == path
                             for lab in v})  # fmt: skip
            return ("file: " + ", ".join(lab[:4] for lab in labels)) if labels else ""
        return ", ".join(lab[:4] for lab in labels)

    owners = set(stock["by_owner"]) | set(overlay["by_owner"])
    owners |= set(stock.get("c_by_owner", {})) | set(overlay.get("c_by_owner", {}))
    owner_diff = {k: overlay["by_owner"].get(k, 0) - stock["by_owner"].get(k, 0) for k in owners}
    by_set: dict[str, dict] = {}
    for key, diff in owner_diff.items():
        name = NO_OWNER if key == NO_OWNER else patch_set(key)
        entry = by_set.setdefault(
            name, {"diff": 0, "stock": 0, "overlay": 0, "c_diff": 0, "owners": {}}
        )
        entry["diff"] += diff
        entry["c_diff"] += overlay.get("c_by_owner", {}).get(key, 0) - stock.get(
            "c_by_owner", {}
        ).get(key, 0)
        entry["stock"] += stock["by_owner"].get(key, 0)
        entry["overlay"] += overlay["by_owner"].get(key, 0)
        if diff:
            entry["owners"][key] = diff
    print("\nPython calls by owner (innermost function on the stack that a patch changes),"
          " summed per patch set; overlay - stock")  # fmt: skip
    print(
        f"  {'patches':22s}{'stock':>10s}{'overlay':>10s}{'diff':>9s}{'C diff':>9s}"
        "  largest owners (Python-call diff)"
    )
    for name, entry in sorted(by_set.items(), key=lambda kv: -abs(kv[1]["diff"])):
        if not entry["diff"] and not entry["c_diff"] and not entry["owners"]:
            continue
        biggest = sorted(entry["owners"].items(), key=lambda kv: -abs(kv[1]))[:3]
        text = "; ".join(f"{k.split('/')[-1]} {d:+d}" for k, d in biggest)
        print(f"  {name[:22]:22s}{entry['stock']:>10d}{entry['overlay']:>10d}"
              f"{entry['diff']:>+9d}{entry['c_diff']:>+9d}  {text}")  # fmt: skip
    used = sorted({lab for labs in patches.values() for lab in labs})
    print("  patch numbers: " + "; ".join(lab[:70] for lab in used if any(
        lab[:4] in name for name in by_set)))  # fmt: skip
    funcs = set(stock["by_function"]) | set(overlay["by_function"])
    func_diff = {
        k: overlay["by_function"].get(k, 0) - stock["by_function"].get(k, 0) for k in funcs
    }
    print(f"\nfunctions whose own Python calls differ most (overlay - stock), top {top}")
    for key, diff in sorted(func_diff.items(), key=lambda kv: -abs(kv[1]))[:top]:
        print(f"  {diff:>+8d}  {stock['by_function'].get(key, 0):>8d} -> "
              f"{overlay['by_function'].get(key, 0):>8d}  {key[-70:]:70s} {patch_set(key)}")  # fmt: skip
    return {"by_patch_set": by_set, "function_diff": dict(
        sorted(func_diff.items(), key=lambda kv: -abs(kv[1]))[: top * 4])}  # fmt: skip


if __name__ == "__main__":
    main()
