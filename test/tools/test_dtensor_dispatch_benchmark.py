# Owner(s): ["module: tools"]
"""Smoke test of benchmarks/dtensor_dispatch.py: it runs and writes its report.

Only the report's shape is checked; what the numbers say belongs to the benchmark.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = REPO_ROOT / "benchmarks" / "dtensor_dispatch.py"
ROWS = ["fill_(1.5) S(0), same scalar", "Adam.step R param, P(sum) grad"]


class DTensorDispatchBenchmarkTest(TestCase):
    def test_quick_run_writes_report(self):
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "report.json"
            command = [sys.executable, BENCHMARK, "--quick", "--out", out]
            for row in ROWS:
                command += ["--only", row]
            proc = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
            )
            self.assertEqual(proc.returncode, 0, proc.stderr)
            report = json.loads(out.read_text())

        self.assertEqual([row["name"] for row in report["rows"]], ROWS)
        for row in report["rows"]:
            self.assertIsInstance(row["ratio"], float)
            for label in ("stock", "overlay"):
                result = row[label]
                self.assertGreater(result["median_us"], 0)
                self.assertEqual(len(result["iqr_us"]), 2)
                self.assertIsInstance(result["collectives"], dict)
                self.assertIsInstance(result["bytes"], int)
                self.assertIsInstance(result["cache_growth_per_call"], float)
        self.assertIn(report["worst"]["row"], ROWS)
        self.assertIsInstance(report["worst"]["ratio"], float)
        for label in ("stock", "overlay"):
            self.assertIsInstance(report["caches"][label]["native_fast_path"], int)


if __name__ == "__main__":
    run_tests()
