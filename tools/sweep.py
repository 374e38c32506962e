"""`torch-overlay sweep`: upstream's DTensor strategy validator over every registered op and
several dtypes, on stock torch and with the overlay, in one run.

The validator (``torch.distributed.tensor._ops.strategy_validation``, shipped in the wheel)
runs each op's OpInfo samples on plain tensors, then checks every sharding rule DTensor
claims against that ground truth (``--incorrect-only`` mode: it does not search for missing
rules). Its own command line only knows float dtypes, so the worker below calls
``compare_operator`` directly.

Some ops crash the validator (``linalg.ldl_solve`` segfaults in LAPACK on some samples), so
each process runs one batch of ops and prints one line per op as it finishes. When a
process dies or an op runs past the time limit, the op it was on is run again alone: if it
fails alone it is reported as a crash or a timeout, and the rest of the batch goes on in a
new process. ``reports/sweep.{md,json}`` list every rule the validator calls incorrect on
either side (op, dtype, rule, stock verdict, overlay verdict), plus the ops it could not run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tools.active import environment, materialize, tree_digest
from tools.base import installed_torch

DTYPES = ("float32", "float64", "bfloat16", "int64", "bool")
MARK = "@@sweep "  # worker lines that carry a result; the validator prints other lines too
VARIANTS = ("stock", "overlay")
STARTUP_S = 120.0  # importing torch and the OpInfo database, on a loaded 2-core machine


def worker_command() -> list[str]:
    return [sys.executable, "-m", "tools.sweep"]


def run_once(
    command: list[str],
    env: dict[str, str],
    ops: list[str],
    op_timeout: float,
    cwd: Path,
    startup_s: float = STARTUP_S,
    cpu: list[float] | None = None,
) -> tuple[dict[str, dict], str, str]:
    """Run one worker over ``ops``; return the ops it reported, how it ended ("ok",
    "timeout" or "crash") and the tail of its stderr. ``cpu`` gets the process's CPU
    seconds (user + system) appended."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            command + ops, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        reported: dict[str, dict] = {}
        how = "ok"
        deadline = time.monotonic() + startup_s + op_timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                how = "timeout"
                break
            if line is None:
                break
            if line.startswith(MARK):
                result = json.loads(line[len(MARK) :])
                if "op" not in result:  # the worker's start-up line (its CPU seconds)
                    continue
                reported[result["op"]] = result
                deadline = time.monotonic() + op_timeout
        rc = wait_cpu(proc, cpu)
        if how == "ok" and (rc or len(reported) < len(ops)):
            how = "crash"
        stderr.seek(0)
        # The last lines say why (an abort message, a traceback's last line); torch's import
        # warnings ("W1126 ... No CUDA runtime is found") say nothing about the op.
        text = stderr.read().decode(errors="replace").splitlines()
        tail = [line for line in text if line.strip() and not line.startswith("W")][-2:]
    return reported, how, f"exit {rc}: " + " | ".join(tail)


def wait_cpu(proc: subprocess.Popen, cpu: list[float] | None) -> int:
    """Wait for ``proc``; append its CPU seconds (user + system, from wait4) to ``cpu``."""
    if cpu is None:
        return proc.wait()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu.append(usage.ru_utime + usage.ru_stime)
    return proc.returncode


def run_batch(
    command: list[str],
    env: dict[str, str],
    ops: list[str],
    op_timeout: float,
    cwd: Path,
    startup_s: float = STARTUP_S,
    cpu: list[float] | None = None,
) -> dict[str, dict]:
    """Every op of ``ops`` with a result; an op that kills its process alone is a crash.
    ``cpu`` gets each process's CPU seconds appended."""
    results: dict[str, dict] = {}
    runs = deque([ops])
    while runs:
        batch = runs.popleft()
        reported, how, detail = run_once(command, env, batch, op_timeout, cwd, startup_s, cpu)
        results.update(reported)
        left = [op for op in batch if op not in reported]
        if not left:
            continue
        if len(batch) == 1:
            results[batch[0]] = {"op": batch[0], "status": how, "detail": detail}
            continue
        # The op that was running is the first one not reported; try it alone, then go on.
        if left[1:]:
            runs.appendleft(left[1:])
        runs.appendleft(left[:1])
    return results


def sweep_variants(
    repo: Path,
    variants: dict[str, dict[str, str]],
    ops: list[str],
    dtypes: Sequence[str],
    max_samples: int,
    world_size: int,
    batch_size: int,
    op_timeout: float,
    jobs: int,
    command: list[str] | None = None,
    extra: Sequence[str] = (),
    todo: dict[str, list[str]] | None = None,
    done=None,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, dict[str, dict[str, dict]]]:
    """results[variant][dtype][op] for each variant's environment.

    A worker process runs ``batch_size`` (dtype, op) pairs, every dtype in one process
    (``dtype/op`` items), so each variant pays torch's and the OpInfo database's import
    once per batch, not once per dtype and batch. ``todo[variant]``: the ``dtype/op``
    items to run (default: every op in every dtype). ``done(results)`` is called after
    each batch, with everything reported so far (a checkpoint). ``cpu[variant]`` gets
    each worker process's CPU seconds."""
    command = command or worker_command()
    args = [f"--dtype={','.join(dtypes)}", f"--max-samples={max_samples}",
            f"--world-size={world_size}", *extra, "--"]  # fmt: skip
    tasks = []
    for variant, env in variants.items():
        if todo is not None:
            items = todo[variant]
        elif len(dtypes) == 1:
            items = list(ops)
        else:
            items = [f"{d}/{op}" for op in ops for d in dtypes]
        for n, start in enumerate(range(0, len(items), batch_size)):
            tasks.append((n, variant, env, items[start : start + batch_size]))
    # stock's and the overlay's batches in turn, so a stopped run has both sides of the
    # ops it reached
    tasks = [task[1:] for task in sorted(tasks, key=lambda task: task[0])]
    results: dict[str, dict[str, dict[str, dict]]] = {v: {d: {} for d in dtypes} for v in variants}
    cpu = cpu if cpu is not None else {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(run_batch, command + args, env, batch, op_timeout, repo,
                        cpu=cpu.setdefault(variant, [])): variant
            for variant, env, batch in tasks
        }  # fmt: skip
        for future in as_completed(futures):
            for item, result in future.result().items():
                dtype, op = item.split("/", 1) if "/" in item else (dtypes[0], item)
                results[futures[future]][dtype][op] = {**result, "op": op}
            if done is not None:
                done(results)
    return results


def registered_ops(env: dict[str, str], repo: Path) -> list[str]:
    proc = subprocess.run(worker_command() + ["--list"], cwd=repo, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(proc.stdout.splitlines()[-1])


def verdict(result: dict | None, rule: str) -> str:
    if result is None:
        return "not run"
    if result["status"] != "ok":
        return result["status"]
    return "incorrect" if rule in result["incorrect"] else "not flagged"


def rows(results: dict[str, dict[str, dict[str, dict]]], key: str = "incorrect",
         judge=verdict) -> list[dict]:  # fmt: skip
    """One row per (op, dtype, rule) that either variant lists under `key` (incorrect
    rules, or missing ones), with `judge`'s verdict for each side."""
    out = []
    stock, overlay = results["stock"], results["overlay"]
    for dtype in stock:
        for op in sorted(set(stock[dtype]) | set(overlay[dtype])):
            s, o = stock[dtype].get(op), overlay[dtype].get(op)
            flagged: dict[str, dict] = {}
            for result in (s, o):
                if result and result["status"] == "ok":
                    for rule, example in result[key].items():
                        flagged.setdefault(rule, example)
            for rule in sorted(flagged):
                out.append({"op": op, "dtype": dtype, "rule": rule, "stock": judge(s, rule),
                            "overlay": judge(o, rule), "example": flagged[rule]})  # fmt: skip
    return out


def failures(results: dict[str, dict[str, dict[str, dict]]]) -> list[dict]:
    """Ops the validator could not run (crash, timeout, error), per variant and dtype."""
    return [
        {"variant": variant, "dtype": dtype, "op": op, "status": r["status"], "detail": r["detail"]}
        for variant, by_dtype in results.items()
        for dtype, by_op in by_dtype.items()
        for op, r in sorted(by_op.items())
        if r["status"] in ("crash", "timeout", "error")
    ]


def summary(results: dict[str, dict[str, dict[str, dict]]]) -> dict[str, dict[str, dict]]:
    """Per variant and dtype: ops validated, incorrect rules, ops with one, ops not run."""
    out: dict[str, dict[str, dict]] = {}
    for variant, by_dtype in results.items():
        for dtype, by_op in by_dtype.items():
            ok = [r for r in by_op.values() if r["status"] == "ok"]
            out.setdefault(variant, {})[dtype] = {
                "validated": sum(1 for r in ok if r["samples"]),
                "incorrect_rules": sum(len(r["incorrect"]) for r in ok),
                "ops_with_incorrect": sorted(r["op"] for r in ok if r["incorrect"]),
                "failed": sorted(
                    r["op"] for r in by_op.values() if r["status"] in ("crash", "timeout", "error")
                ),
            }
    return out


def markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [
        "# Strategy validator sweep: stock vs overlay",
        "",
        f"torch {report['torch']}; overlay files {report['overlay_files'][:12]}; "
        f"{len(report['ops'])} ops; dtypes {', '.join(settings['dtypes'])}; "
        f"--max-samples {settings['max_samples']}, world size {settings['world_size']}, "
        f"configuration {settings.get('config', '1d-2')} (1-D mesh, sizes "
        f"{settings.get('sizes', '24,12,4,2')}"
        f"{', non-contiguous samples' if settings.get('noncontiguous') else ''}), "
        f"CPU, incorrect-only; {report['seconds']:.0f} s"
        + (
            f", worker CPU {report['cpu_s']['stock']:.0f} s stock / "
            f"{report['cpu_s']['overlay']:.0f} s overlay"
            if "cpu_s" in report
            else ""
        )
        + ("" if report.get("complete", True) else " (INCOMPLETE: stopped before the end)")
        + ".",
        "",
        "| dtype | validated ops (stock / overlay) | incorrect rules (stock / overlay) "
        "| ops not run (stock / overlay) |",
        "| --- | --- | --- | --- |",
    ]
    s, o = report["summary"]["stock"], report["summary"]["overlay"]
    for dtype in settings["dtypes"]:
        lines.append(
            f"| {dtype} | {s[dtype]['validated']} / {o[dtype]['validated']} "
            f"| {s[dtype]['incorrect_rules']} / {o[dtype]['incorrect_rules']} "
            f"| {len(s[dtype]['failed'])} / {len(o[dtype]['failed'])} |"
        )
    lines += ["", "## Rules called incorrect", ""]
    lines += [
        "| op | dtype | rule | stock | overlay | example |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        example = row["example"].replace("|", "\\|")
        lines.append(f"| {row['op']} | {row['dtype']} | `{row['rule']}` | {row['stock']} "
                     f"| {row['overlay']} | {example} |")  # fmt: skip
    if not report["rows"]:
        lines.append("| (none) | | | | | |")
    lines += ["", "## Ops the validator could not run", ""]
    lines += ["| variant | dtype | op | status | detail |", "| --- | --- | --- | --- | --- |"]
    for f in report["failures"]:
        lines.append(f"| {f['variant']} | {f['dtype']} | {f['op']} | {f['status']} "
                     f"| {f['detail'].replace('|', '/')[:200]} |")  # fmt: skip
    return "\n".join(lines) + "\n"


RERUN = {None, "crash", "timeout", "error"}  # a kept result with these is run again


def stock_key() -> str:
    """What stock's results depend on: the installed torch and the worker's code
    (``validate``, ``worker`` and their helpers). A report made with the same key keeps
    its stock results under ``--resume``."""
    import inspect

    torch = installed_torch()
    source = "".join(inspect.getsource(f) for f in (validate, worker, _RuleSets, rule_key, example))
    code = hashlib.sha256(source.encode()).hexdigest()[:16]
    return f"{torch.version} {torch.git_version[:12]} worker {code}"


def sweep(
    repo: Path,
    out: Path,
    dtypes: Sequence[str] = DTYPES,
    only: Sequence[str] = (),
    max_samples: int = 6,
    world_size: int = 2,
    batch_size: int = 200,
    op_timeout: float = 300.0,
    jobs: int = 2,
    noncontiguous: bool = False,
    sizes: str = "24,12,4,2",
    name: str = "sweep",
    config: str = "1d-2",
    resume: bool = False,
    command: list[str] | None = None,
) -> int:
    """Run the sweep, write ``out/<name>.{md,json}``; exit status 1 if the overlay leaves
    an incorrect rule or an op it could not run.

    ``resume``: from an earlier ``out/<name>.json`` of the same settings, keep the stock
    results if stock's torch and this worker are the same (``stock_key``), and the overlay
    results if the overlay files are the same; each kept (dtype, op) result is not run
    again (unless it crashed, timed out or failed). The JSON is rewritten after every
    worker batch (``"complete": false`` until the end), so a stopped run resumes there."""
    started = time.monotonic()
    usage = os.times()
    extra = [f"--sizes={sizes}"] + (["--noncontiguous"] if noncontiguous else [])
    settings = {"config": config, "dtypes": list(dtypes), "max_samples": max_samples,
                "world_size": world_size, "noncontiguous": noncontiguous, "sizes": sizes,
                "narrowed": bool(only)}  # fmt: skip
    path = out / f"{name}.json"
    skey = stock_key()
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        materialize(repo, tree)
        envs = {"stock": environment(None), "overlay": environment(tree)}
        digest = tree_digest(tree)
        ops = list(only) or registered_ops(envs["overlay"], repo)
        kept: dict[str, dict[str, dict[str, dict]]] = {v: {d: {} for d in dtypes} for v in VARIANTS}
        before = {"seconds": 0.0, "cpu_s": {v: 0.0 for v in VARIANTS}, "ops": []}
        if resume and path.is_file():
            old = json.loads(path.read_text())
            same = {k: v for k, v in old.get("settings", {}).items() if k != "narrowed"} == {
                k: v for k, v in settings.items() if k != "narrowed"}  # fmt: skip
            keys = {"stock": old.get("stock_key") == skey,
                    "overlay": old.get("overlay_files") == digest}  # fmt: skip
            for variant in VARIANTS:
                if same and keys[variant]:
                    for dtype in dtypes:
                        kept[variant][dtype] = dict(old["results"][variant].get(dtype, {}))
                    before["cpu_s"][variant] = old.get("cpu_s", {}).get(variant, 0.0)
            if same and (keys["stock"] or keys["overlay"]):
                before["ops"] = old.get("ops", [])
                before["seconds"] = old.get("seconds", 0.0) if keys["overlay"] else 0.0
        todo = {v: [f"{d}/{op}" for op in ops for d in dtypes
                    if kept[v][d].get(op, {}).get("status") in RERUN]
                for v in VARIANTS}  # fmt: skip
        all_ops = list(dict.fromkeys([*before["ops"], *ops]))
        cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        print(f"{name}: kept stock {sum(map(len, kept['stock'].values()))}, overlay "
              f"{sum(map(len, kept['overlay'].values()))} (dtype, op) results; to run stock "
              f"{len(todo['stock'])}, overlay {len(todo['overlay'])}", flush=True)  # fmt: skip

        def report_of(results: dict, complete: bool) -> dict:
            merged = {v: {d: {**kept[v][d], **results[v][d]} for d in dtypes} for v in VARIANTS}
            return {
                "torch": installed_torch().version,
                "stock_key": skey,
                "overlay_files": digest,
                "settings": settings,
                "complete": complete,
                "ops": all_ops,
                "seconds": before["seconds"] + time.monotonic() - started,
                # CPU seconds of the worker processes (user + system), kept results' included
                "cpu_s": {v: round(before["cpu_s"][v] + sum(cpu[v]), 1) for v in VARIANTS},
                "processes": {v: len(cpu[v]) for v in VARIANTS},
                "summary": summary(merged),
                "rows": rows(merged),
                "failures": failures(merged),
                "results": merged,
            }

        def checkpoint(results: dict) -> None:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report_of(results, False), indent=1) + "\n")

        if any(todo.values()):
            results = sweep_variants(repo, envs, ops, dtypes, max_samples, world_size,
                                     batch_size, op_timeout, jobs, command, extra, todo,
                                     checkpoint, cpu)  # fmt: skip
        else:
            results = {v: {d: {} for d in dtypes} for v in VARIANTS}
    report = report_of(results, True)
    now = os.times()
    report["run_cpu_s"] = round(now.children_user + now.children_system
                                - usage.children_user - usage.children_system, 1)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(report))
    print(markdown(report), end="")
    print(f"written: {out / f'{name}.md'}, {path}")
    left = [r for r in report["rows"] if r["overlay"] == "incorrect"]
    return 1 if left or any(f["variant"] == "overlay" for f in report["failures"]) else 0


# --- configurations: what users run, each sampled, --resume per configuration -------------

# name: (world size, OpInfo sizes L,M,S,XS, non-contiguous samples, max samples, dtypes)
CONFIGS: dict[str, dict] = {
    "1d-2": {"world_size": 2, "sizes": "24,12,4,2", "noncontiguous": False,
             "max_samples": 6, "dtypes": DTYPES},
    "1d-3": {"world_size": 3, "sizes": "24,12,6,3", "noncontiguous": False,
             "max_samples": 3, "dtypes": ("float32", "bfloat16", "int64", "bool")},
    "1d-2-noncontiguous": {"world_size": 2, "sizes": "24,12,4,2", "noncontiguous": True,
                           "max_samples": 3, "dtypes": ("float32", "int64", "bool")},
}  # fmt: skip
# Configurations the validator cannot check, and why (README: "Strategy validator sweep");
# test/tools/test_sweep.py ValidatorLimitsTest pins both and fails once a limit is lifted.
UNSUPPORTED = {
    "2d-2x2": "the validator builds a 1-D mesh and checks one placement per tensor "
    "(validate_aten_combination, _compare_outputs); a 2-D mesh needs a placement per "
    "mesh dim and nested Partial/Shard inputs, which it does not construct (pinned: "
    "ValidatorLimitsTest)",
    "uneven": "the validator returns 'uneven shard' (untestable) for every Shard of a "
    "dim the world size does not divide; it splits with tensor_split, whose uneven "
    "chunks are not DTensor's (pinned: ValidatorLimitsTest)",
}


def sweep_configs(
    repo: Path,
    out: Path,
    configs: Sequence[str],
    only: Sequence[str] = (),
    dtypes: Sequence[str] | None = None,
    max_samples: int | None = None,
    resume: bool = False,
    batch_size: int = 200,
    op_timeout: float = 300.0,
    jobs: int = 2,
) -> int:
    """Each configuration into ``out/sweep-<config>.{md,json}``, then ``out/sweep.md`` with
    incorrect rules per configuration and dtype, stock vs overlay. With ``resume``, a
    configuration whose report was made with the same overlay files and settings is kept."""
    from tools.active import overlay_digest

    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {sorted(CONFIGS)}; "
                         f"not supported: {UNSUPPORTED}")  # fmt: skip
    digest = overlay_digest(repo)
    code = 0
    for config in configs:
        c = CONFIGS[config]
        settings = {"dtypes": list(dtypes or c["dtypes"]),
                    "max_samples": max_samples or c["max_samples"],
                    "world_size": c["world_size"], "sizes": c["sizes"],
                    "noncontiguous": c["noncontiguous"], "narrowed": bool(only),
                    "config": config}  # fmt: skip
        path = out / f"sweep-{config}.json"
        if resume and path.is_file():
            old = json.loads(path.read_text())
            if (
                old.get("overlay_files") == digest
                and old.get("settings") == settings
                and old.get("complete", True)
                and old.get("stock_key") == stock_key()
            ):
                print(f"{config}: kept {path} (same overlay files, stock and settings)")
                continue
        code |= sweep(repo, out, dtypes=settings["dtypes"], only=only,
                      max_samples=settings["max_samples"], world_size=c["world_size"],
                      batch_size=batch_size, op_timeout=op_timeout, jobs=jobs,
                      noncontiguous=c["noncontiguous"], sizes=c["sizes"],
                      name=f"sweep-{config}", config=config, resume=resume)  # fmt: skip
    (out / "sweep.md").write_text(configs_markdown(out, configs))
    print(configs_markdown(out, configs), end="")
    return code


# Rules the overlay still calls incorrect that are stated exceptions (a validator limit, with
# the test that shows it), keyed (configuration, op, dtype, rule); every other such row is
# listed in sweep.md as open (a rule bug until shown otherwise).
STATED_EXCEPTIONS: dict[tuple[str, str, str, str], str] = {}

# The wrong rules the review of 2026-11-26 (issue 25) found the validator PRs let through:
# add P(sum), R -> P(sum) next to a 1e6 element; all/any/all.dim on bool Partials; gcd of a
# P(product). sweep.md shows each side's verdict on them.
ISSUE25_CASES = ("review-add-outlier", "review-all", "review-any", "review-all-dim", "review-gcd")


def configs_markdown(out: Path, configs: Sequence[str]) -> str:
    lines = ["# Strategy validator sweep per configuration: stock vs overlay", "",
             "Incorrect rules (stock / overlay), ops validated and ops not run per "
             "configuration and dtype; each configuration's rows are in "
             "`sweep-<configuration>.md`.", "",
             "| configuration | dtype | validated ops (stock / overlay) "
             "| incorrect rules (stock / overlay) | ops with one (overlay) "
             "| ops not run (stock / overlay) | seconds | worker CPU s (stock / overlay) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for config in configs:
        path = out / f"sweep-{config}.json"
        if not path.is_file():
            lines.append(f"| {config} | (not run) | | | | | |")
            continue
        report = json.loads(path.read_text())
        s, o = report["summary"]["stock"], report["summary"]["overlay"]
        cpu = report.get("cpu_s", {})
        for dtype in report["settings"]["dtypes"]:
            ran = [len(report["results"][v].get(dtype, {})) for v in VARIANTS]
            partial = (
                ""
                if report.get("complete", True)
                else f" (stopped: {ran[0]} / {ran[1]} of {len(report['ops'])} ops run)"
            )
            lines.append(
                f"| {config} | {dtype}{partial} "
                f"| {s[dtype]['validated']} / {o[dtype]['validated']} "
                f"| {s[dtype]['incorrect_rules']} / {o[dtype]['incorrect_rules']} "
                f"| {', '.join(o[dtype]['ops_with_incorrect']) or '-'} "
                f"| {len(s[dtype]['failed'])} / {len(o[dtype]['failed'])} "
                f"| {report['seconds']:.0f} "
                f"| {cpu.get('stock', 0):.0f} / {cpu.get('overlay', 0):.0f} |"
            )
    lines += ["", "Not checked (validator limits):", ""]
    lines += [f"- {name}: {why}" for name, why in UNSUPPORTED.items()]
    lines += ["", "## Rules the overlay still calls incorrect, and ops it could not run", ""]
    lines += ["| configuration | op | dtype | rule | stock | example | reason |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    left = 0
    for config in configs:
        path = out / f"sweep-{config}.json"
        if not path.is_file():
            continue
        report = json.loads(path.read_text())
        for row in report["rows"]:
            if row["overlay"] != "incorrect":
                continue
            left += 1
            reason = STATED_EXCEPTIONS.get(
                (config, row["op"], row["dtype"], row["rule"]), "open: no stated reason"
            )
            example = row["example"].replace("|", "\\|")
            lines.append(f"| {config} | {row['op']} | {row['dtype']} | `{row['rule']}` "
                         f"| {row['stock']} | {example} | {reason} |")  # fmt: skip
        for f in report["failures"]:
            if f["variant"] == "overlay":
                left += 1
                lines.append(f"| {config} | {f['op']} | {f['dtype']} | (not run: {f['status']}) "
                             f"| | {f['detail'].replace('|', '/')[:120]} | open |")  # fmt: skip
    if not left:
        lines.append("| (none) | | | | | | |")
    return "\n".join(lines) + "\n" + mutations_section(out)


def mutations_section(out: Path) -> str:
    """The kill rate of ``out/sweep-mutations.json`` (``sweep --mutations``) per family,
    stock vs overlay, and each side's verdict on the issue-25 cases; empty without it."""
    path = out / "sweep-mutations.json"
    if not path.is_file():
        return ""
    from tools.mutations import CORPUS, load

    report = json.loads(path.read_text())
    entries = {e["id"]: e for e in load(CORPUS)["entries"]}
    lines = ["", "## Wrong rules the validator rejects (`sweep --mutations`)", "",
             f"`sweep-mutations.json`: {report['rules']} wrong rules of "
             f"`tools/strategy_mutations.json`, world size {report['settings']['world_size']}, "
             f"overlay files {report['overlay_files'][:12]}. Killed: the validator reports "
             "the rule; detected: killed, wrong on the sample itself, and the rule it was "
             "mutated from not reported too.", "",
             "| family | wrong rules | killed stock | killed overlay "
             "| detected stock | detected overlay | overlay at least stock's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for family, row in sorted(report["kill_rate"]["family"].items()):
        ok = row["overlay"] >= row["stock"] and row["overlay_signal"] >= row["stock_signal"]
        lines.append(f"| {family} | {row['rules']} | {row['stock']} | {row['overlay']} "
                     f"| {row['stock_signal']} | {row['overlay_signal']} "
                     f"| {'yes' if ok else 'NO'} |")  # fmt: skip
    lines += ["", f"Killed on stock and not with the overlay (with signal): {len(report['lost'])}"
              + "".join(f"; `{i}`" for i, _ in report["lost"]) + ".", "",
              "Issue 25's cases (review of 2026-11-26):", "",
              "| entry | op | dtype | rule | stock | overlay |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for case in ISSUE25_CASES:
        e = entries.get(case, {})
        rule = " -> ".join(", ".join(side) for side in e.get("rule", []))
        verdicts = [report["results"][v].get(case, {}).get("verdict", "not run") for v in VARIANTS]
        lines.append(f"| `{case}` | {e.get('op', '?')} | {e.get('dtype', '?')} | `{rule}` "
                     f"| {verdicts[0]} | {verdicts[1]} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# --- sweep --missing: rules DTensor could have but lacks, per configuration ---------------

MISSING_LIMITS = (
    "A rule is *missing* when the validator's full mode (every input placement combination "
    "and output placement of a 1-D mesh, not only DTensor's claims) finds it valid on an "
    "OpInfo sample and DTensor's rule query for that sample does not return it: DTensor "
    "would redistribute (or run replicated) where it could keep the sharding. Limits: a "
    "1-D mesh of the configuration's world size; even shards only (an uneven Shard is "
    "untestable); ops with an OpInfo whose samples map 1:1 to one aten op with a DTensor "
    "rule (cat, whose input is a tensor list, is not discovered); the OpInfo samples only "
    "(a rule valid on a sample can be wrong in general: a 0-d operand, or an all-zero one, "
    "which the examples mark, makes wrong rules hold), so these are candidates, not "
    "rules to add; for decomposition-only ops the rule query seeds Shard(0) on the first "
    "input only, so it under-reports what DTensor runs; a sample on which DTensor's rule "
    "query returns no sharded rule is not counted by upstream (listed apart as "
    "'valid, no sharded rule queried')."
)


MISSING_MAX_SAMPLES = 3  # the full mode tries every placement combination: 3 samples per OpInfo


def missing_rows(results: dict[str, dict[str, dict[str, dict]]]) -> list[dict]:
    """One row per (op, dtype, rule) missing on either side, with each side's status:
    missing (valid, not claimed), claimed (valid and claimed), incorrect (claimed, not
    valid), not valid (neither), or why the op did not run."""

    def status(result: dict | None, rule: str) -> str:
        if result is None:
            return "not run"
        if result["status"] != "ok":
            return result["status"]
        if rule in result["missing"]:
            return "missing"
        if rule in result["incorrect"]:
            return "incorrect"
        if rule in result["claimed"]:
            return "claimed" if rule in result["valid"] else "claimed, not valid"
        return "valid, not claimed" if rule in result["valid"] else "not valid"

    return rows(results, "missing", status)


def missing_summary(results: dict[str, dict[str, dict[str, dict]]]) -> dict:
    out: dict[str, dict[str, dict]] = {}
    for variant, by_dtype in results.items():
        for dtype, by_op in by_dtype.items():
            ok = [r for r in by_op.values() if r["status"] == "ok"]
            out.setdefault(variant, {})[dtype] = {
                "validated": sum(1 for r in ok if r["samples"]),
                "missing_rules": sum(len(r["missing"]) for r in ok),
                "ops_with_missing": sorted(r["op"] for r in ok if r["missing"]),
                "unqueried_rules": sum(len(r.get("unqueried", {})) for r in ok),
                "incorrect_rules": sum(len(r["incorrect"]) for r in ok),
                "no_dtensor_support": sorted(
                    r["op"] for r in by_op.values() if r["status"] == "no DTensor support"
                ),
                "failed": sorted(
                    r["op"] for r in by_op.values() if r["status"] in ("crash", "timeout", "error")
                ),
            }
    return out


def sweep_missing(
    repo: Path,
    out: Path,
    configs: Sequence[str] = ("1d-2",),
    only: Sequence[str] = (),
    dtypes: Sequence[str] | None = None,
    max_samples: int | None = None,
    resume: bool = False,
    batch_size: int = 40,
    op_timeout: float = 300.0,
    jobs: int = 2,
    without_rule: bool = True,
    command: list[str] | None = None,
) -> int:
    """The validator's full mode per configuration, stock vs overlay, into
    ``out/sweep-missing-<config>.json`` and then ``out/sweep-missing.{md,json}``. With
    ``resume``, the ops a configuration's report already holds (same overlay files and
    settings, the op run) are kept and only the others are run, so ``--ops`` pieces add
    up. Exits 0: missing rules are reported, not a failure."""
    from tools.active import overlay_digest

    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {sorted(CONFIGS)}")
    digest = overlay_digest(repo)
    out.mkdir(parents=True, exist_ok=True)
    for config in configs:
        c = CONFIGS[config]
        settings = {"mode": "missing", "config": config,
                    "dtypes": list(dtypes or c["dtypes"]),
                    "max_samples": max_samples or MISSING_MAX_SAMPLES,
                    "world_size": c["world_size"], "sizes": c["sizes"],
                    "noncontiguous": c["noncontiguous"]}  # fmt: skip
        path = out / f"sweep-missing-{config}.json"
        kept: dict = {"ops": [], "seconds": 0.0, "results": {v: {} for v in VARIANTS}}
        if resume and path.is_file():
            old = json.loads(path.read_text())
            if old.get("overlay_files") == digest and old.get("settings") == settings:
                kept = old
        started = time.monotonic()
        extra = [f"--sizes={settings['sizes']}", "--missing"]
        extra += ["--noncontiguous"] if settings["noncontiguous"] else []
        with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
            tree = Path(scratch) / "tree"
            materialize(repo, tree)
            envs = {"stock": environment(None), "overlay": environment(tree)}
            wanted = list(only) or registered_ops(envs["overlay"], repo)

            statuses = {op: {kept["results"].get(v, {}).get(d, {}).get(op, {}).get("status")
                             for v in VARIANTS for d in settings["dtypes"]}
                        for op in wanted}  # fmt: skip
            todo = [op for op in wanted
                    if statuses[op] & {None, "crash", "timeout", "error"}]  # fmt: skip
            print(f"{config}: {len(kept['ops'])} op(s) kept from {path.name}, "
                  f"{len(todo)} of {len(wanted)} to run")  # fmt: skip
            results = sweep_variants(repo, envs, todo, settings["dtypes"],
                                     settings["max_samples"], c["world_size"], batch_size,
                                     op_timeout, jobs, command, extra) if todo else {
                                         v: {d: {} for d in settings["dtypes"]}
                                         for v in VARIANTS}  # fmt: skip
            registry = {}
            if without_rule:
                registry = {v: json.loads(subprocess.run(
                    worker_command() + ["--without-rule"], cwd=repo, env=env,
                    capture_output=True, text=True, check=True).stdout.splitlines()[-1])
                    for v, env in envs.items()}  # fmt: skip
            elif kept.get("without_rule"):
                registry = kept["without_rule"]
        for variant in VARIANTS:
            for dtype in settings["dtypes"]:
                merged = dict(kept["results"].get(variant, {}).get(dtype, {}))
                merged.update(results[variant][dtype])
                results[variant][dtype] = merged
        ops = list(dict.fromkeys([*kept["ops"], *wanted]))
        report = {
            "torch": installed_torch().version,
            "overlay_files": digest,
            "settings": settings,
            "ops": ops,
            "seconds": kept["seconds"] + time.monotonic() - started,
            "summary": missing_summary(results),
            "rows": missing_rows(results),
            "failures": failures(results),
            "without_rule": registry,
            "results": results,
        }
        path.write_text(json.dumps(report, indent=1) + "\n")
    combined = {"limits": MISSING_LIMITS, "configs": {}}
    for config in configs:
        report = json.loads((out / f"sweep-missing-{config}.json").read_text())
        report.pop("results")
        combined["configs"][config] = report
    (out / "sweep-missing.json").write_text(json.dumps(combined, indent=1) + "\n")
    (out / "sweep-missing.md").write_text(missing_markdown(combined))
    print(missing_markdown(combined), end="")
    print(f"written: {out / 'sweep-missing.md'}, {out / 'sweep-missing.json'}")
    return 0


def missing_markdown(combined: dict) -> str:
    lines = ["# Strategy validator sweep: missing rules, stock vs overlay", "",
             combined["limits"], "",
             "| configuration | dtype | ops validated (stock / overlay) "
             "| missing rules (stock / overlay) | ops with one (overlay) "
             "| valid, no sharded rule queried (stock / overlay) "
             "| ops not run (stock / overlay) | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for config, report in combined["configs"].items():
        s, o = report["summary"]["stock"], report["summary"]["overlay"]
        for dtype in report["settings"]["dtypes"]:
            lines.append(
                f"| {config} | {dtype} | {s[dtype]['validated']} / {o[dtype]['validated']} "
                f"| {s[dtype]['missing_rules']} / {o[dtype]['missing_rules']} "
                f"| {', '.join(o[dtype]['ops_with_missing']) or '-'} "
                f"| {s[dtype]['unqueried_rules']} / {o[dtype]['unqueried_rules']} "
                f"| {len(s[dtype]['failed'])} / {len(o[dtype]['failed'])} "
                f"| {report['seconds']:.0f} |"
            )
    for config, report in combined["configs"].items():
        st = report["settings"]
        lines += ["", f"## {config}", "",
                  f"torch {report['torch']}; overlay files {report['overlay_files'][:12]}; "
                  f"{len(report['ops'])} ops; world size {st['world_size']}, sizes "
                  f"{st['sizes']}{', non-contiguous samples' if st['noncontiguous'] else ''}"
                  f", --max-samples {st['max_samples']}; {report['seconds']:.0f} s.", ""]  # fmt: skip
        differ = [r for r in report["rows"] if r["stock"] != r["overlay"]]
        lines += [f"### Stock and overlay disagree ({len(differ)})", "",
                  "A rule missing on one side only: *claimed* on the other side is a rule "
                  "the overlay added or removed; *not valid* or *valid, not claimed* there "
                  "means the validator PRs changed what the ground truth sees.", "",
                  "| op | dtype | rule | stock | overlay | example |",
                  "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += [f"| {r['op']} | {r['dtype']} | `{r['rule']}` | {r['stock']} | {r['overlay']} "
                  f"| {r['example'].replace('|', '/')} |" for r in differ]  # fmt: skip
        if not differ:
            lines.append("| (none) | | | | | |")
        same = [r for r in report["rows"] if r["stock"] == r["overlay"]]
        lines += ["", f"### Missing on both sides ({len(same)})", "",
                  "| op | dtype | rule | example |", "| --- | --- | --- | --- |"]  # fmt: skip
        lines += [f"| {r['op']} | {r['dtype']} | `{r['rule']}` | "
                  f"{r['example'].replace('|', '/')} |" for r in same]  # fmt: skip
        if not same:
            lines.append("| (none) | | | |")
        if report["failures"]:
            lines += ["", "### Ops the validator could not run", "",
                      "| variant | dtype | op | status | detail |",
                      "| --- | --- | --- | --- | --- |"]  # fmt: skip
            lines += [
                f"| {f['variant']} | {f['dtype']} | {f['op']} | {f['status']} "
                f"| {f['detail'].replace('|', '/')[:200]} |"
                for f in report["failures"]
            ]
        registry = report.get("without_rule") or {}
        if registry:
            lines += ["", "### OpInfo ops by DTensor registration (no samples run)", "",
                      "Every OpInfo, by the aten op of its `aten_name`: *rule* (a rule on "
                      "some overload), *decomp* (no rule; DecompShardingStrategy may run "
                      "its decomposition), *composite* (CompositeImplicitAutograd: "
                      "decomposes before DTensor), *no rule* (DTensor raises: every "
                      "placement is missing), *no aten op* (a Python composite).", "",
                      "| kind | stock | overlay | overlay's ops (no rule) |",
                      "| --- | --- | --- | --- |"]  # fmt: skip
            for kind in sorted(set(registry["stock"]) | set(registry["overlay"])):
                names = registry["overlay"].get(kind, [])
                shown = ", ".join(names) if kind == "no rule" else ""
                lines.append(f"| {kind} | {len(registry['stock'].get(kind, []))} "
                             f"| {len(names)} | {shown} |")  # fmt: skip
            gained = sorted(set(registry["overlay"].get("rule", []))
                            - set(registry["stock"].get("rule", [])))  # fmt: skip
            if gained:
                lines += ["", f"A rule with the overlay only: {', '.join(gained)}"]
    return "\n".join(lines) + "\n"


# --- sweep --mutations: the corpus of wrong rules, stock vs overlay ---------------------------


def mutation_summary(corpus: dict, results: dict[str, dict[str, dict]]) -> dict:
    """Per family and per dtype: wrong rules, and how many each variant kills."""
    table: dict[str, dict[str, dict[str, int]]] = {"family": {}, "dtype": {}}
    for entry in corpus["entries"]:
        on_sample = entry["witness"].startswith("trial 0")
        for axis in ("family", "dtype"):
            row = table[axis].setdefault(
                entry[axis],
                {"rules": 0, "stock": 0, "overlay": 0, "on_sample": 0,
                 "stock_signal": 0, "overlay_signal": 0},
            )  # fmt: skip
            row["rules"] += 1
            row["on_sample"] += on_sample
            for variant in VARIANTS:
                result = results[variant].get(entry["id"], {})
                if result.get("verdict") == "killed":
                    row[variant] += 1
                    # A detection: wrong on the sample itself, and the rule it was
                    # mutated from is not reported too.
                    if on_sample and not result.get("origin_reported"):
                        row[f"{variant}_signal"] += 1
    return table


def mutation_markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# Strategy validator: wrong rules it rejects, stock vs overlay",
        "",
        f"torch {report['torch']}; overlay files {report['overlay_files'][:12]}; corpus "
        f"`tools/strategy_mutations.json`, {report['rules']} wrong rules; world size "
        f"{s['world_size']}; {report['seconds']:.0f} s. A rule is killed when the "
        "validator's per-sample path (incorrect-only, every mitigation) reports it.",
        "",
    ]
    lines += ["Detected: killed, wrong on the sample itself, and the registered rule it was "
              "mutated from not reported too (stock reports every int64 P(sum) and most "
              "bf16 rules, right or wrong, so its raw kills include rules it cannot see).",
              ""]  # fmt: skip
    for axis in ("family", "dtype"):
        lines += [f"| {axis} | wrong rules | killed on stock | killed with the overlay "
                  "| wrong on the sample | detected on stock | detected with the overlay |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for name, row in sorted(report["kill_rate"][axis].items()):
            n, m = row["rules"], max(row["on_sample"], 1)
            lines.append(f"| {name} | {n} | {row['stock']} ({row['stock'] / n:.0%}) "
                         f"| {row['overlay']} ({row['overlay'] / n:.0%}) | {row['on_sample']} "
                         f"| {row['stock_signal']} ({row['stock_signal'] / m:.0%}) "
                         f"| {row['overlay_signal']} ({row['overlay_signal'] / m:.0%}) |")  # fmt: skip
        lines.append("")
    lines += ["## Killed on stock, not with the overlay (a validator PR hides them)", ""]
    lines += [f"- `{i}`: {v}" for i, v in report["lost"]] or ["- (none)"]
    lines += ["", "Killed on stock without signal (the rule holds on the sample itself, "
              "or stock also reports the registered rule it was mutated from), not with "
              "the overlay: "
              f"{len(report.get('lost_no_signal', []))}", ""]  # fmt: skip
    lines += [f"- `{i}`: {v}" for i, v in report.get("lost_no_signal", [])]
    kws = report.get("kills_without_signal", {})
    lines += ["", f"Kills without signal (origin rule reported too): stock "
              f"{kws.get('stock', 0)}, overlay {kws.get('overlay', 0)}."]  # fmt: skip
    lines += ["", "## Not killed with the overlay", ""]
    lines += ["| entry | overlay | stock | witness |", "| --- | --- | --- | --- |"]
    for row in report["survivors"]:
        lines.append(f"| `{row['id']}` | {row['overlay']} | {row['stock']} "
                     f"| {row['witness'].replace('|', '/')[:120]} |")  # fmt: skip
    if not report["survivors"]:
        lines.append("| (none) | | | |")
    lines += ["", "## Registered rules the corpus oracle calls wrong", ""]
    lines += [f"- {r}" for r in report["oracle_flags_registered"]] or ["- (none)"]
    return "\n".join(lines) + "\n"


def sweep_mutations(
    repo: Path,
    out: Path,
    corpus_path: Path | None = None,
    dtypes: Sequence[str] = (),
    only: Sequence[str] = (),
    batch_size: int = 400,
    op_timeout: float = 120.0,
    jobs: int = 2,
    command: list[str] | None = None,
    world_size: int | None = None,
) -> int:
    """Ask the validator about every wrong rule of the corpus, stock vs overlay; write
    ``out/sweep-mutations.{md,json}``. Exit 1 if the overlay lets a wrong rule through
    that stock kills. ``world_size`` (default: the corpus's) is the ranks the workers
    simulate; ``command`` is the worker without its arguments (``--corpus``,
    ``--world-size``, ``--`` and the entry ids are appended)."""
    from tools.mutations import CORPUS, load

    corpus_path = corpus_path or CORPUS
    corpus = load(corpus_path)
    if world_size is not None:
        corpus["world_size"] = world_size
    entries = [e for e in corpus["entries"]
               if (not dtypes or e["dtype"] in dtypes)
               and (not only or e["family"] in only or e["op"] in only)]  # fmt: skip
    corpus = {**corpus, "entries": entries}
    command = [*(command or [sys.executable, "-m", "tools.mutations", "check"]),
               f"--corpus={corpus_path}", f"--world-size={corpus['world_size']}", "--"]  # fmt: skip
    started = time.monotonic()
    results: dict[str, dict[str, dict]] = {v: {} for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        materialize(repo, tree)
        envs = {"stock": environment(None), "overlay": environment(tree)}
        by_dtype: dict[str, list[str]] = {}
        for e in entries:
            by_dtype.setdefault(e["dtype"], []).append(e["id"])
        tasks = [(variant, ids[i : i + batch_size])
                 for variant in VARIANTS for ids in by_dtype.values()
                 for i in range(0, len(ids), batch_size)]  # fmt: skip
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [(variant, pool.submit(run_batch, command, envs[variant], batch,
                                             op_timeout, repo))
                       for variant, batch in tasks]  # fmt: skip
            for variant, future in futures:
                results[variant].update(future.result())
        digest = tree_digest(tree)

    def verdict_of(variant: str, entry_id: str) -> str:
        r = results[variant].get(entry_id, {})
        return r.get("verdict") or r.get("status", "not run")

    def no_signal(variant: str, entry_id: str) -> bool:
        return bool(results[variant].get(entry_id, {}).get("origin_reported"))

    # Killed on stock and not with the overlay: a loss, unless stock also reports the
    # registered rule the entry was mutated from (stock kills it without seeing it:
    # e.g. every int64 P(sum) rule, right or wrong, as it cannot build the input).
    lost_all = [(e["id"], e["witness"]) for e in entries
                if verdict_of("stock", e["id"]) == "killed"
                and verdict_of("overlay", e["id"]) != "killed"]  # fmt: skip

    # Or unless the rule is right on the sample itself (its witness needs other inputs
    # of the same shapes): a validator judges a sample, so stock's kill there is the
    # failure to build an input (int64 P(sum), bf16 rounding), not a detection.
    def signal(row: tuple[str, str]) -> bool:
        return row[1].startswith("trial 0") and not no_signal("stock", row[0])

    lost = [row for row in lost_all if signal(row)]
    lost_no_signal = [row for row in lost_all if not signal(row)]
    survivors = [{"id": e["id"], "stock": verdict_of("stock", e["id"]),
                  "overlay": verdict_of("overlay", e["id"]), "witness": e["witness"]}
                 for e in entries if verdict_of("overlay", e["id"]) != "killed"]  # fmt: skip
    report = {
        "torch": installed_torch().version,
        "overlay_files": digest,
        "settings": {
            "world_size": corpus["world_size"],
            "dtypes": list(dtypes),
            "only": list(only),
        },  # fmt: skip
        "rules": len(entries),
        "seconds": time.monotonic() - started,
        "kill_rate": mutation_summary(corpus, results),
        "lost": lost,
        "lost_no_signal": lost_no_signal,
        "kills_without_signal": {
            v: sum(1 for e in entries if no_signal(v, e["id"])) for v in VARIANTS
        },
        "survivors": survivors,
        "oracle_flags_registered": corpus.get("oracle_flags_registered", []),
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep-mutations.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "sweep-mutations.md").write_text(mutation_markdown(report))
    print(mutation_markdown(report), end="")
    print(f"written: {out / 'sweep-mutations.md'}, {out / 'sweep-mutations.json'}")
    return 1 if lost else 0


# --- the worker: one process, one dtype, a batch of ops -------------------------------------


def rule_key(discrepancy) -> str:
    inputs = ", ".join(discrepancy.input_placements)
    outputs = ", ".join(discrepancy.output_placements)
    return f"{discrepancy.aten_op}: {inputs} -> {outputs}"


def example(discrepancy) -> str:
    shapes = ", ".join(str(list(s)) for s in discrepancy.input_shapes)
    scalars = [repr(a) for a in discrepancy.scalar_args]
    scalars += [f"{k}={v!r}" for k, v in discrepancy.scalar_kwargs.items()]
    text = f"shapes {shapes}" + (f"; args {', '.join(scalars)}" if scalars else "")
    return text if len(text) <= 160 else text[:159] + "…"


class _RuleSets:
    """Wraps the validator's ``_compare_rules`` (called once per sample and aten op) to
    keep, per rule, whether the ground truth found it valid and whether DTensor claims it,
    on any sample; and the rules valid on a sample for which DTensor's rule query gave no
    sharded rule at all (``_compare_rules`` returns early there, so upstream's full mode
    does not count them as missing)."""

    def __init__(self, sv) -> None:
        self.sv, self.original = sv, sv._compare_rules
        self.valid: set[str] = set()
        self.claimed: set[str] = set()
        self.unqueried: dict[str, str] = {}  # rule -> example

    def key(self, combo, aten_op) -> str:
        return f"{aten_op}: {', '.join(combo[0])} -> {', '.join(combo[1])}"

    def __enter__(self) -> _RuleSets:
        def compare_rules(
            ground_truth_valid,
            dtensor_rules,
            input_shapes,
            output_shapes,
            sample_idx,
            scalar_args,
            scalar_kwargs,
            aten_op,
            *args,
            **kwargs,
        ):
            self.valid |= {self.key(c, aten_op) for c in ground_truth_valid}
            self.claimed |= {self.key(c, aten_op) for c in dtensor_rules}
            if not dtensor_rules:
                shapes = ", ".join(str(list(s)) for s in input_shapes)
                for c in ground_truth_valid:
                    self.unqueried.setdefault(self.key(c, aten_op), f"shapes {shapes}")
            return self.original(ground_truth_valid, dtensor_rules, input_shapes,
                                 output_shapes, sample_idx, scalar_args, scalar_kwargs,
                                 aten_op, *args, **kwargs)  # fmt: skip

        self.sv._compare_rules = compare_rules
        return self

    def __exit__(self, *exc) -> None:
        self.sv._compare_rules = self.original


def validate(
    op: str, dtype_name: str, max_samples: int, world_size: int, missing: bool = False
) -> dict:
    """One op and dtype through the validator. ``missing``: its full mode (every placement
    combination, not only DTensor's claims), whose false negatives are the missing rules."""
    import torch
    import torch.distributed.tensor._ops.strategy_validation as sv

    if op in sv.SKIP_OPS:
        return {"op": op, "status": "skipped", "detail": sv.SKIP_OPS[op]}
    dtype = getattr(torch, dtype_name)
    sets = _RuleSets(sv)
    try:
        if not any(o.supports_dtype(dtype, "cpu") for o in sv.get_opinfo_by_name(op)):
            return {"op": op, "status": "dtype not supported", "detail": ""}
        with sets:
            stats = sv.compare_operator(op, "cpu", dtype, world_size, max_samples,
                                        incorrect_only=not missing)  # fmt: skip
    except Exception as error:  # the validator's own failure, not a verdict on a rule
        return {"op": op, "status": "error", "detail": f"{type(error).__name__}: {error}"}
    if stats.no_dtensor_support:
        return {"op": op, "status": "no DTensor support", "detail": ""}
    incorrect: dict[str, str] = {}
    for discrepancy in stats.false_positives:
        incorrect.setdefault(rule_key(discrepancy), example(discrepancy))
    result = {"op": op, "status": "ok", "samples": stats.total_samples,
              "correct": stats.true_positives, "incorrect": incorrect,
              "skips": stats.skip_reasons}  # fmt: skip
    if missing:
        found: dict[str, str] = {}
        for discrepancy in stats.false_negatives:
            # A zero operand makes wrong rules hold on the sample (x + 0 under any
            # Partial): say so, the rule is then no candidate.
            sample = discrepancy.sample
            tensors = sv.extract_tensors_from_sample(sample) if sample is not None else []
            zero = any(t.numel() and not t.any() for _, t in tensors)
            text = example(discrepancy) + ("; an all-zero operand" if zero else "")
            key = rule_key(discrepancy)
            if key not in found or found[key].endswith("operand"):
                found[key] = text
        result.update(
            missing=found,
            combinations=stats.total_combinations,
            valid=sorted(sets.valid),
            claimed=sorted(sets.claimed),
            unqueried={k: v for k, v in sets.unqueried.items() if k not in sets.claimed},
        )
    return result


def ops_without_rule() -> dict[str, list[str]]:
    """OpInfo names (every OpInfo, not only the registered ones) by how DTensor would run
    the aten op of the OpInfo's ``aten_name``, from the registrations alone (no samples):
    ``rule`` (a rule on some overload), ``composite`` (no rule; CompositeImplicitAutograd,
    so it decomposes before DTensor's rules are needed), ``decomp`` (no rule; in the
    decomposition table, which DecompShardingStrategy may run), ``no rule`` (DTensor
    raises), ``no aten op`` (no ``aten.<aten_name>`` operator: a Python composite, mapped
    by its samples only)."""
    import torch
    from torch._decomp import decomposition_table
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.common_methods_invocations import op_db

    propagator = DTensor._op_dispatcher.sharding_propagator
    registered = (set(propagator.op_to_rules) | set(propagator.op_strategy_funcs)
                  | set(propagator.op_single_dim_strategy_funcs))  # fmt: skip

    def composite(overload) -> bool:
        try:
            return bool(overload._can_decompose())
        except RuntimeError:  # a Python-only packet (e.g. aten.broadcast_shapes)
            return False

    order = ("rule", "composite", "decomp", "no rule", "no aten op")
    best: dict[str, str] = {}  # an OpInfo name's variants may name other aten ops
    for info in op_db:
        packet = getattr(torch.ops.aten, info.aten_name, None)
        try:
            overloads = [getattr(packet, n) for n in packet.overloads()] if packet else []
            overloads = [o for o in overloads if torch._C._dispatch_has_kernel(o.name())]
        except (RuntimeError, AttributeError):
            overloads = []
        if not overloads:
            kind = "no aten op"
        elif any(o in registered for o in overloads):
            kind = "rule"
        elif all(composite(o) for o in overloads):
            kind = "composite"
        elif any(o in decomposition_table or composite(o) for o in overloads):
            kind = "decomp"
        else:
            kind = "no rule"
        if info.name not in best or order.index(kind) < order.index(best[info.name]):
            best[info.name] = kind
    out: dict[str, list[str]] = {}
    for name, kind in sorted(best.items()):
        out.setdefault(kind, []).append(name)
    return dict(sorted(out.items()))


def worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sweep")
    parser.add_argument("--list", action="store_true", help="print the registered op names")
    parser.add_argument("--dtype", default="float32",
                        help="the dtype of items without one (items may be 'dtype/op')")  # fmt: skip
    parser.add_argument("--max-samples", type=int, default=6)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--noncontiguous", action="store_true",
                        help="every sample's tensors made non-contiguous (SampleInput.noncontiguous)")  # fmt: skip
    parser.add_argument("--sizes", default="24,12,4,2", help="OpInfo's L,M,S,XS")
    parser.add_argument("--missing", action="store_true",
                        help="the validator's full mode: report missing rules too")  # fmt: skip
    parser.add_argument("--without-rule", action="store_true",
                        help="print the OpInfo names by DTensor registration (ops_without_rule)")  # fmt: skip
    parser.add_argument("ops", nargs="*")
    args = parser.parse_args(argv)
    started = time.process_time()

    import torch.distributed as dist
    import torch.distributed.tensor._ops.strategy_validation as sv
    import torch.testing._internal.common_methods_invocations as common_ops
    from torch.testing._internal.opinfo import core as opinfo_core

    # The sizes the validator's own command line sets, so samples shard evenly on 2 ranks
    # (a configuration may set others, e.g. multiples of 3 for 3 ranks).
    sizes = [int(n) for n in args.sizes.split(",")]
    for module in (opinfo_core, common_ops):
        module.L, module.M, module.S, module.XS = sizes
    if args.noncontiguous:
        sample_inputs = opinfo_core.OpInfo.sample_inputs

        def noncontiguous(self, *a, **k):
            return [s.noncontiguous() for s in sample_inputs(self, *a, **k)]

        opinfo_core.OpInfo.sample_inputs = noncontiguous
    dist.init_process_group("fake", rank=0, world_size=args.world_size)
    print(MARK + json.dumps({"startup_cpu_s": round(time.process_time() - started, 3)}),
          flush=True)  # fmt: skip
    try:
        if args.list:
            print(json.dumps(sv.get_registered_op_names()))
            return 0
        if args.without_rule:
            print(json.dumps(ops_without_rule()))
            return 0
        for item in args.ops:
            # "dtype/op" (a sweep's batch holds every dtype), or an op in --dtype
            dtype, op = item.split("/", 1) if "/" in item else (args.dtype, item)
            started = time.process_time()
            result = validate(op, dtype, args.max_samples, args.world_size, args.missing)
            result["cpu_s"] = round(time.process_time() - started, 3)
            print(MARK + json.dumps({**result, "op": item}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
