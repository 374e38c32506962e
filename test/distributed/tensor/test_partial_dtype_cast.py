# Owner(s): ["oncall: distributed"]
"""Dtype casts and view(dtype) of Partial DTensors, with and without inference mode.

The ground truth reduces the per-rank values first (in the source dtype, as the pending
reduction would) and then casts. A Partial placement may be kept only where the cast
commutes with the reduction; narrowing float casts keep it by design ("reduce in the lower
precision"), so mixed-precision casts of Partial gradients stay free of collectives.
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


def values(dtype, per_rank):
    return lambda rank: torch.tensor(per_rank[rank], dtype=dtype)


# (reduce_op, source dtype, per-rank values, cast, keeps Partial): the reported wrong
# results, which must reduce first, and casts that commute, which must not communicate.
CASES = [
    ("max", torch.int32, [[200, -3], [100, 5]], lambda t: t.to(torch.int8), False),
    ("max", torch.int64, [[-1, 7], [3, 2]], lambda t: t.to(torch.uint8), False),
    ("min", torch.int32, [[-1, 300], [3, 2]], lambda t: t.to(torch.uint8), False),
    (
        "max",
        torch.float32,
        [[-1.0, 2.5], [3.0, -4.0]],
        lambda t: t.to(torch.uint8),
        False,
    ),
    (
        "max",
        torch.float32,
        [[3.5, -9.0], [4.0, 2.0]],
        lambda t: t.to(torch.int32),
        True,
    ),
    (
        "sum",
        torch.complex64,
        [[0.5 + 1j], [0.5 - 1j]],
        lambda t: t.to(torch.int32),
        False,
    ),
    ("sum", torch.bool, [[True, False], [True, True]], lambda t: t.long(), False),
    (
        "sum",
        torch.bool,
        [[True, False], [True, False]],
        lambda t: t.to(torch.float32),
        False,
    ),
    (
        "max",
        torch.float32,
        [[1.0, -2.0], [2.0, -3.0]],
        lambda t: t.to(torch.complex64),
        False,
    ),
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
    ("sum", torch.int64, [[3, 1], [2**31, 2]], lambda t: t.to(torch.int32), True),
    # An integer sum wraps in the source dtype: a wider target, integer or floating,
    # would not wrap (int8 100 + 100 is -56). No wider bits, any signedness, commutes.
    ("sum", torch.int8, [[100, 1], [100, 2]], lambda t: t.to(torch.int32), False),
    ("sum", torch.uint8, [[200, 1], [100, 2]], lambda t: t.short(), False),
    ("sum", torch.int32, [[2**31 - 1, 1], [1, -2]], lambda t: t.long(), False),
    ("sum", torch.int8, [[100, 1], [100, 2]], lambda t: t.to(torch.float32), False),
    ("sum", torch.int32, [[2**31 - 1, 3], [1, -2]], lambda t: t.double(), False),
    ("sum", torch.int8, [[100, -1], [100, 2]], lambda t: t.to(torch.uint8), True),
    ("sum", torch.int16, [[30000, -5], [10000, 7]], lambda t: t.to(torch.uint8), True),
    (
        "max",
        torch.bool,
        [[True, False], [False, False]],
        lambda t: t.to(torch.complex64),
        False,
    ),
    ("max", torch.int32, [[3, -9], [4, 2]], lambda t: t.to(torch.int64), True),
    (
        "max",
        torch.bool,
        [[True, False], [False, False]],
        lambda t: t.to(torch.int32),
        True,
    ),
    (
        "min",
        torch.float64,
        [[3.5, -9.0], [4.0, 2.0]],
        lambda t: t.to(torch.float16),
        True,
    ),
    (
        "sum",
        torch.float32,
        [[0.5, 2.0], [1.5, 3.0]],
        lambda t: t.to(torch.complex64),
        True,
    ),
]


def convert_element_type(dtype):
    return lambda t: torch.ops.prims.convert_element_type.default(t, dtype)


# prims.convert_element_type (decompositions, torch.compile graphs) follows _to_copy's rule.
PRIMS_CASES = [
    (
        "sum",
        torch.float32,
        [[1.0, 2.5], [2.0, -0.5]],
        convert_element_type(torch.bfloat16),
        True,
    ),
    (
        "sum",
        torch.bfloat16,
        [[1.0, 2.5], [2.0, -0.5]],
        convert_element_type(torch.float32),
        True,
    ),
    ("sum", torch.int8, [[100, 1], [100, 2]], convert_element_type(torch.int32), False),
    (
        "sum",
        torch.float32,
        [[1.5, -0.5], [1.5, 2.0]],
        convert_element_type(torch.int32),
        False,
    ),
    (
        "max",
        torch.int32,
        [[200, -3], [100, 5]],
        convert_element_type(torch.int8),
        False,
    ),
    ("max", torch.int32, [[3, -9], [4, 2]], convert_element_type(torch.int64), True),
]


class DistPartialDtypeCastTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

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
        self.assertEqual(full, truth, atol=0, rtol=0)
        expected = Partial(reduce_op) if keeps else Replicate()
        self.assertEqual(out.placements, (expected,))
        self.assertEqual(comm_mode.get_total_counts(), 0 if keeps else 1)

    @with_comms
    def test_casts_match_reduce_then_cast(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"case": CASES, "inference": [False, True]}, self._check_cast, mesh
        )

    @with_comms
    def test_convert_element_type_matches_reduce_then_cast(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"case": PRIMS_CASES, "inference": [False, True]}, self._check_cast, mesh
        )

    @with_comms
    def test_mixed_precision_round_trip_keeps_partial_without_collectives(self):
        mesh = self.build_device_mesh()
        make = values(torch.float32, [[1.0, 60000.0], [2.0, -50000.0]])
        for low in (torch.bfloat16, torch.float16):
            dt = self._partial(mesh, "sum", make)
            comm_mode = CommDebugMode()
            with comm_mode:
                down = dt.to(low)
                up = down.float()
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(up.placements, (Partial("sum"),))
            # Pinned: the pending sum happens in the lower precision, of per-rank casts.
            per_rank = [make(r).to(low) for r in range(self.world_size)]
            self.assertEqual(down.full_tensor(), torch.stack(per_rank).sum(0).to(low))

    def _check_view(self, mesh, reduce_op):
        make = values(torch.float32, [[1.0, -2.0], [2.0, 0.5]])
        dt = self._partial(mesh, reduce_op, make)
        truth = self._truth(reduce_op, make, torch.float32).view(torch.int32)
        out = dt.view(torch.int32)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        same = self._partial(mesh, reduce_op, make).view(torch.float32)
        self.assertEqual(same.placements, (Partial(reduce_op),))

    @with_comms
    def test_view_dtype_reduces_first(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"reduce_op": list(REDUCTIONS)}, self._check_view, mesh)


DistPartialDtypeCastTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialDtypeCastTest
)


if __name__ == "__main__":
    run_tests()
