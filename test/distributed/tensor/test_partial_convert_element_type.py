# Owner(s): ["oncall: distributed"]
"""prims.convert_element_type of Partial DTensors follows the rule of _to_copy.

Decompositions and torch.compile graphs cast with the prim; eager code with _to_copy. Both
keep a pending reduction exactly where the cast is a homomorphism for it, e.g. a widening
bf16 -> fp32 cast of a pending sum, so the sum then runs once in fp32 (#183363), and both
reduce first where it is not (narrowing casts of a sum, wrapping integer sums).
"""

import torch
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


INF = float("inf")


def to(dtype):
    return lambda t: t.to(dtype)


def convert_element_type(dtype):
    return lambda t: torch.ops.prims.convert_element_type.default(t, dtype)


# (reduce_op, source dtype, per-rank values, cast, keeps Partial)
CASES = [
    # Widening float casts keep the pending sum (reduced later, in the wider dtype).
    (
        "sum",
        torch.bfloat16,
        [[1.0, 2.5], [2.0, -0.5]],
        convert_element_type(torch.float32),
        True,
    ),
    (
        "sum",
        torch.float16,
        [[1.0, 2.5], [2.0, -0.5]],
        convert_element_type(torch.float32),
        True,
    ),
    (
        "avg",
        torch.float32,
        [[1.0, 2.5], [2.0, -0.5]],
        convert_element_type(torch.float64),
        True,
    ),
    # Narrowing float casts overflow or round each rank's value: reduce first.
    (
        "sum",
        torch.float32,
        [[70000.0, 1.0], [-70000.0, 2.0]],
        convert_element_type(torch.float16),
        False,
    ),
    (
        "sum",
        torch.float32,
        [[100.3, 1.0], [-100.0, 2.0]],
        convert_element_type(torch.bfloat16),
        False,
    ),
    # max/min of a monotone cast keep.
    (
        "max",
        torch.float32,
        [[70000.0, 1.0], [-70000.0, 2.0]],
        convert_element_type(torch.float16),
        True,
    ),
    ("max", torch.int32, [[3, -9], [4, 2]], convert_element_type(torch.int64), True),
    (
        "max",
        torch.int32,
        [[200, -3], [100, 5]],
        convert_element_type(torch.int8),
        False,
    ),
    # Float to integer: inf and out-of-range values convert to arbitrary integers.
    (
        "min",
        torch.float32,
        [[INF, 3.0], [7.0, INF]],
        convert_element_type(torch.int64),
        False,
    ),
    (
        "min",
        torch.float32,
        [[40000.0, 3.0], [5.0, 2.0]],
        convert_element_type(torch.int16),
        False,
    ),
    (
        "max",
        torch.float32,
        [[-200.0, 0.5], [0.5, 3.0]],
        convert_element_type(torch.int8),
        False,
    ),
    # Integer sums: no more bits keeps, wider or floating reduces first.
    (
        "sum",
        torch.int64,
        [[2**62, 1], [2**62, 2]],
        convert_element_type(torch.int32),
        True,
    ),
    ("sum", torch.int8, [[100, 1], [100, 2]], convert_element_type(torch.int32), False),
    (
        "sum",
        torch.int8,
        [[100, 1], [100, 2]],
        convert_element_type(torch.float32),
        False,
    ),
    (
        "sum",
        torch.float32,
        [[1.5, -0.5], [1.5, 2.0]],
        convert_element_type(torch.int32),
        False,
    ),
]


class DistPartialConvertElementTypeTest(DTensorContinuousTestBase):
    world_size = 2

    def _partial(self, mesh, reduce_op, make):
        local = map_local_for_rank(self.rank, make)
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _truth(self, reduce_op, make, dtype):
        stacked = torch.stack([make(r) for r in range(self.world_size)])
        return REDUCTIONS[reduce_op](stacked).to(dtype)  # a bool "sum" saturates

    def _check_cast(self, mesh, case, inference):
        reduce_op, dtype, per_rank, cast, keeps = case
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

    def test_convert_element_type_matches_reduce_then_cast(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"case": CASES, "inference": [False, True]}, self._check_cast, mesh
        )

    def test_convert_element_type_agrees_with_to_copy(self):
        mesh = self.build_device_mesh()
        for reduce_op, dtype, per_rank, cast, _ in CASES:
            target = cast(torch.zeros(1, dtype=dtype)).dtype
            prim = cast(self._partial(mesh, reduce_op, values(dtype, per_rank)))
            eager = self._partial(mesh, reduce_op, values(dtype, per_rank)).to(target)
            self.assertEqual(prim.placements, eager.placements)
            self.assertEqual(prim.full_tensor(), eager.full_tensor(), atol=0, rtol=0)


DistPartialConvertElementTypeTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialConvertElementTypeTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
