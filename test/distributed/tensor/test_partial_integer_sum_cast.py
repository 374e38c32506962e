# Owner(s): ["oncall: distributed"]
"""Casts of an integer Partial(sum) DTensor to a wider integer or a floating dtype.

The pending sum wraps in the source dtype, as the plain tensor's sum does; after a widening
cast it would not (int8 100 + 100 is -56, not 200), and a float32 target also rounds each
rank's value. The ground truth sums the per-rank values in the source dtype, then casts.
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate
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


def values(dtype, per_rank):
    return lambda rank: torch.tensor(per_rank[rank], dtype=dtype)


def to(dtype):
    return lambda t: t.to(dtype)


# (reduce_op, source dtype, per-rank values, cast, keeps Partial)
CASES = [
    ("sum", torch.int8, [[100, 1], [100, 2]], to(torch.int32), False),
    ("sum", torch.uint8, [[200, 1], [100, 2]], lambda t: t.short(), False),
    ("sum", torch.int32, [[2**31 - 1, 1], [1, -2]], lambda t: t.long(), False),
    ("sum", torch.int8, [[100, 1], [100, 2]], to(torch.float32), False),
    ("sum", torch.int32, [[2**31 - 1, 3], [1, -2]], lambda t: t.double(), False),
    ("sum", torch.int64, [[2**24 + 1, 5], [1, 2]], lambda t: t.float(), False),
    ("sum", torch.int16, [[30000, 1], [10000, 2]], to(torch.complex64), False),
    # A token count: exact either way, and now one all-reduce of the int64 value.
    ("sum", torch.int64, [[1000], [24]], lambda t: t.float(), False),
    # No more bits than the source: the sum wraps alike; kept without a collective.
    ("sum", torch.int64, [[2**62, 1], [2**62, 2]], to(torch.int32), True),
    ("sum", torch.int16, [[30000, -5], [10000, 7]], to(torch.int8), True),
]


# gloo cannot all-reduce these dtypes ("Invalid scalar type", on main too); the
# LocalTensor twin of each class checks those cases.
GLOO_CANNOT_REDUCE = (torch.int16,)


class DistPartialIntegerSumCastTest(DTensorContinuousTestBase):
    world_size = 2

    def _partial(self, mesh, reduce_op, make):
        local = map_local_for_rank(self.rank, make)
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _truth(self, reduce_op, make, dtype):
        stacked = torch.stack([make(r) for r in range(self.world_size)])
        return REDUCTIONS[reduce_op](stacked).to(dtype)  # a bool "sum" saturates

    def _check_cast(self, mesh, case, inference):
        reduce_op, dtype, per_rank, cast, keeps = case
        if dtype in GLOO_CANNOT_REDUCE and dist.get_backend() == "gloo":
            return  # the LocalTensor twin checks this case
        make = values(dtype, per_rank)
        truth = cast(self._truth(reduce_op, make, dtype))
        dt = self._partial(mesh, reduce_op, make)
        comm_mode = CommDebugMode()
        with torch.inference_mode(inference), comm_mode:
            out = cast(dt)
        full = out.full_tensor()
        self.assertEqual(full.dtype, truth.dtype)
        self.assertEqual(full, truth, atol=0, rtol=0, equal_nan=True)
        expected = Partial(reduce_op) if keeps else Replicate()
        self.assertEqual(out.placements, (expected,))
        self.assertEqual(comm_mode.get_total_counts(), 0 if keeps else 1)

    def test_integer_sum_casts_match_reduce_then_cast(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"case": CASES, "inference": [False, True]}, self._check_cast, mesh
        )


DistPartialIntegerSumCastTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialIntegerSumCastTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
