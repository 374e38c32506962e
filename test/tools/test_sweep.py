# Owner(s): ["module: tools"]
"""`torch-overlay sweep`: one process per batch of ops, a crash or a hang costs only its
op, and the report pairs each flagged rule's stock and overlay verdicts; `--missing`
reports the rules DTensor lacks; the validator's limits the README states are pinned."""

import inspect
import json
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.fake_pg import FakeStore

from tools import cli, mutations
from tools.active import environment
from tools.sweep import (
    ISSUE25_CASES,
    MARK,
    configs_markdown,
    failures,
    mutation_summary,
    ops_without_rule,
    rows,
    run_batch,
    summary,
    sweep,
    sweep_missing,
    sweep_mutations,
)

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

# Stands in for the --missing worker: records the ops it runs, reports one missing rule.
FAKE_MISSING_WORKER = f"""
import json, sys
ops = sys.argv[sys.argv.index("--") + 1 :]
with open(sys.argv[1], "a") as log:
    log.write(" ".join(ops) + "\\n")
for op in ops:
    rule = f"aten.{{op}}.default: R -> P(max)"
    result = {{"op": op, "status": "ok", "samples": 1, "correct": 0, "incorrect": {{}},
              "missing": {{rule: "shapes []"}}, "valid": [rule], "claimed": []}}
    print({MARK!r} + json.dumps(result), flush=True)
"""

# Stands in for the sweep's worker: logs each process's items ("dtype/op"), reports each
# item's dtype in its one incorrect rule.
FAKE_ITEM_WORKER = f"""
import json, sys
items = sys.argv[sys.argv.index("--") + 1 :]
with open(sys.argv[1], "a") as log:
    log.write(" ".join(items) + "\\n")
for item in items:
    rule = "aten.x.default: " + item.split("/")[0] + " -> R"
    result = {{"op": item, "status": "ok", "samples": 1, "correct": 0,
              "incorrect": {{rule: "shapes []"}}, "skips": {{}}}}
    print({MARK!r} + json.dumps(result), flush=True)
"""

# Stands in for the --mutations worker: kills every entry, says the world size it was given.
FAKE_MUTATION_WORKER = f"""
import json, sys
ws = [a for a in sys.argv if a.startswith("--world-size=")][0].split("=")[1]
for entry_id in sys.argv[sys.argv.index("--") + 1 :]:
    result = {{"op": entry_id, "status": "ok", "verdict": "killed", "world_size": int(ws)}}
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


class SweepBatchAndResumeTest(TestCase):
    def test_dtypes_share_a_process_and_resume_keeps_stock(self):
        # Every dtype of a batch runs in one worker process (one import of torch per
        # variant, not one per dtype); --resume keeps stock's results while stock's
        # torch and worker are the same, and the overlay's while its files are.
        with tempfile.TemporaryDirectory() as scratch:
            worker, log = Path(scratch) / "worker.py", Path(scratch) / "ran.txt"
            worker.write_text(FAKE_ITEM_WORKER)
            out = Path(scratch) / "reports"
            fake = [sys.executable, str(worker), str(log)]

            def run():
                sweep(REPO, out, dtypes=["float32", "int64"], only=["a", "b"], jobs=1,
                      resume=True, command=fake)  # fmt: skip
                return json.loads((out / "sweep.json").read_text())

            first = run()
            self.assertEqual(log.read_text().splitlines(),
                             ["float32/a int64/a float32/b int64/b"] * 2)  # fmt: skip
            self.assertEqual(first["processes"], {"stock": 1, "overlay": 1})
            self.assertTrue(first["complete"])
            self.assertEqual(first["summary"]["overlay"]["int64"]["incorrect_rules"], 2)
            self.assertEqual(
                set(first["results"]["stock"]["int64"]["b"]["incorrect"]),
                {"aten.x.default: int64 -> R"},
            )
            self.assertEqual(first["results"]["stock"]["int64"]["b"]["op"], "b")
            run()  # the same stock and overlay: nothing runs
            self.assertEqual(len(log.read_text().splitlines()), 2)
            # Other overlay files: only the overlay runs again.
            first["overlay_files"] = "other"
            (out / "sweep.json").write_text(json.dumps(first))
            third = run()
            self.assertEqual(len(log.read_text().splitlines()), 3)
            self.assertEqual(third["rows"], first["rows"])
            # Another stock (torch or worker): stock runs again, the overlay is kept.
            third["stock_key"] = "other"
            (out / "sweep.json").write_text(json.dumps(third))
            run()
            self.assertEqual(len(log.read_text().splitlines()), 4)


class MutationWorldSizeTest(TestCase):
    # `sweep --mutations --world-size 3` ran the corpus at the corpus's world size (2).
    def test_world_size_reaches_the_workers_and_the_report(self):
        corpus = mutations.load()
        with tempfile.TemporaryDirectory() as scratch:
            worker, path = Path(scratch) / "worker.py", Path(scratch) / "corpus.json"
            worker.write_text(FAKE_MUTATION_WORKER)
            path.write_text(json.dumps({**corpus, "entries": corpus["entries"][:2]}))
            code = sweep_mutations(
                REPO, Path(scratch), corpus_path=path, jobs=1,
                command=[sys.executable, str(worker)], world_size=3,
            )  # fmt: skip
            report = json.loads((Path(scratch) / "sweep-mutations.json").read_text())
            text = (Path(scratch) / "sweep-mutations.md").read_text()
        self.assertEqual(code, 0)
        self.assertEqual(corpus["world_size"], 2)
        self.assertEqual(report["settings"]["world_size"], 3)
        self.assertIn("world size 3", text)
        for variant in ("stock", "overlay"):
            seen = {r["world_size"] for r in report["results"][variant].values()}
            self.assertEqual(seen, {3}, variant)

    def test_cli_passes_world_size(self):
        with mock.patch("tools.sweep.sweep_mutations", return_value=0) as run:
            code = cli.main(["--repo", str(REPO), "sweep", "--mutations", "--jobs", "1",
                             "--world-size", "3", "--out", str(REPO / "reports")])  # fmt: skip
        self.assertEqual(code, 0)
        self.assertEqual(run.call_args.kwargs["world_size"], 3)


class ConfigsMarkdownTest(TestCase):
    # sweep.md (issue 25's "Done when"): per configuration and dtype the incorrect rules,
    # then every rule the overlay still calls incorrect and every op it could not run,
    # and, when the out dir has sweep-mutations.json, the kill rate per family stock vs
    # overlay and each side's verdict on issue 25's cases.
    def test_overlay_rows_failures_and_mutation_kill_rate(self):
        rule = "aten.div.Tensor: P(sum), R -> P(sum)"
        results = {
            "stock": {"bool": {
                "div": {"op": "div", "status": "ok", "samples": 1, "incorrect": {rule: "shapes []"}},
                "norm": {"op": "norm", "status": "ok", "samples": 1, "incorrect": {}},
            }},
            "overlay": {"bool": {
                "div": {"op": "div", "status": "ok", "samples": 1, "incorrect": {rule: "shapes []"}},
                "norm": {"op": "norm", "status": "crash", "detail": "exit -11"},
            }},
        }  # fmt: skip
        config = {"settings": {"dtypes": ["bool"]}, "summary": summary(results),
                  "rows": rows(results), "failures": failures(results), "results": results,
                  "complete": True, "ops": ["div", "norm"], "seconds": 1.0,
                  "cpu_s": {"stock": 1.0, "overlay": 1.0}}  # fmt: skip
        corpus = mutations.load()
        cases = {"entries": [e for e in corpus["entries"] if e["id"] in ISSUE25_CASES]}
        self.assertEqual(len(cases["entries"]), 5)
        killed = {"verdict": "killed", "origin_reported": False}
        kills = {
            "stock": {e["id"]: killed for e in cases["entries"]},
            "overlay": {e["id"]: killed for e in cases["entries"] if e["id"] != "review-gcd"},
        }
        mutation_report = {"rules": 5, "settings": {"world_size": 2}, "overlay_files": "f" * 64,
                           "kill_rate": mutation_summary(cases, kills), "results": kills,
                           "lost": [["review-gcd", "trial 0"]]}  # fmt: skip
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch)
            (out / "sweep-1d-2.json").write_text(json.dumps(config))
            text = configs_markdown(out, ["1d-2"])
            self.assertNotIn("sweep --mutations", text)  # no mutation report: no section
            (out / "sweep-mutations.json").write_text(json.dumps(mutation_report))
            text = configs_markdown(out, ["1d-2"])
        self.assertIn(f"| 1d-2 | div | bool | `{rule}` | incorrect | shapes [] "
                      "| open: no stated reason |", text)  # fmt: skip
        self.assertIn("| 1d-2 | norm | bool | (not run: crash) | | exit -11 | open |", text)
        # binary (add outlier, gcd): the overlay kills 1 of the 2 stock kills
        self.assertIn("| binary | 2 | 2 | 1 | 2 | 1 | NO |", text)
        # the bool cases are wrong on other inputs of the sample's shapes (witness trial 2/3)
        self.assertIn("| reduction | 3 | 3 | 3 | 0 | 0 | yes |", text)
        self.assertIn("| `review-gcd` | aten.gcd.default | int64 | `P(product), R -> P(product)` "
                      "| killed | not run |", text)  # fmt: skip
        self.assertIn("with signal): 1; `review-gcd`.", text)


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

    def test_add_missing_stock_vs_overlay(self):
        # The validator's full mode on one op and one sample (0-d operands): both sides
        # lack add's R, P(max) -> P(max) (a + max(b) = max(a + b)); stock's ground truth
        # also finds the wrong P(max), P(min) -> P(avg) valid (its Partial inputs make
        # max(a) + min(b) equal the mean on that sample), the overlay's does not.
        with tempfile.TemporaryDirectory() as out:
            code = sweep_missing(REPO, Path(out), ["1d-2"], only=["add"], dtypes=["float32"],
                                 max_samples=1, without_rule=False)  # fmt: skip
            report = json.loads((Path(out) / "sweep-missing-1d-2.json").read_text())
            combined = json.loads((Path(out) / "sweep-missing.json").read_text())
            self.assertIn("| 1d-2 | float32 |", (Path(out) / "sweep-missing.md").read_text())
        self.assertEqual(code, 0)
        self.assertEqual(list(combined["configs"]), ["1d-2"])
        stock = report["results"]["stock"]["float32"]["add"]
        overlay = report["results"]["overlay"]["float32"]["add"]
        both = "aten.add.Tensor: R, P(max) -> P(max)"
        wrong = "aten.add.Tensor: P(max), P(min) -> P(avg)"
        self.assertIn(both, stock["missing"])
        self.assertIn(both, overlay["missing"])
        self.assertIn(wrong, stock["missing"])
        self.assertNotIn(wrong, overlay["valid"])
        by_rule = {r["rule"]: (r["stock"], r["overlay"]) for r in report["rows"]}
        self.assertEqual(by_rule[both], ("missing", "missing"))
        self.assertEqual(by_rule[wrong], ("missing", "not valid"))
        # Claimed and valid on both sides: S(0), S(0) -> S(0) is no missing rule.
        self.assertNotIn("aten.add.Tensor: S(0), S(0) -> S(0)", by_rule)

    def test_missing_resume_adds_up_ops_pieces(self):
        # --missing --resume: a second --ops piece runs only its own ops and the report
        # holds both pieces.
        with tempfile.TemporaryDirectory() as scratch:
            worker, log = Path(scratch) / "worker.py", Path(scratch) / "ran.txt"
            worker.write_text(FAKE_MISSING_WORKER)
            out = Path(scratch) / "reports"
            fake = [sys.executable, str(worker), str(log)]
            for ops in (["a", "b"], ["b", "c"]):
                sweep_missing(REPO, out, ["1d-2"], only=ops, dtypes=["float32"],
                              resume=True, without_rule=False, command=fake)  # fmt: skip
            report = json.loads((out / "sweep-missing-1d-2.json").read_text())
            ran = log.read_text().split()
        self.assertEqual(sorted(ran), ["a", "a", "b", "b", "c", "c"])  # stock and overlay
        self.assertEqual(report["ops"], ["a", "b", "c"])
        self.assertEqual(report["summary"]["overlay"]["float32"]["missing_rules"], 3)
        self.assertEqual(
            {(r["op"], r["stock"], r["overlay"]) for r in report["rows"]},
            {("a", "missing", "missing"), ("b", "missing", "missing"),
             ("c", "missing", "missing")},
        )  # fmt: skip


class OpsWithoutRuleTest(TestCase):
    def test_registration_kinds(self):
        kinds = ops_without_rule()
        self.assertIn("add", kinds["rule"])
        self.assertIn("masked_select", kinds["no rule"])  # data-dependent output size
        self.assertIn("nn.functional.conv2d", kinds["composite"])  # decomposes to convolution
        names = [n for names in kinds.values() for n in names]
        self.assertEqual(len(names), len(set(names)))


class ValidatorLimitsTest(TestCase):
    """What the README says the validator cannot check, so no configuration claims it
    (tools/sweep.py UNSUPPORTED). Each test fails once the validator lifts the limit;
    the sweep should then use it. Run on stock (plain pytest) and with the overlay
    (`tools.cli run -- pytest`): the validator PRs keep both limits."""

    WORLD_SIZE = 4

    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=self.WORLD_SIZE)

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def check(self, args, combination, mesh_shape):
        add = torch.ops.aten.add.Tensor
        truth = sv._to_ground_truth(add(*args))
        with LocalTensorMode(frozenset(range(self.WORLD_SIZE))):
            mesh = init_device_mesh("cpu", mesh_shape)
            return sv.validate_aten_combination(
                add, args, {}, truth, combination, self.WORLD_SIZE, mesh
            )

    def test_uneven_shard_is_untestable(self):
        # add's S(0), S(0) -> S(0) is right for any size; on 4 ranks the validator
        # checks it for 8 elements and calls it untestable for 6 (DTensor: 2, 2, 2, 0).
        rule = ((Shard(0), Shard(0)), (Shard(0),))
        even = (torch.randn(8), torch.randn(8))
        uneven = (torch.randn(6), torch.randn(6))
        self.assertEqual(self.check(even, rule, (4,)), (True, ""))
        self.assertEqual(self.check(uneven, rule, (4,)), (None, "uneven shard"))

    def test_2d_mesh_rule_is_not_checked(self):
        # A right rule on a 2x2 mesh (add, both operands and the output Shard(0) on mesh
        # dim 0 and Shard(1) on mesh dim 1) is not judged: the validator takes one
        # placement per tensor and builds the DTensor of a 1-D placement.
        x, y = torch.randn(4, 4), torch.randn(4, 4)
        per_dim = (Shard(0), Shard(1))
        valid, message = self.check((x, y), ((per_dim, per_dim), (per_dim,)), (2, 2))
        self.assertFalse(valid)
        self.assertIn("placements", message)
        # compare_operator takes a world size, not a mesh shape ...
        params = inspect.signature(sv.compare_operator).parameters
        self.assertIn(params["world_size"].annotation, (int, "int"))
        self.assertFalse({"mesh", "mesh_shape", "device_mesh"} & set(params))
        # ... and DTensor's rules are queried per single mesh dim: one placement each
        # for the output and the two operands, never a placement per mesh dim.
        rules = sv.query_single_dim_strategy(torch.ops.aten.add.Tensor, (x, y), {})
        self.assertTrue(rules)
        for rule in rules:
            self.assertEqual(len(rule), 3)
            for placement in rule:
                self.assertNotIsInstance(placement, (tuple, list))


if __name__ == "__main__":
    run_tests()
