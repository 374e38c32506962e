# Owner(s): ["oncall: distributed"]
"""The validator compares within the rounding of the per-rank values.

A rule the validator reports incorrect must be wrong, and a wrong rule must be reported."""

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


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

    def test_tolerance_is_per_element(self):
        # One element of 1e6 must not widen the tolerance of the others: adding a
        # Replicate operand on every rank of a P(sum) is off by (world_size - 1) * y.
        torch.manual_seed(0)
        x = torch.randn(8, 8)
        x[3, 5] = 1e6
        y = torch.randn(8, 8) * 0.05
        wrong = ((Partial("sum"), Replicate()), (Partial("sum"),))
        self.assertFalse(self.check(aten.add.Tensor, (x, y), wrong)[0])
        right = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.add.Tensor, (x, y), right)
        self.assertTrue(valid, message)
        # A contraction with an outlier: the bound is per output element.
        a, b = torch.randn(4, 8, 8), torch.randn(4, 8, 8)
        a[0, 0, 0] = 1e6
        rule = ((Replicate(), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.bmm.default, (a, b), rule)
        self.assertTrue(valid, message)
        wrong = ((Replicate(), Partial("sum")), (Replicate(),))
        self.assertFalse(self.check(aten.bmm.default, (a, b), wrong)[0])
        # A wrong bias in a bf16 addmm is caught away from the outlier.
        bias = torch.randn(8, 8, dtype=torch.bfloat16)
        m1 = torch.randn(8, 8, dtype=torch.bfloat16)
        m1[0, 0] = 1e4
        m2 = torch.randn(8, 8, dtype=torch.bfloat16)
        wrong = ((Replicate(), Partial("sum"), Replicate()), (Partial("sum"),))
        self.assertFalse(self.check(aten.addmm.default, (bias, m1, m2), wrong)[0])

    def test_integer_and_bool_outputs_compare_exactly(self):
        torch.manual_seed(0)
        flags, more = torch.rand(6, 1) > 0.5, torch.rand(6) > 0.5
        rule = ((Replicate(), Shard(0)), (Shard(1),))
        valid, message = self.check(aten.add.Tensor, (flags, more), rule)
        self.assertTrue(valid, message)
        x = torch.randint(-9, 10, (4, 6))
        rule = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.add.Tensor, (x, x), rule)
        self.assertTrue(valid, message)
        rule = ((Partial("sum"), Replicate()), (Partial("sum"),))
        self.assertFalse(self.check(aten.add.Tensor, (x, x + 1), rule)[0])


if __name__ == "__main__":
    run_tests()
