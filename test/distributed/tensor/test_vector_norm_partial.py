# Owner(s): ["oncall: distributed"]
"""An inf-norm reduces |x| with max: a Partial(max) input is not a Partial(max) of its
norm, so the norm must see the reduced input."""

import torch
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
    # Rank 0 holds the larger value where it is negative: the reduced max is small
    # in magnitude while a rank's local value is large.
    return torch.tensor([[-5.0, 1.0], [3.0, -4.0]]) if rank == 0 else torch.ones(2, 2)


class DistVectorNormPartialTest(DTensorContinuousTestBase):
    world_size = 2

    def _check(self, reduce_op, ord, dim=None):
        mesh = self.build_device_mesh()
        local = map_local_for_rank(self.rank, rank_values)
        x = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
        stack = torch.stack([rank_values(r) for r in range(self.world_size)])
        full = stack.amax(0) if reduce_op == "max" else stack.amin(0)
        comm_mode = CommDebugMode()
        with comm_mode:
            out = torch.linalg.vector_norm(x, ord, dim=dim)
        self.assertEqual(
            out.full_tensor(), torch.linalg.vector_norm(full, ord, dim=dim)
        )
        # The input is reduced once; the norm of a Replicate input needs nothing more.
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(out.placements, (Replicate(),))

    def test_inf_norm_of_partial_max(self):
        self._check("max", float("inf"))
        self._check("max", float("inf"), dim=1)

    def test_neg_inf_norm_of_partial_min(self):
        self._check("min", float("-inf"))
        self._check("min", float("-inf"), dim=0)

    def test_foreach_inf_norm_of_partial_max(self):
        # The strategy get_total_norm(norm_type=inf) reaches through _foreach_norm.
        mesh = self.build_device_mesh()
        local = map_local_for_rank(self.rank, rank_values)
        x = DTensor.from_local(local, mesh, [Partial("max")], run_check=False)
        stack = torch.stack([rank_values(r) for r in range(self.world_size)])
        (out,) = torch._foreach_norm([x], float("inf"))
        self.assertEqual(
            out.full_tensor(), torch.linalg.vector_norm(stack.amax(0), float("inf"))
        )

    def test_inf_norm_of_replicate_needs_no_collective(self):
        mesh = self.build_device_mesh()
        x = DTensor.from_local(rank_values(0), mesh, [Replicate()], run_check=False)
        comm_mode = CommDebugMode()
        with comm_mode:
            out = torch.linalg.vector_norm(x, float("inf"))
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.to_local(), torch.tensor(5.0))


DistVectorNormPartialTestWithLocalTensor = create_local_tensor_test_class(
    DistVectorNormPartialTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
