# Owner(s): ["oncall: distributed"]
"""The validator checks rules with _NormPartial and _StridedShard placements.

A rule the validator reports incorrect must be wrong, and a wrong rule must be reported."""

from unittest import mock

import torch
import torch.distributed as dist
import torch.testing._internal.common_methods_invocations as common_ops
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._ops._math_ops import _NormPartial
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.testing._internal.opinfo import core as opinfo_core


aten = torch.ops.aten
WORLD_SIZE = 2


class StrategyValidatorTestBase(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
        )

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def check(self, op, args, combination, kwargs=None):
        """Whether the validator finds ``combination`` correct for ``op(*args)``."""
        ground_truth = sv._to_ground_truth(op(*args, **(kwargs or {})))
        with LocalTensorMode(frozenset(range(WORLD_SIZE))):
            mesh = init_device_mesh("cpu", (WORLD_SIZE,))
            valid, message = sv.validate_aten_combination(
                op, args, kwargs or {}, ground_truth, combination, WORLD_SIZE, mesh
            )
        return valid, message


class PrivatePlacementsTest(StrategyValidatorTestBase):
    """_NormPartial and _StridedShard outputs are checked, not reported unparsed."""

    def test_parse(self):
        self.assertEqual(sv.parse_placement("_NormP(2)"), _NormPartial(2))
        self.assertEqual(sv.parse_placement("_NormP(0.5)"), _NormPartial(0.5))
        self.assertEqual(sv.parse_placement("_NormP(inf)"), _NormPartial(float("inf")))
        self.assertEqual(
            sv.parse_placement("_S(0, 4)"), _StridedShard(0, split_factor=4)
        )

    def test_norm_partial_rules_are_checked(self):
        # The sizes the validator's command line sets, so samples shard evenly.
        sizes = {"L": 24, "M": 12, "S": 4, "XS": 2}
        for incorrect_only in (True, False):
            with (
                mock.patch.multiple(common_ops, **sizes),
                mock.patch.multiple(opinfo_core, **sizes),
            ):
                stats = sv.compare_operator(
                    "norm", "cpu", torch.float32, WORLD_SIZE, 6, incorrect_only
                )
            unparsed = [
                d for d in stats.false_positives if "_NormP" in d.output_placements[0]
            ]
            self.assertEqual(unparsed, [])
            by_op = stats.true_positives_by_op
            self.assertGreater(by_op["aten.linalg_vector_norm.default"], 0)

    def test_norm_partial_input_is_checked(self):
        # A _NormPartial input holds norms: the rule is checked on the sample's
        # absolute values (it was untestable, so never reported).
        torch.manual_seed(0)
        v = torch.randn(12)
        for world_size in (2, 3):
            dist.destroy_process_group()
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=world_size
            )

            def judge(op, args, rule):
                truth = sv._to_ground_truth(op(*args))
                m = sv._prepare_aten_mitigations(op, args, {})
                with LocalTensorMode(frozenset(range(world_size))):
                    mesh = init_device_mesh("cpu", (world_size,))
                    return sv._validate_aten_with_mitigations(
                        op, args, {}, *rule, truth, world_size, mesh, m
                    )

            norm2 = _NormPartial(2)
            wrong = ((norm2, Replicate()), (norm2,))
            self.assertFalse(judge(aten.add.Tensor, (v, v.abs()), wrong))
            self.assertFalse(judge(aten.mul.Tensor, (v.abs(), v), wrong))
            right = ((norm2,), (norm2,))
            self.assertTrue(judge(aten.clone.default, (v,), right))
            self.assertTrue(
                judge(
                    aten.mul.Tensor,
                    (v.abs(), v.abs()),
                    ((norm2, Replicate()), (norm2,)),
                )
            )

    def test_wrong_norm_partial_is_incorrect(self):
        x = torch.randn(4, 4)
        op = aten.linalg_vector_norm.default
        right = ((Shard(0),), (_NormPartial(2),))
        self.assertTrue(self.check(op, (x, 2), right)[0])
        wrong = ((Shard(0),), (_NormPartial(1),))
        self.assertFalse(self.check(op, (x, 2), wrong)[0])

    def test_strided_shard(self):
        x = torch.randn(4, 4, 4)
        right = ((Shard(1),), (_StridedShard(0, split_factor=4),))
        valid, message = self.check(aten.view.default, (x, [16, 4]), right)
        self.assertTrue(valid, message)
        wrong = ((Shard(1),), (_StridedShard(0, split_factor=2),))
        self.assertFalse(self.check(aten.view.default, (x, [16, 4]), wrong)[0])


class NormPartialWrongRuleTest(TestCase):
    """Wrong _NormPartial rules that earlier revisions accepted, rejected at 2 and 3 ranks;
    right ones on the same samples stay accepted."""

    def judge(self, op, args, rule, world_size):
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=world_size
        )
        try:
            truth = sv._to_ground_truth(op(*args))
            m = sv._prepare_aten_mitigations(op, args, {})
            with LocalTensorMode(frozenset(range(world_size))):
                mesh = init_device_mesh("cpu", (world_size,))
                return sv._validate_aten_with_mitigations(
                    op, args, {}, *rule, truth, world_size, mesh, m
                )
        finally:
            dist.destroy_process_group()

    def test_wrong_norm_partial_rules(self):
        g = torch.Generator().manual_seed(0)
        norms = torch.rand(12, generator=g) + 0.5
        with_inf = norms.clone()
        with_inf[3] = float("inf")
        n2, R = _NormPartial(2), Replicate()
        wrong = {
            # a rank can hold a zero partial norm (a shard of zeros)
            "sign -> R": (aten.sign.default, (norms,), ((n2,), (R,))),
            "gt(x, 0) -> R": (aten.gt.Scalar, (norms, 0.0), ((n2,), (R,))),
            # _NormPartial(inf/-inf/0) has no reduction: DTensor uses P(max/min/sum)
            "neg inf -> inf": (
                aten.neg.default,
                (norms,),
                ((_NormPartial(float("inf")),), (_NormPartial(float("inf")),)),
            ),
            "clone 0 -> 0": (
                aten.clone.default,
                (norms,),
                ((_NormPartial(0),), (_NormPartial(0),)),
            ),
            "abs S(0) -> -inf": (
                aten.abs.default,
                (norms,),
                ((Shard(0),), (_NormPartial(float("-inf")),)),
            ),
            # an inf element is a norm like any other
            "add with inf": (aten.add.Tensor, (with_inf, norms), ((n2, R), (n2,))),
        }
        right = {
            "clone": (aten.clone.default, (norms,), ((n2,), (n2,))),
            "clone with inf": (aten.clone.default, (with_inf,), ((n2,), (n2,))),
            "mul by R": (aten.mul.Tensor, (with_inf, norms), ((n2, R), (n2,))),
            "S(0) -> S(0)": (aten.sign.default, (norms,), ((Shard(0),), (Shard(0),))),
        }
        for world_size in (2, 3):
            for name, (op, args, rule) in wrong.items():
                with self.subTest(name, world_size=world_size):
                    self.assertIs(self.judge(op, args, rule, world_size), False)
            for name, (op, args, rule) in right.items():
                with self.subTest(name, world_size=world_size):
                    self.assertIs(self.judge(op, args, rule, world_size), True)


class StridedShardInputTest(TestCase):
    """A _StridedShard input holds on each simulated rank that rank's strided piece:
    wrong rules reading only some rows are rejected, right ones accepted, at 2 and 3
    ranks (every rank held rank 0's piece, so a select of row 0 passed as Replicate and
    a clone did not redistribute back to the input; with the pieces right, a slice of
    the first rows passed as a Shard output, whose row count was not compared)."""

    judge = NormPartialWrongRuleTest.judge

    def test_shard_output_row_count(self):
        # Each rank's first rows of a _StridedShard(0, 2) piece of arange rows are
        # the truth's first rows: only the Shard output's row count tells. Witness
        # (8 rows, 2 ranks): pieces [0, 1, 4, 5] / [2, 3, 6, 7], slice [0:3] gives
        # 3 rows on each, where Shard(0) of 3 rows holds 2 and 1.
        x = torch.arange(24.0).reshape(8, 3)
        rule = ((_StridedShard(0, split_factor=2),), (Shard(0),))
        for world_size, end in ((2, 3), (4, 2), (4, 3)):
            with self.subTest(world_size=world_size, end=end):
                self.assertIs(
                    self.judge(aten.slice.Tensor, (x, 0, 0, end), rule, world_size),
                    False,
                )

    def test_strided_shard_inputs(self):
        g = torch.Generator().manual_seed(0)
        # 36 rows: every split even (rows divisible by split_factor * world_size)
        x = torch.randn(36, 3, generator=g)
        R = Replicate()
        for split_factor in (2, 3):
            S = _StridedShard(0, split_factor=split_factor)
            wrong = {
                "select(0) -> R": (aten.select.int, (x, 0, 0), ((S,), (R,))),
                "slice[0:2] -> R": (aten.slice.Tensor, (x, 0, 0, 2), ((S,), (R,))),
                "slice[0:2] -> same": (aten.slice.Tensor, (x, 0, 0, 2), ((S,), (S,))),
                # each rank's first rows are the truth's: only the row count differs
                "slice[0:3] -> S(0)": (
                    aten.slice.Tensor,
                    (x, 0, 0, 3),
                    ((S,), (Shard(0),)),
                ),
                "index_select -> R": (
                    aten.index_select.default,
                    (x, 0, torch.tensor([0])),
                    ((S, R), (R,)),
                ),
            }
            right = {
                "clone": (aten.clone.default, (x,), ((S,), (S,))),
                "neg": (aten.neg.default, (x,), ((S,), (S,))),
                "sum(0) -> P(sum)": (
                    aten.sum.dim_IntList,
                    (x, [0]),
                    ((S,), (Partial("sum"),)),
                ),
                "sum(1) -> same": (aten.sum.dim_IntList, (x, [1]), ((S,), (S,))),
            }
            for world_size in (2, 3):
                for name, (op, args, rule) in wrong.items():
                    with self.subTest(name, sf=split_factor, world_size=world_size):
                        self.assertIs(self.judge(op, args, rule, world_size), False)
                for name, (op, args, rule) in right.items():
                    with self.subTest(name, sf=split_factor, world_size=world_size):
                        self.assertIs(self.judge(op, args, rule, world_size), True)


class ShardOutputSplitTest(TestCase):
    """A Shard output's pieces are compared with DTensor's own split of the ground
    truth (torch.chunk's sizes), not only their total: pieces of the right total in
    another split were read across their boundaries, and passed where the truth is 0
    at the padding read. Right rules keep passing at 2, 3 and 4 ranks."""

    judge = NormPartialWrongRuleTest.judge

    def test_data_dependent_pieces_rejected(self):
        # 6 elements; on 2 ranks the pieces hold 2 and 3 elements where DTensor's
        # split of 5 has 3 and 2 (on 3 ranks 1, 2, 2 for 2, 2, 1), and the truth is 0
        # where the padding of the shorter piece is read.
        S = Shard(0)
        wrong = {
            "masked_select": (
                aten.masked_select.default,
                (
                    torch.tensor([1.0, 9.0, 0.0, 0.0, 0.0, 0.0]),
                    torch.tensor([1, 0, 1, 1, 1, 1], dtype=torch.bool),
                ),
            ),
            "repeat_interleave": (
                aten.repeat_interleave.self_Tensor,
                (
                    torch.tensor([3.0, 4.0, 0.0, 0.0, 0.0, 0.0]),
                    torch.tensor([1, 0, 1, 1, 1, 1]),
                ),
            ),
        }
        for world_size in (2, 3):
            for name, (op, args) in wrong.items():
                with self.subTest(name, world_size=world_size):
                    self.assertIs(
                        self.judge(op, args, ((S, S), (S,)), world_size), False
                    )

    def test_right_shard_output_rules(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(12, 6, generator=g), torch.randn(12, 6, generator=g)
        z = torch.randn(6, 12, generator=g)
        R, S0, S1 = Replicate(), Shard(0), Shard(1)
        right = {
            "cat": (aten.cat.default, ([x, y], 1), ((S0, S0), (S0,))),
            "cat S(1)": (aten.cat.default, ([z, z, z], 0), ((S1, S1, S1), (S1,))),
            "stack": (aten.stack.default, ([x, y], 0), ((S0, S0), (S1,))),
            "repeat": (aten.repeat.default, (x, [2, 1, 1]), ((S0,), (S1,))),
            "expand": (
                aten.expand.default,
                (torch.randn(12, 1, generator=g), [12, 6]),
                ((S0,), (S0,)),
            ),
            "two outputs": (aten.max.dim, (x, 1), ((S0,), (S0, S0))),
            "list": (aten.split.Tensor, (x, 2, 1), ((S0,), (S0, S0, S0))),
            "0-row output": (aten.slice.Tensor, (z, 0, 0, 0), ((S1,), (S1,))),
            "0-row input": (aten.clone.default, (torch.zeros(0, 4),), ((S0,), (S0,))),
            "mm": (aten.mm.default, (x, z), ((S0, R), (S0,))),
            "_S(0, 2) -> _S(0, 2)": (
                aten.clone.default,
                (torch.randn(24, 3, generator=g),),
                (
                    (_StridedShard(0, split_factor=2),),
                    (_StridedShard(0, split_factor=2),),
                ),
            ),
        }
        for world_size in (2, 3, 4):
            for name, (op, args, rule) in right.items():
                with self.subTest(name, world_size=world_size):
                    self.assertIs(self.judge(op, args, rule, world_size), True)


class UnevenStridedShardInputTest(TestCase):
    """A _StridedShard input whose ranks' pieces differ in size is untestable ("uneven
    shard"), like a Shard input on a dim the world size does not divide: such pieces
    broke LocalTensor ("stack expects each tensor to be equal size"), so right rules
    were reported incorrect."""

    judge = NormPartialWrongRuleTest.judge

    def validate(self, op, args, rule, world_size):
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=world_size
        )
        try:
            truth = sv._to_ground_truth(op(*args))
            with LocalTensorMode(frozenset(range(world_size))):
                mesh = init_device_mesh("cpu", (world_size,))
                return sv.validate_aten_combination(
                    op, args, {}, truth, rule, world_size, mesh
                )
        finally:
            dist.destroy_process_group()

    def test_uneven_strided_shard_input_is_untestable(self):
        g = torch.Generator().manual_seed(0)
        # 12 rows at split factor 3 on 3 ranks: pieces of 6, 6 and 0 rows
        x = torch.randn(12, 3, generator=g)
        S = _StridedShard(0, split_factor=3)
        rules = {
            "clone": (aten.clone.default, (x,), ((S,), (S,))),
            "neg": (aten.neg.default, (x,), ((S,), (S,))),
            "sum(0) -> P(sum)": (
                aten.sum.dim_IntList,
                (x, [0]),
                ((S,), (Partial("sum"),)),
            ),
        }
        for name, (op, args, rule) in rules.items():
            with self.subTest(name):
                self.assertEqual(
                    self.validate(op, args, rule, 3), (None, "uneven shard")
                )
                self.assertIsNone(self.judge(op, args, rule, 3))
                # even pieces on 2 ranks (rows divisible by 3 * 2): checked, right
                self.assertIs(self.judge(op, args, rule, 2), True)
        # pieces of one size though the rows are not divisible by 3 * 2 (4 rows:
        # 1 + 1 + 0 on each rank): still checked, a right rule accepted and a
        # wrong one rejected
        small = torch.randn(4, 3, generator=g)
        self.assertIs(self.judge(aten.clone.default, (small,), ((S,), (S,)), 2), True)
        self.assertIs(
            self.judge(aten.select.int, (small, 0, 0), ((S,), (Replicate(),)), 2),
            False,
        )


if __name__ == "__main__":
    run_tests()
