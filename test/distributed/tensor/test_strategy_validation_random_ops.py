# Owner(s): ["oncall: distributed"]
"""The validator skips random samplers: they have no ground truth.

A rule the validator reports incorrect must be wrong, and a wrong rule must be reported."""

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


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


class RandomOpsTest(StrategyValidatorTestBase):
    def test_random_samplers_are_skipped(self):
        # A sharded sampler draws other numbers than the plain one: no ground truth.
        for op in ("exponential", "geometric", "log_normal"):
            self.assertIn(op, sv.SKIP_OPS)
            stats = sv.compare_operator(op, "cpu", torch.float32, WORLD_SIZE, 2)
            self.assertEqual(stats.false_positives, [])
            self.assertEqual(stats.total_samples, 0)

    def test_multinomial_is_skipped(self):
        # Rows are drawn independently, so sharding them (S(0) -> S(0)) is right,
        # but the per-rank draws are not the plain tensor's: at 3 ranks the OpInfo
        # samples [3, 10] and [3, 4] shard evenly and S(0) -> S(0) was reported.
        dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=3)
        self.assertIn("multinomial", sv.SKIP_OPS)
        stats = sv.compare_operator("multinomial", "cpu", torch.float32, 3, 6)
        self.assertEqual(stats.false_positives, [])
        self.assertEqual(stats.total_samples, 0)


if __name__ == "__main__":
    run_tests()
