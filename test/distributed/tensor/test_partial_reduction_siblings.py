# Owner(s): ["oncall: distributed"]
"""Reductions of a Partial DTensor: every op built on _reduction_single_dim_strategy.

A Partial(r) input may give a Partial(r) output only when the op is the reduction r itself
(sum of a pending sum, max of a pending max, ...). linalg._powsum / _foreach_powsum reduce
|x|^p and nansum drops NaNs: their Partial(sum) inputs must be reduced first. The ground
truth reduces the per-rank values first, then applies the op.
"""

import math

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

aten, prims = torch.ops.aten, torch.ops.prims
REDUCE = {
    "sum": lambda t: t.sum(0),
    "avg": lambda t: t.mean(0),
    "max": lambda t: t.amax(0),
    "min": lambda t: t.amin(0),
    "product": lambda t: t.prod(0),
}
PER_RANK = [[1.0, 2.0], [-1.0, 2.0]]
NAN_PER_RANK = [[math.nan, 1.0], [5.0, 1.0]]


def first(fn):
    return lambda t: fn([t])[0]


# (name, reduce_op, op, per-rank values, keeps Partial)
CASES = [
    ("sum", "sum", torch.sum, PER_RANK, True),
    ("sum.dim_IntList", "sum", lambda t: t.sum(0), PER_RANK, True),
    ("prims.sum", "sum", lambda t: prims.sum(t, [0]), PER_RANK, True),
    ("prod", "product", torch.prod, PER_RANK, True),
    ("prod.dim_int", "product", lambda t: t.prod(0), PER_RANK, True),
    ("amax", "max", torch.amax, PER_RANK, True),
    ("max", "max", torch.max, PER_RANK, True),
    ("_foreach_max", "max", first(torch._foreach_max), PER_RANK, True),
    ("amin", "min", torch.amin, PER_RANK, True),
    ("min", "min", torch.min, PER_RANK, True),
    ("mean", "avg", torch.mean, PER_RANK, True),
    ("nansum", "sum", torch.nansum, NAN_PER_RANK, False),
    ("linalg._powsum(2)", "sum", lambda t: aten.linalg__powsum(t, 2), PER_RANK, False),
    ("linalg._powsum(1)", "sum", lambda t: aten.linalg__powsum(t, 1), PER_RANK, False),
    (
        "_foreach_powsum(2)",
        "sum",
        first(lambda ts: aten._foreach_powsum(ts, 2)),
        PER_RANK,
        False,
    ),
    ("vector_norm(2)", "sum", torch.linalg.vector_norm, PER_RANK, False),
    (
        "vector_norm(inf)",
        "max",
        lambda t: torch.linalg.vector_norm(t, math.inf),
        PER_RANK,
        False,
    ),
    ("_foreach_norm(2)", "sum", first(torch._foreach_norm), PER_RANK, False),
]


class DistPartialReductionSiblingsTest(DTensorContinuousTestBase):
    world_size = 2

    def _check(self, mesh, case):
        name, reduce_op, fn, per_rank, keeps = case
        local = map_local_for_rank(self.rank, lambda r: torch.tensor(per_rank[r]))
        dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
        truth = fn(REDUCE[reduce_op](torch.tensor(per_rank)))
        comm_mode = CommDebugMode()
        with comm_mode:
            out = fn(dt)
        self.assertEqual(
            out.placements, (Partial(reduce_op) if keeps else Replicate(),), name
        )
        self.assertEqual(comm_mode.get_total_counts(), 0 if keeps else 1, name)
        self.assertEqual(out.full_tensor(), truth, equal_nan=True, msg=name)

    def test_reductions_of_partial_inputs_match_reduce_then_op(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"case": CASES}, self._check, mesh)

    def test_integer_nansum_is_sum(self):
        # An integer has no NaN: its nansum is its sum, which keeps a pending
        # sum where it accumulates in the input's dtype (int8 wraps alike).
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        per_rank = [[100, 70, -100, 5], [100, 70, -100, -3]]
        reduced = torch.tensor(per_rank[0], dtype=torch.int8) + torch.tensor(
            per_rank[1], dtype=torch.int8
        )
        truth = torch.nansum(reduced, 0, dtype=torch.int8)
        for name in ("dtype=int8", "out=int8"):
            with self.subTest(name):
                local = map_local_for_rank(
                    self.rank, lambda r: torch.tensor(per_rank[r], dtype=torch.int8)
                )
                dt = DTensor.from_local(local, mesh, [Partial()], run_check=False)
                comm_mode = CommDebugMode()
                with comm_mode:
                    if name == "dtype=int8":
                        out = torch.nansum(dt, 0, dtype=torch.int8)
                    else:
                        out = DTensor.from_local(
                            torch.zeros((), dtype=torch.int8),
                            mesh,
                            [Partial()],
                            run_check=False,
                        )
                        torch.nansum(dt, 0, out=out)
                self.assertEqual(comm_mode.get_total_counts(), 0)
                self.assertEqual(out.placements, (Partial(),))
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)


DistPartialReductionSiblingsTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialReductionSiblingsTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
