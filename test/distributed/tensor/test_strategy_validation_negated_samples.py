# Owner(s): ["oncall: distributed"]
"""The validator's sign check negates values, not integer indices.

A rule the validator reports incorrect must be wrong, and a wrong rule must be reported."""

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate
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


if __name__ == "__main__":
    run_tests()
