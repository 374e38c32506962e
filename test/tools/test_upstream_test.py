# Owner(s): ["module: tools"]
"""`torch-overlay upstream-test` on a scratch series and a fake upstream test tree: stock vs
overlay outcomes per test from junit XML, regressions fail the gate, hangs do not stall it."""

import io
import json
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

from test_overlay_tools import GOOD_MESSAGE, TARGET, OverlayProject
from torch.testing._internal.common_utils import TestCase, run_tests

from tools.base import OverlayError
from tools.export import export
from tools.sync import sync
from tools.upstream_test import FAILED, PASSED, outcomes, upstream_test
from tools.verify import age, gates

UPSTREAM_TEST = "test/distributed/pipelining/test_backward.py"
# Stands in for an upstream test file: what each test does depends on the overlay's marker.
FAKE_TESTS = """
import time, unittest
import torch.distributed.pipelining._backward as backward

PATCHED = hasattr(backward, "OVERLAY_MARKER")

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
        # On both (a stored upstream version newer than the base): counted, not a regression.
        code, report, printed = self.gate(prelude="from torch import no_such_name\n")
        self.assertEqual(code, 0)
        self.assertIn("does not import: ImportError: cannot import name 'no_such_name'",
                      report["files"][0]["problems"]["stock"])  # fmt: skip
        # Only with the overlay: every test that passed on stock is lost.
        code, report, _ = self.gate(prelude="if PATCHED:\n    raise ImportError('patched')\n")
        self.assertEqual(code, 1)
        self.assertEqual(len(report["files"][0]["regressions"]), 3)

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
