# Owner(s): ["module: tools"]
"""`torch-overlay sweep`: one process per batch of ops, a crash or a hang costs only its
op, and the report pairs each flagged rule's stock and overlay verdicts."""

import json
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

from tools.active import environment
from tools.sweep import MARK, rows, run_batch, sweep

REPO = Path(__file__).resolve().parents[2]

# Stands in for the worker: the op's name says what it does.
FAKE_WORKER = f"""
import json, os, sys, time
for op in sys.argv[1:]:
    if op.startswith("crash"):
        sys.stdout.flush()
        os.abort()
    if op.startswith("hang"):
        time.sleep(60)
    result = {{"op": op, "status": "ok", "samples": 1, "correct": 1, "incorrect": {{}}}}
    print({MARK!r} + json.dumps(result), flush=True)
"""


class RunBatchTest(TestCase):
    def test_crash_and_hang_cost_only_their_op(self):
        with tempfile.TemporaryDirectory() as scratch:
            worker = Path(scratch) / "worker.py"
            worker.write_text(FAKE_WORKER)
            ops = ["a", "crash_1", "b", "hang_1", "c"]
            results = run_batch(
                [sys.executable, str(worker)], environment(None), ops,
                op_timeout=2, cwd=Path(scratch), startup_s=5,
            )  # fmt: skip
        self.assertEqual(sorted(results), sorted(ops))
        self.assertEqual({op: results[op]["status"] for op in ops}, {
            "a": "ok", "crash_1": "crash", "b": "ok", "hang_1": "timeout", "c": "ok",
        })  # fmt: skip
        self.assertIn("exit -6", results["crash_1"]["detail"])


class RowsTest(TestCase):
    def test_rule_flagged_on_either_side_is_a_row(self):
        rule = "aten.view.default: S(0) -> S(0)"
        results = {
            "stock": {"float32": {
                "view": {"op": "view", "status": "ok", "incorrect": {rule: "shapes [4]"}},
                "norm": {"op": "norm", "status": "crash", "detail": "exit -6"},
            }},
            "overlay": {"float32": {
                "view": {"op": "view", "status": "ok", "incorrect": {}},
                "norm": {"op": "norm", "status": "ok", "incorrect": {"n: R -> R": "x"}},
            }},
        }  # fmt: skip
        self.assertEqual(
            [(r["op"], r["rule"], r["stock"], r["overlay"]) for r in rows(results)],
            [("norm", "n: R -> R", "crash", "incorrect"),
             ("view", rule, "incorrect", "not flagged")],
        )  # fmt: skip


class SweepTest(TestCase):
    def test_view_stock_vs_overlay(self):
        # The real validator on one op: stock reports view's shard rules incorrect (it
        # runs the local op with the global sizes); the overlay's validator does not.
        with tempfile.TemporaryDirectory() as out:
            code = sweep(REPO, Path(out), dtypes=["float32"], only=["view"], max_samples=2)
            report = json.loads((Path(out) / "sweep.json").read_text())
            self.assertTrue((Path(out) / "sweep.md").is_file())
        stock = report["results"]["stock"]["float32"]["view"]
        overlay = report["results"]["overlay"]["float32"]["view"]
        self.assertEqual(stock["status"], "ok")
        self.assertIn("aten.view.default: S(0) -> S(0)", stock["incorrect"])
        self.assertEqual(overlay["incorrect"], {})
        self.assertGreater(overlay["correct"], stock["correct"])
        self.assertEqual(code, 0)
        self.assertTrue(report["settings"]["narrowed"])


if __name__ == "__main__":
    run_tests()
