# Owner(s): ["oncall: distributed"]
"""An op that receives the same DTensor more than once redistributes it once."""

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)


def rank_values(rank):
    return torch.tensor([1.0 + rank, -2.0, 0.5 * rank])


class DistRedistributeSameInputOnceTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _partial(self, mesh):
        local = map_local_for_rank(self.rank, rank_values)
        return DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)

    def _truth(self):
        return sum(rank_values(r) for r in range(self.world_size))

    @with_comms
    def test_addcmul_with_one_partial_twice_reduces_once(self):
        mesh = self.build_device_mesh()
        zeros = map_local_for_rank(self.rank, lambda r: torch.zeros(3))
        out = DTensor.from_local(zeros, mesh, [Replicate()], run_check=False)
        partial = self._partial(mesh)
        comm_mode = CommDebugMode()
        with comm_mode:
            out.addcmul_(partial, partial, value=0.5)
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(out.full_tensor(), 0.5 * self._truth() * self._truth())

    @with_comms
    def test_distinct_inputs_are_still_each_redistributed(self):
        mesh = self.build_device_mesh()
        zeros = map_local_for_rank(self.rank, lambda r: torch.zeros(3))
        out = DTensor.from_local(zeros, mesh, [Replicate()], run_check=False)
        a, b = self._partial(mesh), self._partial(mesh)
        comm_mode = CommDebugMode()
        with comm_mode:
            out.addcmul_(a, b, value=0.5)
        self.assertEqual(comm_mode.get_total_counts(), 2)
        self.assertEqual(out.full_tensor(), 0.5 * self._truth() * self._truth())


DistRedistributeSameInputOnceTestWithLocalTensor = create_local_tensor_test_class(
    DistRedistributeSameInputOnceTest
)


if __name__ == "__main__":
    run_tests()
