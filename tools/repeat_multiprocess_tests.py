"""Run the multi-process test files N times each under `torch-overlay run`, and count failures.

    .venv/bin/python -m tools.repeat_multiprocess_tests -n 10            # every such file
    .venv/bin/python -m tools.repeat_multiprocess_tests -n 10 test/distributed/tensor/test_x.py

A multi-process test file is one with a class deriving from DTensorTestBase,
MultiProcessTestCase, DTensorContinuousTestBase or MultiProcContinuousTest (found with a regular
expression over test/). A run selects only those classes (their pytest node ids; the
single-process tests beside them, LocalTensor twins included, cannot abort a worker), or the
whole file with --whole-files. Each run is one pytest process, `-s` so that what the spawned workers
print reaches the log: a run fails on a non-zero exit status, and its log is kept. Every run is
also scanned for the signs of an abort at worker exit ("terminate called", a worker's exit code
-6) and for test/conftest.py's report of gloo threads left alive at worker exit. No retries:
every run counts. Writes reports/repeat-multiprocess.json and the logs of failed runs under
reports/repeat-multiprocess/; exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASES = (
    r"(?:DTensorTestBase|MultiProcessTestCase|DTensorContinuousTestBase|MultiProcContinuousTest)"
)
CLASS = re.compile(rf"^class (\w+)\([^)]*\b{BASES}\b", re.M)
SIGNS = {
    "abort": re.compile(r"terminate called|got -6 for pid|SIGABRT"),
    "gloo_threads_left": re.compile(r"conftest: \d+ gloo thread\(s\) still alive"),
}


def multiprocess_files() -> list[Path]:
    return sorted(
        p.relative_to(REPO)
        for p in (REPO / "test").rglob("test_*.py")
        if CLASS.search(p.read_text(encoding="utf-8"))
    )


def multiprocess_classes(path: Path) -> list[str]:
    return CLASS.findall((REPO / path).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="default: every multi-process file")
    parser.add_argument("-n", type=int, default=10, help="runs per file (default 10)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--out", type=Path, default=REPO / "reports")
    parser.add_argument("--whole-files", action="store_true",
                        help="run every test of each file, not only its multi-process classes")  # fmt: skip
    args = parser.parse_args(argv)
    files = args.files or multiprocess_files()
    logs = args.out / "repeat-multiprocess"
    logs.mkdir(parents=True, exist_ok=True)
    python = REPO / ".venv" / "bin" / "python"
    results = []
    for i in range(1, args.n + 1):  # round-robin: machine load hits every file alike
        for path in files:
            targets = ([str(path)] if args.whole_files else
                       [f"{path}::{name}" for name in multiprocess_classes(path)])  # fmt: skip
            cmd = [str(python), "-m", "tools.cli", "run", "--", str(python), "-m", "pytest",
                   *targets, "-q", "-s", "-p", "no:cacheprovider"]  # fmt: skip
            start = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                      timeout=args.timeout)  # fmt: skip
                rc, out = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", f"{e.stdout or ''}{e.stderr or ''}"
            seconds = round(time.monotonic() - start, 1)
            signs = sorted(name for name, pattern in SIGNS.items() if pattern.search(out))
            summary = next((ln for ln in reversed(out.splitlines()) if " in " in ln), "")
            row = {"file": str(path), "run": i, "rc": rc, "seconds": seconds, "signs": signs,
                   "summary": summary.strip("= ")}  # fmt: skip
            if rc != 0 or signs:
                log = logs / f"{path.stem}.run{i}.log"
                log.write_text(out, encoding="utf-8")
                row["log"] = str(log.relative_to(REPO) if log.is_relative_to(REPO) else log)
            results.append(row)
            status = "ok" if rc == 0 else f"FAILED (rc {rc})"
            print(f"[{i}/{args.n}] {path}: {status} {seconds}s {' '.join(signs)} {row['summary']}",
                  flush=True)  # fmt: skip
    print("\nfile: runs, failed, with abort signs, with gloo threads left")
    for path in files:
        rows = [r for r in results if r["file"] == str(path)]
        failed = sum(r["rc"] != 0 for r in rows)
        aborts = sum("abort" in r["signs"] for r in rows)
        left = sum("gloo_threads_left" in r["signs"] for r in rows)
        print(f"{path}: {len(rows)}, {failed}, {aborts}, {left}")
    (args.out / "repeat-multiprocess.json").write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["rc"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
