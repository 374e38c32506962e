# Owner(s): ["oncall: distributed"]
"""Dtype casts (_to_copy, and aten.to.dtype under inference mode) of Partial DTensors.

The ground truth reduces the per-rank values first, in the source dtype as the pending
reduction would, and then casts. A Partial placement may be kept only where the cast is a
homomorphism for the reduction on the values that can occur; everywhere else the input is
reduced first (one all-reduce) and the output is Replicate.
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


INF = float("inf")


def values(dtype, per_rank):
    return lambda rank: torch.tensor(per_rank[rank], dtype=dtype)


def to(dtype):
    return lambda t: t.to(dtype)


# (reduce_op, source dtype, per-rank values, cast, keeps Partial)
CASES = [
    # max/min keep only order-preserving casts.
    ("max", torch.int32, [[200, -3], [100, 5]], to(torch.int8), False),
    ("max", torch.int64, [[-1, 7], [3, 2]], to(torch.uint8), False),
    ("min", torch.int32, [[-1, 300], [3, 2]], to(torch.uint8), False),
    ("max", torch.float32, [[-1.0, 2.5], [3.0, -4.0]], to(torch.uint8), False),
    # Float to integer is not monotone outside the target's range: inf, nan and
    # out-of-range values convert to arbitrary integers, narrow targets wrap.
    ("max", torch.float32, [[3.5, -9.0], [4.0, 2.0]], to(torch.int32), False),
    ("min", torch.float32, [[INF, 3.0], [7.0, INF]], to(torch.int64), False),
    ("min", torch.float32, [[40000.0, 3.0], [5.0, 2.0]], to(torch.int16), False),
    ("max", torch.float32, [[-200.0, 0.5], [0.5, 3.0]], to(torch.int8), False),
    ("max", torch.float32, [[1.0, -2.0], [2.0, -3.0]], to(torch.complex64), False),
    ("max", torch.bool, [[True, False], [False, False]], to(torch.complex64), False),
    ("max", torch.int32, [[3, -9], [4, 2]], to(torch.int64), True),
    ("max", torch.bool, [[True, False], [False, False]], to(torch.int32), True),
    # Rounding and overflow to inf are monotone: max/min keep narrowing float casts.
    ("min", torch.float64, [[3.5, -9.0], [4.0, 2.0]], to(torch.float16), True),
    ("max", torch.float32, [[70000.0, 1.0], [-70000.0, 2.0]], to(torch.float16), True),
    # Casts to integers truncate per rank; to bool is a threshold.
    ("sum", torch.complex64, [[0.5 + 1j], [0.5 - 1j]], to(torch.int32), False),
    ("sum", torch.float32, [[1.5, -0.5], [1.5, 2.0]], lambda t: t.int(), False),
    ("avg", torch.float32, [[1.5, 2.5], [2.5, 3.5]], lambda t: t.int(), False),
    ("sum", torch.float32, [[0.2, -0.1], [0.0, 0.0]], lambda t: t.bool(), False),
    (
        "sum",
        torch.float32,
        [[1.5, 2.0], [2.5, 3.0]],
        lambda t: t.type(torch.int64),
        False,
    ),
    # A bool "sum" saturates.
    ("sum", torch.bool, [[True, False], [True, True]], lambda t: t.long(), False),
    ("sum", torch.bool, [[True, False], [True, False]], to(torch.float32), False),
    # An integer sum to an integer of no more bits commutes (modulo 2**bits).
    ("sum", torch.int64, [[3, 1], [2**31, 2]], to(torch.int32), True),
    ("sum", torch.int8, [[100, -1], [100, 2]], to(torch.uint8), True),
    ("sum", torch.int16, [[30000, -5], [10000, 7]], to(torch.uint8), True),
    # Narrowing float casts overflow or round each rank's value before the sum.
    ("sum", torch.float32, [[70000.0, 1.0], [-70000.0, 2.0]], to(torch.float16), False),
    ("sum", torch.float32, [[100.3, 1.0], [-100.0, 2.0]], to(torch.bfloat16), False),
    ("avg", torch.float32, [[70000.0, 1.0], [-70000.0, 2.0]], to(torch.float16), False),
    ("sum", torch.float64, [[1e300, 1.0], [-1e300, 2.0]], to(torch.float32), False),
    ("sum", torch.float16, [[1.0029296875], [1.5068359375]], to(torch.bfloat16), False),
    (
        "sum",
        torch.complex128,
        [[1e300 + 1j], [-1e300 + 2j]],
        to(torch.complex64),
        False,
    ),
    # Casts that hold every source value keep the pending sum.
    ("sum", torch.bfloat16, [[1.0, 2.5], [2.0, -0.5]], to(torch.float32), True),
    ("sum", torch.float16, [[1.0, 2.5], [2.0, -0.5]], to(torch.float32), True),
    ("avg", torch.bfloat16, [[1.0, 2.5], [2.0, -0.5]], to(torch.float64), True),
    ("sum", torch.float32, [[0.5, 2.0], [1.5, 3.0]], to(torch.complex64), True),
    ("sum", torch.complex64, [[0.5 + 1j], [1.5 - 3j]], to(torch.float32), True),
]


class DistPartialDtypeCastTest(DTensorContinuousTestBase):
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

    def test_casts_match_reduce_then_cast(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"case": CASES, "inference": [False, True]}, self._check_cast, mesh
        )

    def test_mixed_precision_round_trip(self):
        # fp32 -> bf16 of a pending sum reduces in fp32 first (the cast narrows);
        # bf16 -> fp32 of a pending sum keeps it and reduces in fp32 later.
        mesh = self.build_device_mesh()
        make = values(torch.float32, [[1.0, 60000.0], [2.0, -50000.0]])
        for low in (torch.bfloat16, torch.float16):
            dt = self._partial(mesh, "sum", make)
            comm_mode = CommDebugMode()
            with comm_mode:
                down = dt.to(low)
            self.assertEqual(comm_mode.get_total_counts(), 1)
            self.assertEqual(down.placements, (Replicate(),))
            self.assertEqual(
                down.full_tensor(), self._truth("sum", make, torch.float32).to(low)
            )
            low_partial = self._partial(
                mesh, "sum", values(low, [[1.0, 3.0], [2.0, -0.5]])
            )
            comm_mode = CommDebugMode()
            with comm_mode:
                up = low_partial.float()
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(up.placements, (Partial("sum"),))
            self.assertEqual(up.full_tensor(), torch.tensor([3.0, 2.5]))


DistPartialDtypeCastTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialDtypeCastTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
