# Owner(s): ["oncall: distributed"]
"""view(dtype) of a Partial DTensor reinterprets bits: in general no reduction commutes
with it. Those that do on every value keep the Partial: sum and product between
integers of one size (two's complement wraps alike) and sum/avg between a complex
dtype and its real component dtype (product and the bitwise reductions:
test_partial_product.py).

The ground truth reduces the per-rank values first and then views the result.
"""

import torch
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)

REDUCTIONS = {
    "sum": lambda t: t.sum(0),
    "avg": lambda t: t.mean(0),
    "min": lambda t: t.amin(0),
    "max": lambda t: t.amax(0),
}
PER_RANK = [[1.0, -2.0], [2.0, 0.5]]
ELEMENTWISE = {
    "sum": torch.add,
    "avg": lambda a, b: (a + b) / 2,
    "max": torch.maximum,
    "bxor": torch.bitwise_xor,
}
# (reduce_op, per-rank values, source dtype, target dtype, keeps Partial)
REINTERPRETING_VIEWS = [
    ("sum", [[100, -3], [100, 1]], torch.int8, torch.uint8, True),
    ("sum", [[200, 7], [100, 250]], torch.uint8, torch.int8, True),
    ("sum", [[2**62, -1], [2**62, 5]], torch.int64, torch.float64, False),
    ("sum", [[100, -3, 7, 1], [100, 1, -7, 2]], torch.int8, torch.int16, False),
    ("max", [[-1, 3], [5, 2]], torch.int8, torch.uint8, False),
    ("bxor", [[5, 7], [3, 9]], torch.int32, torch.float32, False),
    ("sum", [[1 + 2j, 3 - 1j], [0.5, 1j]], torch.complex64, torch.float32, True),
    ("avg", [[1 + 2j, 3 - 1j], [0.5, 1j]], torch.complex128, torch.float64, True),
    ("sum", [[1.0, 2.0], [0.5, 0.25]], torch.float32, torch.complex64, True),
    ("sum", [[1 + 2j], [0.5 - 1j]], torch.complex64, torch.float64, False),
]


class DistPartialViewDtypeTest(DTensorContinuousTestBase):
    world_size = 2

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

    def test_view_dtype_reduces_first(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"reduce_op": list(REDUCTIONS), "target": [torch.int32, torch.int16]},
            self._check_view,
            mesh,
        )

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

    def _check_reinterpreting_view(self, mesh, case):
        reduce_op, per_rank, src, target, keeps = case
        values = [torch.tensor(v, dtype=src) for v in per_rank]
        truth = ELEMENTWISE[reduce_op](values[0], values[1]).to(src).view(target)
        local = map_local_for_rank(self.rank, values.__getitem__)
        dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
        comm_mode = CommDebugMode()
        with comm_mode:
            out = dt.view(target)
        self.assertEqual(comm_mode.get_total_counts(), 0 if keeps else 1)
        self.assertEqual(
            out.placements, (Partial(reduce_op) if keeps else Replicate(),)
        )
        self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)

    def test_view_keeps_partial_only_where_the_reduction_commutes(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"case": REINTERPRETING_VIEWS}, self._check_reinterpreting_view, mesh
        )

    def _check_shard_last_dim(self, mesh, case):
        shape, src, target, keeps_shard = case
        full = (
            torch.arange(shape[0] * shape[1], dtype=torch.float64)
            .reshape(shape)
            .to(src)
        )
        dt = distribute_tensor(full, mesh, [Shard(1)])
        comm_mode = CommDebugMode()
        with comm_mode:
            out = dt.view(target)
        self.assertEqual(out.placements, (Shard(1) if keeps_shard else Replicate(),))
        self.assertEqual(comm_mode.get_total_counts(), 0 if keeps_shard else 1)
        self.assertEqual(out.full_tensor(), full.view(target), atol=0, rtol=0)

    def test_view_changing_element_size_keeps_only_an_even_last_dim_shard(self):
        # An element size change rescales each rank's last dim: an uneven Shard
        # of it would give locals that are not the chunks of the global result.
        mesh = self.build_device_mesh()
        self.run_subtests(
            {
                "case": [
                    ((2, 4), torch.float32, torch.int8, True),
                    ((2, 3), torch.float32, torch.int8, False),
                    ((2, 5), torch.float32, torch.int16, False),
                    ((2, 8), torch.int8, torch.float32, True),
                    ((2, 4), torch.int8, torch.float32, False),
                    ((2, 3), torch.float32, torch.int32, True),
                ]
            },
            self._check_shard_last_dim,
            mesh,
        )


DistPartialViewDtypeTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialViewDtypeTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
