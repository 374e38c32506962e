# Owner(s): ["oncall: distributed"]
"""view(dtype) of a Partial DTensor reinterprets bits: no reduction commutes with it.

The ground truth reduces the per-rank values first and then views the result.
"""

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

REDUCTIONS = {
    "sum": lambda t: t.sum(0),
    "avg": lambda t: t.mean(0),
    "min": lambda t: t.amin(0),
    "max": lambda t: t.amax(0),
}
PER_RANK = [[1.0, -2.0], [2.0, 0.5]]


class DistPartialViewDtypeTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _partial(self, mesh, reduce_op):
        local = map_local_for_rank(self.rank, lambda r: torch.tensor(PER_RANK[r]))
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _check_view(self, mesh, reduce_op, target):
        truth = REDUCTIONS[reduce_op](torch.tensor(PER_RANK)).view(target)
        comm_mode = CommDebugMode()
        with comm_mode:
            out = self._partial(mesh, reduce_op).view(target)
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)

    @with_comms
    def test_view_dtype_reduces_first(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"reduce_op": list(REDUCTIONS), "target": [torch.int32, torch.int16]},
            self._check_view,
            mesh,
        )

    @with_comms
    def test_view_same_dtype_keeps_partial(self):
        mesh = self.build_device_mesh()
        for reduce_op in REDUCTIONS:
            comm_mode = CommDebugMode()
            with comm_mode:
                out = self._partial(mesh, reduce_op).view(torch.float32)
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(out.placements, (Partial(reduce_op),))
            truth = REDUCTIONS[reduce_op](torch.tensor(PER_RANK))
            self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)


DistPartialViewDtypeTestWithLocalTensor = create_local_tensor_test_class(DistPartialViewDtypeTest)


if __name__ == "__main__":
    run_tests()
