# Owner(s): ["oncall: distributed"]
"""The validator runs the local op with the local sizes a DTensor dispatch gives it.

A rule the validator reports incorrect must be wrong, and a wrong rule must be reported."""

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
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


if __name__ == "__main__":
    run_tests()
