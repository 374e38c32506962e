# Owner(s): ["oncall: distributed"]
"""sum and div of a bool Partial("sum") DTensor: a bool sum reduction saturates (any rank
True reads True), so counting or dividing each rank's values and summing the results is
not the count or quotient of the reduced value."""

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
    # True on both ranks in the first two elements: the reduced value is True there
    return torch.tensor([[True, True, rank == 0], [False, rank == 1, True]])


OPS = {
    "sum": lambda t: t.sum(),
    "sum.dim_IntList": lambda t: t.sum(dim=1),
    "div": lambda t: torch.div(t, 2),
}


class DistPartialBoolSumTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _check(self, mesh, name):
        local = map_local_for_rank(self.rank, rank_values)
        dt = DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)
        expected = OPS[name](dt.full_tensor())
        comm_mode = CommDebugMode()
        with comm_mode:
            out = OPS[name](dt)
        self.assertEqual(out.full_tensor(), expected)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(comm_mode.get_total_counts(), 1)

    @with_comms
    def test_sum_and_div_reduce_a_bool_partial_sum_first(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"name": list(OPS)}, self._check, mesh)


DistPartialBoolSumTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialBoolSumTest
)


if __name__ == "__main__":
    run_tests()
