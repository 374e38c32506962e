# Owner(s): ["module: tools"]
"""`torch-overlay upstream-test` on a scratch series and a fake upstream test tree: stock vs
overlay outcomes per test from junit XML, regressions fail the gate, hangs do not stall it."""

import http.server
import io
import json
import shutil
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

from test_overlay_tools import GOOD_MESSAGE, REPO_ROOT, TARGET, OverlayProject, snapshot
from torch.testing._internal.common_utils import TestCase, run_tests

from tools.base import PIN_FILE, OverlayError, sha256
from tools.cli import main
from tools.export import export
from tools.fetch_upstream_tests import fetch
from tools.sync import sync
from tools.upstream_test import FAILED, PASSED, outcomes, read_manifest, upstream_test
from tools.verify import age, gates

UPSTREAM_TEST = "test/distributed/pipelining/test_backward.py"
# Stands in for an upstream test file: what each test does depends on the overlay's marker.
# It reads the marker from the overlay tree the variant runs with (TORCH_OVERLAY_ACTIVE)
# instead of importing torch: each gate runs it twice, and importing torch is most of a run's
# time. That the import hook serves that tree to torch's importers is test_overlay_tools'.
FAKE_TESTS = """
import os, pathlib, time, unittest

TREE = os.environ.get("TORCH_OVERLAY_ACTIVE")
BACKWARD = pathlib.Path(TREE or ".", "torch/distributed/pipelining/_backward.py")
PATCHED = bool(TREE) and "OVERLAY_MARKER" in BACKWARD.read_text()

class Probe(unittest.TestCase):
    def test_same_everywhere(self):
        pass

    def test_broken_by_patch(self):
        self.assertFalse(PATCHED)

    def test_fixed_by_patch(self):
        self.assertTrue(PATCHED)

    def test_fails_on_both(self):
        self.fail("upstream's own failure")

    @unittest.skip("CUDA only")
    def test_skipped_on_both(self):
        pass

    def test_hangs_with_patch(self):
        if PATCHED and HANG:
            time.sleep(120)
"""


COMMIT = json.loads((REPO_ROOT / PIN_FILE).read_text())["git_version"]


def serve(test: TestCase, files: dict[str, bytes | tuple[bytes, int]], requests: list[str]) -> str:
    """Serve ``files`` (URL path -> body, or (body, Content-Length to claim)) on 127.0.0.1 from
    a thread that stops at the test's end or by itself after 60 s; returns the base URL and
    logs each request."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            if self.path not in files:
                self.send_error(404)
                return
            body = files[self.path]
            body, length = body if isinstance(body, tuple) else (body, len(body))
            self.send_response(200)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(body)  # HTTP/1.0: the connection closes after it

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 0.2
    deadline, stop = time.monotonic() + 60, threading.Event()

    def loop():
        while not stop.is_set() and time.monotonic() < deadline:
            server.handle_request()
        server.server_close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    test.addCleanup(thread.join, 5)
    test.addCleanup(stop.set)
    return f"http://127.0.0.1:{server.server_address[1]}/pytorch/pytorch"


class UpstreamTestTest(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="upstream-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        (self.tmp / "project").mkdir()
        self.project = OverlayProject(self.tmp / "project")
        (self.tmp / "project" / "patches" / "upstream.json").write_text(
            json.dumps({"tests": {TARGET: [UPSTREAM_TEST]}, "select": {}, "issues": {}})
        )
        sync(self.project.root)
        self.project.commit_edit(
            TARGET, "import collections", 'OVERLAY_MARKER = "hello"\nimport collections',
            GOOD_MESSAGE,
        )  # fmt: skip
        self.tests = self.tmp / "upstream"
        (self.tests / UPSTREAM_TEST).parent.mkdir(parents=True)

    def gate(self, hang: bool = False, prelude: str = "", **kwargs) -> tuple[int, dict, str]:
        (self.tests / UPSTREAM_TEST).write_text(f"HANG = {hang}\n{FAKE_TESTS}{prelude}")
        out = self.tmp / "reports"
        with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
            code = upstream_test(self.project.root, tests=self.tests, out=out, **kwargs)
        # A narrowed run has its own report; the whole run's stays as it was.
        name = "upstream-test-subset" if kwargs.get("select") else "upstream-test"
        return code, json.loads((out / f"{name}.json").read_text()), printed.getvalue()

    def test_reports_regressions_and_fixes_per_test(self):
        code, report, printed = self.gate()
        self.assertEqual(code, 1)
        [result] = report["files"]
        self.assertEqual(result["stock"], {"passed": 3, "failed": 2, "skipped": 1})
        self.assertEqual(result["overlay"], {"passed": 3, "failed": 2, "skipped": 1})
        self.assertEqual([t.rsplit("::", 1)[1] for t in result["regressions"]],
                         ["test_broken_by_patch"])  # fmt: skip
        self.assertEqual([t.rsplit("::", 1)[1] for t in result["fixed"]], ["test_fixed_by_patch"])
        self.assertIn("1 regression(s), 1 fixed", printed)
        self.assertIn("REGRESSION test/distributed/pipelining/test_backward.py::", printed)
        # Tests that fail or skip on both are counted, never listed.
        self.assertNotIn("test_fails_on_both", printed)
        self.assertNotIn("test_skipped_on_both", printed)

    def test_verify_shows_the_regressions_until_the_series_changes(self):
        self.gate()
        [tests, lint, benchmark] = gates(self.project.root, self.tmp / "reports")
        self.assertFalse(tests["ok"])
        self.assertEqual([t.rsplit("::", 1)[1] for t in tests["regressions"]],
                         ["test_broken_by_patch"])  # fmt: skip
        self.assertIn("not run: python benchmarks/dtensor_dispatch.py", benchmark["detail"])
        whole = (self.tmp / "reports" / "upstream-test.json").read_bytes()
        # A narrowed run writes its own report: the gate row stays on the last whole run.
        self.gate(select="not broken_by_patch")
        self.assertEqual((self.tmp / "reports" / "upstream-test.json").read_bytes(), whole)
        [tests, *_] = gates(self.project.root, self.tmp / "reports")
        self.assertFalse(tests["ok"])
        self.assertRegex(tests["detail"], r"^last whole run \d+ min ago: 1 file\(s\) run, 1 regr")
        self.assertIn("; a later narrowed run (", tests["detail"])
        self.assertIn("0 regression(s), 1 fixed", tests["detail"])
        # Without a regression the gate passes only when every test file was compared.
        self.gate(prelude="from torch import no_such_name\n")
        [tests, *_] = gates(self.project.root, self.tmp / "reports")
        self.assertIsNone(tests["ok"])
        self.assertIn(f"not compared: {UPSTREAM_TEST}", tests["detail"])
        self.gate()
        export(self.project.root)  # a message or an export alone changes no overlay file
        self.assertFalse(gates(self.project.root, self.tmp / "reports")[0]["ok"])
        self.project.commit_edit(TARGET, "import collections", "import collections  # edit",
                                 GOOD_MESSAGE)  # fmt: skip
        [tests, *_] = gates(self.project.root, self.tmp / "reports")
        self.assertIsNone(tests["ok"])
        # Stale, and still the last whole run's verdict with its age.
        self.assertRegex(tests["detail"], r"^stale \(made with other overlay files\): last whole "
                         r"run \d+ min ago: 1 file\(s\) run, 1 regression")  # fmt: skip

    def test_selection_narrows_the_run(self):
        code, report, _ = self.gate(select="not broken_by_patch")
        self.assertEqual(code, 0)
        self.assertEqual(report["fixed"], 1)
        self.assertEqual(report["files"][0]["stock"]["passed"], 2)
        # --resume reuses each variant's result while what decides it is the same: the
        # stock run survives a change of the overlay, the overlay run does not.
        code, again, printed = self.gate(select="not broken_by_patch", resume=True)
        self.assertEqual(printed.count(" s, reused)"), 2)
        self.assertEqual((code, again["files"][0]["fixed"]), (0, report["files"][0]["fixed"]))
        self.project.commit_edit(TARGET, "import collections", "import collections  # edit",
                                 GOOD_MESSAGE)  # fmt: skip
        code, _, printed = self.gate(select="not broken_by_patch", resume=True)
        self.assertIn(" s, reused)", printed.split("  overlay:")[0])
        self.assertNotIn("reused", printed.split("  overlay:")[1])

    def test_a_hanging_test_is_a_regression_not_a_stalled_run(self):
        code, report, _ = self.gate(hang=True, select="hangs", test_timeout=5)
        self.assertEqual(code, 1)
        self.assertEqual([t.rsplit("::", 1)[1] for t in report["files"][0]["regressions"]],
                         ["test_hangs_with_patch"])  # fmt: skip
        # A whole file past its limit is killed; everything it passed on stock is lost.
        code, report, printed = self.gate(hang=True, select="hangs", timeout=15,
                                          test_timeout=100)  # fmt: skip
        self.assertEqual(code, 1)
        self.assertIn("timed out after 15 s", report["files"][0]["problems"]["overlay"])

    def test_a_file_that_does_not_import(self):
        # On both (a test file from a commit newer than the base): counted, not a regression.
        code, report, printed = self.gate(prelude="from torch import no_such_name\n")
        self.assertEqual(code, 0)
        self.assertIn("does not import: ImportError: cannot import name 'no_such_name'",
                      report["files"][0]["problems"]["stock"])  # fmt: skip
        # Only with the overlay: every test that passed on stock is lost.
        code, report, _ = self.gate(prelude="if PATCHED:\n    raise ImportError('patched')\n")
        self.assertEqual(code, 1)
        self.assertEqual(len(report["files"][0]["regressions"]), 3)

    def test_the_gate_runs_from_a_fetched_cache(self):
        helper = "test/distributed/pipelining/probe_helpers.py"
        tree = {UPSTREAM_TEST: f"from probe_helpers import HANG\n{FAKE_TESTS}".encode(),
                helper: b"HANG = False\n"}  # fmt: skip
        url = serve(self, {f"/pytorch/pytorch/{COMMIT}/{p}": d for p, d in tree.items()}, [])
        fetch(self.project.root, base=url)
        out = self.tmp / "reports"
        with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
            self.assertEqual(upstream_test(self.project.root, out=out), 1)
        [result] = json.loads((out / "upstream-test.json").read_text())["files"]
        self.assertEqual((result["repo"], result["commit"]), ("pytorch/pytorch", COMMIT))
        self.assertEqual([t.rsplit("::", 1)[1] for t in result["regressions"]],
                         ["test_broken_by_patch"])  # fmt: skip
        self.assertIn(f"| {UPSTREAM_TEST} | pytorch/pytorch@{COMMIT[:12]} |", printed.getvalue())

    def test_a_test_reported_twice_keeps_its_worst_outcome(self):
        junit = self.tmp / "junit.xml"
        junit.write_text(
            '<testsuites><testsuite><testcase classname="a.T" name="test_x"><failure/>'
            '</testcase><testcase classname="a.T" name="test_x"><skipped/></testcase>'
            '<testcase classname="a.T" name="test_y"/></testsuite></testsuites>'
        )
        self.assertEqual(outcomes(junit), {"T::test_x": FAILED, "T::test_y": PASSED})

    def test_refuses_without_test_files_and_reports_missing_ones(self):
        with self.assertRaisesRegex(OverlayError, "no upstream test files"):
            upstream_test(self.project.root)
        empty = self.tmp / "empty"
        (empty / "test").mkdir(parents=True)
        with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
            self.assertEqual(upstream_test(self.project.root, tests=empty, out=self.tmp / "r"), 0)
        self.assertIn("0 file(s) run, 1 not available", printed.getvalue())


SCHEDULE = "test/distributed/pipelining/test_schedule.py"
AOTDISPATCH = "test/functorch/test_aotdispatch.py"
# A small upstream tree at the base commit: two mapped files and the test-local modules they
# import, found beside the file (model_registry) or under test/ (functorch.common_utils).
TREE = {
    SCHEDULE: b"import os\nimport numpy\nimport torch.nn\nfrom model_registry import MLP\n"
    b"from functorch.common_utils import skip\n",
    "test/distributed/pipelining/model_registry.py": b"from helpers import ONE\nMLP = ONE\n",
    "test/helpers.py": b"ONE = 1\n",
    "test/functorch/common_utils.py": b"import unittest\nskip = unittest.skip\n",
    AOTDISPATCH: b"from common_utils import skip\n",
}


class FetchTest(TestCase):
    """`upstream-test --fetch` against a local server: no torch is imported."""

    def setUp(self):
        super().setUp()
        self.root = Path(tempfile.mkdtemp(prefix="fetch-upstream-"))
        self.addCleanup(shutil.rmtree, self.root)
        (self.root / "patches").mkdir()
        (self.root / PIN_FILE).write_text(json.dumps({"torch_version": "2.15.0",
                                                      "git_version": COMMIT, "files": {}}))  # fmt: skip
        mapped = {"tests": {"torch/a.py": [SCHEDULE], "torch/b.py": [AOTDISPATCH, SCHEDULE]}}
        (self.root / "patches/upstream.json").write_text(json.dumps(mapped))
        self.cache = self.root / ".upstream-tests"
        self.served = {f"/pytorch/pytorch/{COMMIT}/{path}": data for path, data in TREE.items()}
        self.requests = []
        self.url = serve(self, self.served, self.requests)

    def test_fetch_fills_the_cache_with_a_manifest(self):
        command = ["--repo", str(self.root), "upstream-test", "--fetch", "--from", self.url]
        with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
            self.assertEqual(main(command), 0)
        self.assertIn("2 mapped test file(s) and 3 module(s) they import", printed.getvalue())
        lines = (self.cache / "manifest.jsonl").read_text().splitlines()
        self.assertEqual([json.loads(line) for line in lines], [
            {"repo": "pytorch/pytorch", "commit": COMMIT, "path": path, "bytes": len(TREE[path]),
             "sha256": sha256(TREE[path])} for path in sorted(TREE)
        ])  # fmt: skip
        self.assertEqual({p: d for p, d in snapshot(self.cache).items() if p != "manifest.jsonl"},
                         TREE)  # fmt: skip
        # torch and the standard library are never looked for; other imports beside the file,
        # then under test/ (a 404 there only means "not test-local").
        asked = [r.split(COMMIT + "/", 1)[1] for r in self.requests]
        self.assertFalse([r for r in asked if "torch" in r.split("/")[-1] or "os.py" in r])
        self.assertIn("test/distributed/pipelining/numpy.py", asked)
        self.assertIn("test/numpy.py", asked)
        self.assertEqual(len(asked), len(set(asked)))
        self.assertEqual(list(self.root.glob(".upstream-tests.*")), [])  # no scratch left

    def test_bad_downloads_are_refused_and_change_nothing(self):
        fetch(self.root, base=self.url)
        before = snapshot(self.cache)
        good = dict(self.served)
        schedule = f"/pytorch/pytorch/{COMMIT}/{SCHEDULE}"
        cases = {
            "not found": lambda: self.served.pop(schedule),
            "truncated: 5 of 105 bytes received": lambda: self.served.update(
                {schedule: (b"x = 1", 105)}),
            # The same repo, commit and path as the manifest records, other bytes.
            "wrong hash: sha256": lambda: self.served.update({schedule: b"x = 2\n"}),
            "not a Python file": lambda: self.served.update(
                {schedule: TREE[SCHEDULE] + b"<html>"}),
        }  # fmt: skip
        for message, breakage in cases.items():
            self.served.clear()
            self.served.update(good)
            breakage()
            with self.assertRaises(OverlayError) as caught:
                fetch(self.root, base=self.url)
            self.assertIn(message, str(caught.exception))
            self.assertNotIn("\n", str(caught.exception))
            self.assertEqual(snapshot(self.cache), before)
            self.assertEqual(list(self.root.glob(".upstream-tests.*")), [])
        # A fork's files are never fetched.
        with self.assertRaisesRegex(OverlayError, "only pytorch/pytorch's files are fetched"):
            fetch(self.root, base="https://raw.githubusercontent.com/someone/pytorch")

    def test_expect_checks_a_first_fetch(self):
        fetch(self.root, base=self.url)
        expect = self.root / "expected.jsonl"
        shutil.move(self.cache / "manifest.jsonl", expect)
        shutil.rmtree(self.cache)
        self.served[f"/pytorch/pytorch/{COMMIT}/test/helpers.py"] = b"ONE = 2\n"
        with self.assertRaisesRegex(OverlayError, "test/helpers.py: wrong hash"):
            fetch(self.root, base=self.url, expect=expect)
        self.assertFalse(self.cache.exists())

    def test_fetch_from_a_checkout(self):
        src = self.root / "pytorch"
        for path, data in TREE.items():
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            (src / path).write_bytes(data)
        run = lambda *args: subprocess.run(["git", *args], cwd=src, check=True,  # noqa: E731
                                           capture_output=True, text=True).stdout  # fmt: skip
        run("init", "-q")
        run("add", ".")
        run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
        commit = run("rev-parse", "HEAD").strip()
        with self.assertRaisesRegex(OverlayError, f"does not have the base commit {COMMIT[:12]}"):
            fetch(self.root, pytorch_src=src)
        (self.root / PIN_FILE).write_text(json.dumps({"torch_version": "2.15.0",
                                                      "git_version": commit, "files": {}}))  # fmt: skip
        (src / SCHEDULE).write_text("uncommitted edits are not read\n")
        fetch(self.root, pytorch_src=src)
        self.assertEqual((self.cache / SCHEDULE).read_bytes(), TREE[SCHEDULE])
        self.assertEqual({e["commit"] for e in read_manifest(self.cache / "manifest.jsonl").values()},
                         {commit})  # fmt: skip

    def test_a_cache_that_does_not_match_its_manifest_runs_nothing(self):
        fetch(self.root, base=self.url)
        manifest = self.cache / "manifest.jsonl"
        good = manifest.read_text()
        out = self.root / "reports"
        for breakage, message in (
            (lambda: (self.cache / "test/helpers.py").write_text("ONE = 3\n"),
             "test/helpers.py differs from its manifest.jsonl entry; re-fetch"),
            (lambda: (self.cache / "test/extra.py").write_text(""),
             "test/extra.py is not in manifest.jsonl; re-fetch"),
            # The first format: no repo, a length without a unit.
            (lambda: manifest.write_text(json.dumps({"path": SCHEDULE, "commit": COMMIT,
                                                     "length": 3, "sha256": "0" * 64}) + "\n"),
             "manifest.jsonl:1: not an entry of this format (keys: repo, commit, path, bytes, "
             "sha256); re-fetch the files with `torch-overlay upstream-test --fetch`"),
        ):  # fmt: skip
            shutil.rmtree(self.cache)
            fetch(self.root, base=self.url)
            self.assertEqual(manifest.read_text(), good)
            breakage()
            with self.assertRaises(OverlayError) as caught:
                upstream_test(self.root, out=out)
            self.assertIn(message, str(caught.exception))
            self.assertFalse(out.exists())  # nothing ran, no report


class ReportAgeTest(TestCase):
    """How old `verify` says the last whole upstream-test run is."""

    def test_age(self):
        now = datetime(2026, 1, 2, 12, 0, tzinfo=timezone.utc)
        written = lambda t: {"written": t}  # noqa: E731
        self.assertEqual(age(written("2026-01-02T11:58:30+00:00"), now), "1 min ago")
        self.assertEqual(age(written("2026-01-02T09:00:00.500000+00:00"), now), "2 h ago")
        self.assertEqual(age(written("2025-12-30T12:00:00+00:00"), now), "3 d ago")
        self.assertEqual(age({}), "at an unknown time")


if __name__ == "__main__":
    run_tests()
