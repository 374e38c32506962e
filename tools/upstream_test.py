"""`torch-overlay upstream-test`: upstream's own test files for every module the series
touches, run once on stock torch and once with the overlay; only the differences are reported.

Which files run is declared in ``patches/upstream.json`` ("tests": touched source path ->
upstream test files, "select": an optional ``-k`` expression per file). Outcomes are read per
test from pytest's junit XML. A test that passes on stock and fails, errors or does not run
with the overlay is a regression (exit 1); one that fails on stock and passes with the overlay
is listed as fixed; tests that fail or skip on both are counted only.

The test files come from, in order: ``--pytorch-src DIR`` (a PyTorch checkout), ``--tests DIR``
(any tree with upstream's ``test/`` layout), or the git-ignored cache ``.upstream-tests/``
(written by ``--fetch``, ``tools/fetch_upstream_tests.py``). A tree with a ``manifest.jsonl``
is checked against it before anything runs: one JSON object per line with ``repo``
("pytorch/pytorch"), ``commit`` (40 hex), ``path`` (relative to the tree, under ``test/``),
``bytes`` (the file's size) and ``sha256``. Other keys are ignored; a line without these keys
(the cache's first format had ``length`` and no ``repo``) is refused with a request to
re-fetch, since its files' origin cannot be checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tools.active import environment, materialize, tree_digest
from tools.base import (
    OverlayError,
    git,
    installed_torch,
    read_upstream_map,
    sha256,
)

CACHE_DIR = ".upstream-tests"
MANIFEST = "manifest.jsonl"
UPSTREAM_REPO = "pytorch/pytorch"  # the only repository whose test files the gate runs
MANIFEST_KEYS = ("repo", "commit", "path", "bytes", "sha256")
REFETCH = "re-fetch the files with `torch-overlay upstream-test --fetch`"
PASSED, FAILED, SKIPPED, MISSING = "passed", "failed", "skipped", "not run"
# pytest -q output, the junit XML and the report stay small; tracebacks are in the XML.
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit2", "-rN"]


@dataclass
class FileResult:
    path: str
    select: str | None
    stock: dict[str, str] = field(default_factory=dict)  # test id -> outcome
    overlay: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # variant -> timeout / crash text
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def regressions(self) -> list[str]:
        lost = [t for t, o in self.stock.items() if o == PASSED and self.overlay.get(t) != PASSED]
        return sorted(lost)

    @property
    def fixed(self) -> list[str]:
        return sorted(t for t, o in self.overlay.items()
                      if o == PASSED and self.stock.get(t) == FAILED)  # fmt: skip

    def counts(self, variant: str) -> dict[str, int]:
        outcomes = list(getattr(self, variant).values())
        return {o: outcomes.count(o) for o in (PASSED, FAILED, SKIPPED)}


def test_root(repo: Path, pytorch_src: Path | None, tests: Path | None) -> Path:
    """The directory that holds upstream's ``test/`` tree."""
    if pytorch_src is not None:
        if not (pytorch_src / "test").is_dir() or not (pytorch_src / "torch").is_dir():
            raise OverlayError(f"{pytorch_src} is not a PyTorch checkout (no test/ and torch/)")
        return pytorch_src
    if tests is not None:
        if not (tests / "test").is_dir():
            raise OverlayError(f"{tests} has no test/ directory (upstream's layout)")
        return tests
    cache = repo / CACHE_DIR
    if (cache / MANIFEST).is_file():
        return cache
    raise OverlayError(
        f"no upstream test files: give --pytorch-src DIR or --tests DIR, or fill {CACHE_DIR}/ "
        "with `torch-overlay upstream-test --fetch` (README: 'Upstream's gates')"
    )


def manifest_problem(entry: object) -> str | None:
    """Why one manifest line is not a valid entry, or None."""
    if not isinstance(entry, dict) or not set(MANIFEST_KEYS) <= set(entry):
        return f"not an entry of this format (keys: {', '.join(MANIFEST_KEYS)})"
    path = entry["path"]
    checks = {
        "repo": isinstance(entry["repo"], str) and re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repo"]),
        "commit": isinstance(entry["commit"], str) and re.fullmatch(r"[0-9a-f]{40}", entry["commit"]),
        # Relative, under test/, no way out of the tree: the path is joined to the cache root.
        "path": isinstance(path, str) and path.startswith("test/") and ".." not in path.split("/")
        and "" not in path.split("/") and "\\" not in path,
        "bytes": type(entry["bytes"]) is int and entry["bytes"] >= 0,
        "sha256": isinstance(entry["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]),
    }  # fmt: skip
    bad = [key for key, ok in checks.items() if not ok]
    return f"invalid {', '.join(bad)}" if bad else None


def read_manifest(path: Path) -> dict[str, dict]:
    """A manifest's entries by path; a line that is not a valid entry is refused."""
    entries = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            entry = None
        problem = manifest_problem(entry)
        if problem is None and entry["path"] in entries:
            problem = f"{entry['path']} is listed twice"
        if problem:
            raise OverlayError(f"{path}:{number}: {problem}; {REFETCH}")
        entries[entry["path"]] = entry
    return entries


def manifest(root: Path) -> dict[str, dict]:
    """The tree's record of where each file came from (empty for a checkout)."""
    path = root / MANIFEST
    return read_manifest(path) if path.is_file() else {}


def check_tree(root: Path, entries: dict[str, dict]) -> None:
    """Refuse, before anything runs, a tree whose files do not match its manifest."""
    for path, entry in entries.items():
        file = root / path
        if not file.is_file():
            raise OverlayError(f"{root}: {path} is in {MANIFEST} but missing; {REFETCH}")
        data = file.read_bytes()
        if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
            raise OverlayError(f"{root}: {path} differs from its {MANIFEST} entry; {REFETCH}")
    # A file the manifest does not list could be imported by the tests unchecked.
    for file in sorted((root / "test").rglob("*")):
        rel = file.relative_to(root)
        if file.is_file() and "__pycache__" not in rel.parts and rel.as_posix() not in entries:
            raise OverlayError(f"{root}: {rel.as_posix()} is not in {MANIFEST}; {REFETCH}")


def planned_files(repo: Path, only: list[str]) -> list[tuple[str, str | None]]:
    """(test file, -k selection) for ``only`` in that order, or for every mapped file."""
    upstream = read_upstream_map(repo)
    files = sorted({f for tests in upstream.tests.values() for f in tests})
    unknown = [f for f in only if f not in files]
    if unknown:
        raise OverlayError(f"not mapped in patches/upstream.json: {', '.join(unknown)}")
    return [(f, upstream.select.get(f)) for f in (only or files)]


def combine_selections(*selections: str | None) -> str | None:
    """One -k expression that requires each given one."""
    given = [s for s in selections if s]
    return given[0] if len(given) == 1 else " and ".join(f"({s})" for s in given) or None


def outcomes(junit: Path) -> dict[str, str]:
    """Test id -> outcome from a junit XML file written by pytest."""
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname is the dotted module path plus the class: keep the class, the file is known.
        test_id = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = FAILED  # a failing teardown counts against the test too
        else:
            outcome = SKIPPED if "skipped" in tags else PASSED
        # A test reported twice keeps its worst outcome: failed, then passed, then skipped.
        rank = [SKIPPED, PASSED, FAILED]
        if rank.index(outcome) >= rank.index(results.get(test_id, SKIPPED)):
            results[test_id] = outcome
    return results


def run_pytest(
    root: Path, test_file: str, select: str | None, env: dict[str, str], junit: Path,
    timeout: float, test_timeout: float,
) -> str | None:  # fmt: skip
    """Run one file; None when pytest finished (whatever the tests did), else the problem."""
    with tempfile.TemporaryDirectory(prefix="upstream-test-") as scratch:
        # An empty ini keeps this project's pytest settings away from upstream's files.
        ini = Path(scratch) / "pytest.ini"
        ini.write_text("[pytest]\n")
        command = [
            sys.executable, "-m", "pytest", str(root / test_file), *PYTEST_ARGS,
            "-c", str(ini), "--rootdir", str(root), f"--junitxml={junit}",
            f"--timeout={test_timeout:g}",  # pytest-timeout (a dependency)
        ]  # fmt: skip
        if select:
            command += ["-k", select]
        # Its own session, so a hung multi-process test is killed with all its children.
        proc = subprocess.Popen(command, cwd=root / "test", env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"timed out after {timeout:g} s"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # children a test left behind
    if not junit.is_file():
        tail = "\n".join(output.strip().splitlines()[-5:])
        return f"pytest exited {proc.returncode} without a report:\n{tail}"
    errors = [line[1:].strip() for line in output.splitlines() if line.startswith("E   ")]
    if "error during collection" in output or "errors during collection" in output:
        # Typically a test file from a commit far from the base: it needs a newer (or older) torch.
        return "does not import: " + (errors[-1] if errors else "collection error")
    return None


def run_variant(
    root: Path, test_file: str, select: str | None, env: dict[str, str], junit: Path,
    timeout: float, test_timeout: float,
) -> dict:  # fmt: skip
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    start = time.monotonic()
    problem = run_pytest(root, test_file, select, env, junit, timeout, test_timeout)
    return {"seconds": round(time.monotonic() - start, 1), "problem": problem,
            "outcomes": None if problem else outcomes(junit)}  # fmt: skip


def run_file(
    root: Path, test_file: str, select: str | None, tree: Path, out: Path,
    timeout: float, test_timeout: float, keys: dict[str, dict], resume: bool,
) -> FileResult:  # fmt: skip
    """Run one file on stock and with the overlay. With ``resume``, a variant whose key (what
    decides its outcome) matches the saved run of an earlier call is not run again: stock
    results survive any change to the overlay."""
    result = FileResult(test_file, select)
    slug = test_file.replace("/", ".")
    saved_path = out / f"{slug}.json"
    saved = json.loads(saved_path.read_text()) if resume and saved_path.is_file() else {}
    for variant, active in (("stock", None), ("overlay", tree)):
        run, note = saved.get(variant, {}), ", reused"
        if run.get("key") != keys[variant]:
            junit = out / variant / f"{slug}.xml"
            run = run_variant(root, test_file, select, environment(active), junit, timeout,
                              test_timeout)  # fmt: skip
            run, note = {"key": keys[variant], **run}, ""
        saved[variant] = run
        result.seconds[variant] = run["seconds"]
        if run["problem"]:
            result.problems[variant] = run["problem"]
        else:
            setattr(result, variant, run["outcomes"])
        print(f"  {variant}: {format_counts(result, variant)} ({run['seconds']} s{note})",
              flush=True)  # fmt: skip
    saved_path.parent.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(json.dumps(saved) + "\n")
    if "overlay" in result.problems and "stock" not in result.problems:
        # Everything that passed on stock did not run with the overlay.
        result.overlay = {t: MISSING for t in result.stock}
    return result


def format_counts(result: FileResult, variant: str) -> str:
    if variant in result.problems:
        return result.problems[variant].splitlines()[0]
    c = result.counts(variant)
    return f"{c[PASSED]} passed, {c[FAILED]} failed, {c[SKIPPED]} skipped"


def origins(root: Path, pytorch_src: Path | None, files: list[str]) -> dict[str, dict]:
    """Test file -> {"repo", "commit"} it came from: the manifest's entries; for a checkout,
    its HEAD (the files' own commit may differ if the working tree has edits)."""
    entries = manifest(root)
    if (root / MANIFEST).is_file():  # a tree without one (a checkout, --tests) is not checked
        check_tree(root, entries)
    if pytorch_src is None:
        return entries
    head = git("rev-parse", "HEAD", cwd=root, check=False).strip() or None
    found = {"repo": f"checkout {root}", "commit": head}
    return dict.fromkeys(files, found)


def origin_text(entry: dict | None) -> str:
    if not entry:
        return "unrecorded"
    return f"{entry['repo']}@{entry['commit'][:12]}" if entry.get("commit") else entry["repo"]


def report(results: list[FileResult], unavailable: list[str], origin: dict[str, dict]) -> str:
    lines = ["| upstream test file | from (repo@commit) | stock | overlay | regressions | fixed |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        commit = origin_text(origin.get(r.path))
        name = r.path + (f" -k '{r.select}'" if r.select else "")
        lines.append(f"| {name} | {commit} | {format_counts(r, 'stock')} | "
                     f"{format_counts(r, 'overlay')} | {len(r.regressions)} | {len(r.fixed)} |")  # fmt: skip
    for path in unavailable:
        lines.append(f"| {path} | — | not available | not available | — | — |")
    for r in results:
        lines += [f"- REGRESSION {r.path}::{t} "
                  f"(stock {r.stock[t]}, overlay {r.overlay.get(t, MISSING)})"
                  for t in r.regressions]  # fmt: skip
        lines += [f"- fixed {r.path}::{t}" for t in r.fixed]
    return "\n".join(lines) + "\n"


def write_report(
    digest: str, out: Path, root: Path, origin: dict[str, dict], results: list[FileResult],
    unavailable: list[str], pending: list[str], narrowed: bool, quiet: bool = False,
) -> int:  # fmt: skip
    """Write reports/upstream-test.{md,json}, or upstream-test-subset.{md,json} for a narrowed
    run, so that the last whole run's report, which ``verify`` shows, is never replaced by a
    part of it. Return the number of regressions."""
    text = report(results, unavailable, origin)
    regressions = sum(len(r.regressions) for r in results)
    fixed = sum(len(r.fixed) for r in results)
    verdict = (f"{len(results)} file(s) run, {len(unavailable)} not available; "
               f"{regressions} regression(s), {fixed} fixed")  # fmt: skip
    if pending:
        verdict += f"; still to run: {', '.join(pending)}"
    name = "upstream-test-subset" if narrowed else "upstream-test"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text + "\n" + verdict + "\n")
    (out / f"{name}.json").write_text(json.dumps({
        "overlay_files": digest, "source": str(root), "regressions": regressions,
        "written": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
        "verdict": verdict,
        "fixed": fixed, "unavailable": unavailable, "pending": pending,
        # Files whose tests were not compared: a gate cannot pass on what it did not see.
        "not_compared": [*unavailable, *pending,
                         *(r.path for r in results if "stock" in r.problems)],
        "narrowed": narrowed,  # files or -k chosen on the command line: not the whole gate
        "files": [{
            "path": r.path, "select": r.select,
            "repo": origin.get(r.path, {}).get("repo"),
            "commit": origin.get(r.path, {}).get("commit"),
            "stock": r.counts("stock"), "overlay": r.counts("overlay"),
            "problems": r.problems, "seconds": r.seconds,
            "regressions": r.regressions, "fixed": r.fixed,
        } for r in results],
    }, indent=2) + "\n")  # fmt: skip
    if not quiet:
        print(text + verdict + f"; report in {out}/{name}.md")
    return regressions


def upstream_test(
    repo: Path, *, pytorch_src: Path | None = None, tests: Path | None = None,
    only: list[str] = (), select: str | None = None, timeout: float = 1800,
    test_timeout: float = 600, out: Path | None = None, resume: bool = False,
) -> int:  # fmt: skip
    root = test_root(repo, pytorch_src, tests)
    plan = planned_files(repo, list(only))
    # Refuses, before anything runs, a tree that does not match its manifest.
    origin = origins(root, pytorch_src, [f for f, _ in plan])
    out = out or repo / "reports"
    # Every mapped file, in any order, is the whole gate; a subset or a -k is not.
    narrowed = bool(select) or len(plan) < len(planned_files(repo, []))
    # A file run alone has the same per-file results as in a whole run (--resume shares them);
    # a -k run keeps its own, so it never replaces those of the last whole run.
    junit_dir = out / ("upstream-test-subset" if select else "upstream-test")
    results, unavailable = [], []
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        summary = materialize(repo, tree).summary()
        digest = tree_digest(tree)
        torch_git = installed_torch().git_version
        print(f"torch-overlay upstream-test: {summary}; test files from {root}", flush=True)
        for test_file, mapped_select in plan:
            if not (root / test_file).is_file():
                unavailable.append(test_file)
                continue
            chosen = combine_selections(mapped_select, select)
            print(f"{test_file}" + (f" -k '{chosen}'" if chosen else ""), flush=True)
            test_sha = sha256((root / test_file).read_bytes())
            stock_key = {"torch": torch_git, "test": test_sha, "select": chosen,
                         "timeout": timeout, "test_timeout": test_timeout}  # fmt: skip
            keys = {"stock": stock_key, "overlay": {**stock_key, "overlay": digest}}
            results.append(run_file(root, test_file, chosen, tree, junit_dir, timeout,
                                    test_timeout, keys, resume))  # fmt: skip
            # After every file, so a run that is stopped still leaves what it found.
            pending = [f for f, _ in plan[plan.index((test_file, mapped_select)) + 1 :]]
            write_report(digest, out, root, origin, results, unavailable, pending, narrowed,
                         quiet=True)  # fmt: skip
    regressions = write_report(digest, out, root, origin, results, unavailable, [], narrowed)
    return 1 if regressions else 0
