# Owner(s): ["oncall: distributed"]
"""avg_pool of an integer tensor truncates its division: a Partial(sum) input is not a
Partial(sum) of its pooled value, so the pool must see the reduced input."""

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    DTensorContinuousTestBase,
    map_local_for_rank,
)


def rank_values(rank):
    # Window sums 11 and 5: the per-rank averages truncate to 2 + 1 = 3, while the
    # average of the summed window is 16 / 4 = 4.
    values = [[1, 2], [3, 5]] if rank == 0 else [[1, 1], [1, 2]]
    return torch.tensor([[values]])


class DistAvgPoolIntegerPartialTest(DTensorContinuousTestBase):
    world_size = 2

    def _partial(self, dtype):
        mesh = self.build_device_mesh()
        local = map_local_for_rank(self.rank, lambda r: rank_values(r).to(dtype))
        return DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)

    def test_integer_avg_pool_of_partial(self):
        pools = {
            1: lambda t: F.avg_pool1d(t.flatten(1, 2), 2),
            2: lambda t: F.avg_pool2d(t, 2),
            3: lambda t: F.avg_pool3d(t.unsqueeze(0), (1, 2, 2)),
        }
        # Partial(sum): gloo cannot reduce an int64 Partial(avg) at all (on stock too:
        # "result type Float can't be cast to the desired output type Long"). The rule
        # change covers P(avg) alike.
        for dims, pool in pools.items():
            with self.subTest(dims=dims):
                mesh = self.build_device_mesh()
                local = map_local_for_rank(self.rank, rank_values)
                x = DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)
                full = sum(rank_values(r) for r in range(self.world_size))
                comm_mode = CommDebugMode()
                with comm_mode:
                    out = pool(x)
                self.assertEqual(out.full_tensor(), pool(full))
                self.assertEqual(comm_mode.get_total_counts(), 1)
                self.assertEqual(out.placements, (Replicate(),))

    def test_float_avg_pool_keeps_partial(self):
        x = self._partial(torch.float32)
        full = sum(rank_values(r) for r in range(self.world_size)).float()
        comm_mode = CommDebugMode()
        with comm_mode:
            out = F.avg_pool2d(x, 2)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.placements, (Partial("sum"),))
        self.assertEqual(out.full_tensor(), F.avg_pool2d(full, 2))


DistAvgPoolIntegerPartialTestWithLocalTensor = create_local_tensor_test_class(
    DistAvgPoolIntegerPartialTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
