# Owner(s): ["oncall: distributed"]
"""The strategy validator checks DTensor's rules against a plain-tensor truth: a rule it
reports incorrect must be wrong, and a wrong rule must be reported."""

from unittest import mock

import torch
import torch.distributed as dist
import torch.testing._internal.common_methods_invocations as common_ops
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
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


class ShapeArgumentsTest(StrategyValidatorTestBase):
    """view's sizes and native_group_norm's N, C, HxW describe the global tensor: the
    local op must get the local sizes, as in a DTensor dispatch."""

    def test_view_merging_dims_keeps_shard(self):
        x = torch.randn(4, 4, 4)
        for inputs, output in ((Shard(0), Shard(0)), (Shard(2), Shard(1))):
            valid, message = self.check(
                aten.view.default, (x, [16, 4]), ((inputs,), (output,))
            )
            self.assertTrue(valid, message)

    def test_view_with_wrong_output_shard_is_incorrect(self):
        x = torch.randn(4, 4, 4)
        valid, _ = self.check(
            aten.view.default, (x, [16, 4]), ((Shard(0),), (Shard(1),))
        )
        self.assertFalse(valid)

    def test_group_norm_batch_shard(self):
        x, weight, bias = torch.randn(2, 6, 3), torch.randn(6), torch.randn(6)
        args = (x, weight, bias, 2, 6, 3, 2, 1e-5)
        placements = ((Shard(0), Replicate(), Replicate()), (Shard(0),) * 3)
        valid, message = self.check(aten.native_group_norm.default, args, placements)
        self.assertTrue(valid, message)
        wrong = ((Shard(0), Replicate(), Replicate()), (Replicate(),) * 3)
        self.assertFalse(self.check(aten.native_group_norm.default, args, wrong)[0])


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

    def test_norm_partial_input_is_untestable(self):
        x = torch.randn(4, 4)
        rule = ((_NormPartial(2),), (_NormPartial(2),))
        valid, reason = self.check(aten.linalg_vector_norm.default, (x, 2), rule)
        self.assertIsNone(valid, reason)

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


class NegatedSampleTest(StrategyValidatorTestBase):
    """The P(min)/P(max) mitigation negates values, not the integer indices next to them."""

    def test_indices_are_not_negated(self):
        # (linalg_ldl_solve's pivots are the case that matters: negated, they make
        # LAPACK write out of bounds, so this test uses an op that checks its index.)
        x, index = torch.randn(4, 3), torch.tensor([0, 2])
        m = sv._prepare_aten_mitigations(aten.index_select.default, (x, 0, index), {})
        self.assertIsNotNone(m.negated_args)
        negated_x, _, negated_index = m.negated_args
        self.assertEqual(negated_index, index)
        self.assertEqual(negated_x, -x)
        self.assertEqual(m.negated_ground_truth, torch.index_select(-x, 0, index))

    def test_integer_values_next_to_floats_are_negated(self):
        # An integer operand that is a value keeps the sign check: mul's
        # P(max), R -> P(max) holds for a positive operand only.
        x, y = torch.randn(4), torch.arange(1, 5)
        m = sv._prepare_aten_mitigations(aten.mul.Tensor, (x, y), {})
        self.assertEqual(m.negated_args, (-x, -y))
        rule = ((Partial("max"), Replicate()), (Partial("max"),))
        verdicts = []
        with LocalTensorMode(frozenset(range(WORLD_SIZE))):
            mesh = init_device_mesh("cpu", (WORLD_SIZE,))
            for mitigations in (sv._AtenFalsePositiveMitigations(), m):
                verdicts.append(
                    sv._validate_aten_with_mitigations(
                        aten.mul.Tensor,
                        (x, y),
                        {},
                        *rule,
                        torch.mul(x, y),
                        WORLD_SIZE,
                        mesh,
                        mitigations,
                    )  # fmt: skip
                )
        self.assertEqual(verdicts, [True, False])

    def test_all_integer_arguments_are_negated(self):
        a, b = torch.arange(4), torch.arange(4).flip(0)
        m = sv._prepare_aten_mitigations(aten.maximum.default, (a, b), {})
        self.assertEqual(m.negated_args, (-a, -b))
        self.assertEqual(m.negated_ground_truth, torch.maximum(-a, -b))


class RandomOpsTest(StrategyValidatorTestBase):
    def test_random_samplers_are_skipped(self):
        # A sharded sampler draws other numbers than the plain one: no ground truth.
        for op in ("exponential", "geometric", "log_normal"):
            self.assertIn(op, sv.SKIP_OPS)
            stats = sv.compare_operator(op, "cpu", torch.float32, WORLD_SIZE, 2)
            self.assertEqual(stats.false_positives, [])
            self.assertEqual(stats.total_samples, 0)


class PartialInputTest(StrategyValidatorTestBase):
    """Every Partial input the validator builds reduces to the tensor it stands for, in
    the tensor's own dtype; a reduction that cannot exist for a dtype is untestable."""

    CASES = {
        torch.float32: ("sum", "avg", "min", "max", "product"),
        torch.int64: ("sum", "avg", "min", "max", "product", "band", "bor", "bxor"),
        torch.uint8: ("sum", "avg", "min", "max", "product", "band", "bor", "bxor"),
        torch.bool: ("sum", "min", "max", "product", "band", "bor", "bxor"),
    }

    def _tensor(self, dtype):
        values = torch.tensor([[3.5, -2.0, 0.0], [7.25, -1.5, 4.0]])
        if dtype == torch.bool:
            return values > 0
        if dtype.is_floating_point:
            return values.to(dtype)
        return (values * 4).abs().to(dtype)

    def test_partial_inputs_reduce_to_the_tensor(self):
        for world_size in (2, 3, 4):
            dist.destroy_process_group()
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=world_size
            )
            with LocalTensorMode(frozenset(range(world_size))):
                mesh = init_device_mesh("cpu", (world_size,))
                for dtype, reduce_ops in self.CASES.items():
                    tensor = self._tensor(dtype)
                    for reduce_op in reduce_ops:
                        with self.subTest(
                            world_size=world_size, dtype=dtype, op=reduce_op
                        ):
                            local = sv._create_partial_input(
                                tensor, Partial(reduce_op), world_size
                            )
                            self.assertEqual(local.dtype, dtype)
                            dt = DTensor.from_local(
                                local, mesh, [Partial(reduce_op)], run_check=False
                            )
                            full = dt.redistribute(mesh, [Replicate()]).to_local()
                            self.assertEqual(full._local_tensors[0], tensor)

    def test_bxor_rule_of_nonlinear_op_is_incorrect(self):
        # Equal per-rank patterns would cancel in pairs at odd world sizes and let
        # any elementwise op pass P(bxor) -> P(bxor).
        x = torch.arange(-6, 6).reshape(3, 4)
        rule = ((Partial("bxor"),), (Partial("bxor"),))
        for world_size in (2, 3, 4, 5):
            dist.destroy_process_group()
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=world_size
            )
            truth = sv._to_ground_truth(aten.neg.default(x))
            with LocalTensorMode(frozenset(range(world_size))):
                mesh = init_device_mesh("cpu", (world_size,))
                valid, _ = sv.validate_aten_combination(
                    aten.neg.default, (x,), {}, truth, rule, world_size, mesh
                )
            self.assertFalse(valid, f"world size {world_size}")

    def test_impossible_partial_input_is_untestable(self):
        x = torch.randn(4, 4)
        valid, reason = self.check(
            aten.clone.default, (x,), ((Partial("band"),), (Partial("band"),))
        )
        self.assertIsNone(valid, reason)
        flags = torch.randn(4, 4) > 0
        valid, reason = self.check(
            aten.clone.default, (flags,), ((Partial("avg"),), (Partial("avg"),))
        )
        self.assertIsNone(valid, reason)

    def test_impossible_partial_output_is_incorrect(self):
        # A rule claiming an output placement that cannot exist is wrong, not
        # untestable.
        x = torch.randn(4, 4)
        valid, _ = self.check(aten.neg.default, (x,), ((Shard(0),), (Partial("bxor"),)))
        self.assertFalse(valid)

    def test_product_of_partial_product_is_checked(self):
        x = torch.randn(4, 4)
        right = ((Partial("product"),), (Partial("product"),))
        self.assertTrue(self.check(aten.clone.default, (x,), right)[0])
        wrong = ((Partial("product"),), (Partial("sum"),))
        self.assertFalse(self.check(aten.clone.default, (x,), wrong)[0])


class ToleranceTest(StrategyValidatorTestBase):
    """Rounding of the per-rank values is not a wrong rule; a wrong rule still is."""

    def test_linear_rules_within_rounding(self):
        torch.manual_seed(0)
        a, b = torch.randn(12, 4, 12) * 9, torch.randn(12, 12, 4) * 9
        rule = ((Replicate(), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.bmm.default, (a, b), rule)
        self.assertTrue(valid, message)
        x = torch.randn(4, 12, 4, dtype=torch.bfloat16)
        for reduce_op in ("sum", "avg"):
            rule = ((Partial(reduce_op),), (Partial(reduce_op),))
            valid, message = self.check(aten.clone.default, (x,), rule)
            self.assertTrue(valid, message)

    def test_widening_cast_keeps_the_input_rounding(self):
        # Each rank's bfloat16 split is rounded; cast to float64 the sum keeps that.
        torch.manual_seed(0)
        x = torch.randn(4, 4, 4, 4, dtype=torch.bfloat16)
        rule = ((Partial("sum"),), (Partial("sum"),))
        valid, message = self.check(
            aten._to_copy.default, (x,), rule, {"dtype": torch.float64}
        )
        self.assertTrue(valid, message)

    def test_nonlinear_rules_still_incorrect_in_bfloat16(self):
        torch.manual_seed(0)
        x = torch.randn(4, 12, 4, dtype=torch.bfloat16)
        rule = ((Partial("sum"),), (Partial("sum"),))
        self.assertFalse(self.check(aten.abs.default, (x,), rule)[0])
        self.assertFalse(self.check(aten.exp.default, (x,), rule)[0])
        rule = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
        self.assertFalse(self.check(aten.mul.Tensor, (x, x), rule)[0])


if __name__ == "__main__":
    run_tests()
