# Owner(s): ["oncall: distributed"]
"""An integer Partial("avg") is reduced before mm, bmm, addmm, baddbmm and dot.

Their rules pass a Partial("avg") through each input linearly (one input Partial, the
others Replicate). An integer average truncates, so it is not linear: int64 locals
[[0, 1]] / [[1, 2]] / [[2, 3]] / [[3, 4]] of a Partial("avg") average to [[1, 2]]
(1.5 and 2.5 truncate), whose product with a Replicate [[2], [2]] is [[6]], while the
ranks' products [[2]], [[6]], [[10]], [[14]] average to [[8]]. Each case asserts the
value against the op on the reduced plain tensors, the placement and the collective
count. Floating inputs and an integer Partial("sum") keep their Partial with no
collective, as before.
"""

import math

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import maybe_disable_local_tensor_mode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)


_GLOO_AVG = 'gloo cannot reduce a Partial("avg"); the LocalTensor twin runs this'


def base(*shape):
    """Small values: neither a uint8 sum over 4 ranks nor a product wraps."""
    return torch.arange(torch.Size(shape).numel()).reshape(shape) % 3


def P(*shape):
    """A Partial operand: rank r holds base(shape) + r."""
    return ("P", shape)


def R(*shape):
    return ("R", shape)


# (name, fn, operands); the cases that take the matmul-like rules, directly or
# through a decomposition (matmul, einsum, tensordot, inner, linalg.multi_dot).
CASES = [
    ("mm(P, R)", torch.mm, [P(3, 2), R(2, 4)]),
    ("mm(R, P)", torch.mm, [R(3, 2), P(2, 4)]),
    ("bmm(P, R)", torch.bmm, [P(2, 3, 2), R(2, 2, 4)]),
    ("bmm(R, P)", torch.bmm, [R(2, 3, 2), P(2, 2, 4)]),
    ("dot(P, R)", torch.dot, [P(4), R(4)]),
    ("dot(R, P)", torch.dot, [R(4), P(4)]),
    ("addmm(P, P, R)", torch.addmm, [P(3, 4), P(3, 2), R(2, 4)]),
    ("addmm(P, R, P)", torch.addmm, [P(3, 4), R(3, 2), P(2, 4)]),
    ("addmm(R, P, R)", torch.addmm, [R(3, 4), P(3, 2), R(2, 4)]),
    (
        "addmm(P, R, R, beta=3)",
        lambda b, m1, m2: torch.addmm(b, m1, m2, beta=3),
        [P(3, 4), R(3, 2), R(2, 4)],
    ),
    (
        "addmm(P, P, R, beta=2, alpha=3)",
        lambda b, m1, m2: torch.addmm(b, m1, m2, beta=2, alpha=3),
        [P(4), P(3, 2), R(2, 4)],
    ),
    ("baddbmm(P, P, R)", torch.baddbmm, [P(2, 3, 4), P(2, 3, 2), R(2, 2, 4)]),
    ("baddbmm(R, R, P)", torch.baddbmm, [R(2, 3, 4), R(2, 3, 2), P(2, 2, 4)]),
    ("matmul 2-D (P, R)", torch.matmul, [P(3, 2), R(2, 4)]),
    ("matmul 3-D @ 2-D (P, R)", torch.matmul, [P(2, 3, 2), R(2, 4)]),
    ("matmul 1-D (R, P)", torch.matmul, [R(4), P(4)]),
    (
        "einsum bij,bjk->bik (R, P)",
        lambda a, b: torch.einsum("bij,bjk->bik", a, b),
        [R(2, 3, 2), P(2, 2, 4)],
    ),
    ("tensordot(P, R)", lambda a, b: torch.tensordot(a, b, 1), [P(3, 2), R(2, 4)]),
    ("inner(P, R)", torch.inner, [P(3, 2), R(4, 2)]),
    (
        "linalg.multi_dot(P, R, R)",
        lambda a, b, c: torch.linalg.multi_dot([a, b, c]),
        [P(3, 2), R(2, 4), R(4, 2)],
    ),
]


class DistPartialIntegerAvgMatmulTest(DTensorContinuousTestBase):
    world_size = 4

    def _mesh_2d(self):
        with maybe_disable_local_tensor_mode():
            return init_device_mesh(self.device_type, (2, 2))

    def _check(self, mesh, fn, operands, dtype, placements, out_placements, count):
        """fn on DTensors of ``operands`` against fn on the reduced tensors.

        A Partial operand takes ``placements`` (one Partial, the other mesh dims
        Replicate): rank r holds base + its coordinate on the Partial's mesh dim;
        a Replicate operand holds base + 1 on every rank.
        """
        (dim,) = [i for i, p in enumerate(placements) if isinstance(p, Partial)]
        reduce_op = placements[dim].reduce_op
        n = mesh.size(dim)

        def value(operand, coordinate):
            kind, shape = operand
            offset = 1 if kind == "R" else coordinate
            return (base(*shape) + offset).to(dtype)

        def reduced(operand):
            if operand[0] == "R":
                return value(operand, 0)
            values = torch.stack([value(operand, c) for c in range(n)])
            if reduce_op == "sum":
                return values.sum(0, dtype=dtype)
            if dtype.is_floating_point:
                return values.mean(0)
            return values.sum(0).div(n, rounding_mode="trunc").to(dtype)

        truth = fn(*[reduced(o) for o in operands])
        stride = math.prod(mesh.shape[dim + 1 :])
        inputs = []
        for operand in operands:
            local = map_local_for_rank(
                self.rank,
                lambda r, o=operand: value(o, r // stride % n),
            )
            inputs.append(
                DTensor.from_local(
                    local,
                    mesh,
                    placements if operand[0] == "P" else [Replicate()] * mesh.ndim,
                    run_check=False,
                )
            )
        comm_mode = CommDebugMode()
        with comm_mode:
            res = fn(*inputs)
        tol = {} if dtype.is_floating_point else {"atol": 0, "rtol": 0}
        self.assertEqual(res.dtype, truth.dtype)
        self.assertEqual(res.full_tensor(), truth, **tol)
        self.assertEqual(res.placements, tuple(out_placements))
        self.assertEqual(comm_mode.get_total_counts(), count)

    def test_integer_avg_partial_is_reduced_first(self):
        # Each kept the Partial("avg") with no collective and read the ranks'
        # truncated average of the products (mm(P, R): [[6, 10, 7, 6], ...]
        # for [[5, 8, 5, 5], ...] in int64).
        if dist.get_backend() == "gloo":
            self.skipTest(_GLOO_AVG)
        mesh = self.build_device_mesh()
        for dtype in (torch.int64, torch.uint8):
            for name, fn, operands in CASES:
                partials = sum(o[0] == "P" for o in operands)
                with self.subTest(name, dtype=dtype):
                    self._check(
                        mesh,
                        fn,
                        operands,
                        dtype,
                        [Partial("avg")],
                        [Replicate()],
                        partials,
                    )

    def test_integer_avg_partial_on_a_2d_mesh(self):
        # The rules are per mesh dim: a Partial("avg") on either dim of a 2x2
        # mesh is reduced on that dim only.
        if dist.get_backend() == "gloo":
            self.skipTest(_GLOO_AVG)
        mesh = self._mesh_2d()
        dtype = torch.int64
        cases = [
            ((Partial("avg"), Replicate()), (Replicate(), Replicate())),
            ((Replicate(), Partial("avg")), (Replicate(), Replicate())),
        ]
        for placements, out_placements in cases:
            for name, fn, operands in CASES[:5]:
                partials = sum(o[0] == "P" for o in operands)
                with self.subTest(name, placements=placements):
                    self._check(
                        mesh,
                        fn,
                        operands,
                        dtype,
                        placements,
                        out_placements,
                        partials,
                    )

    def test_floating_avg_and_integer_sum_keep_the_partial(self):
        # A floating average and an integer sum are linear: the rules keep the
        # Partial with no collective, as before.
        if dist.get_backend() == "gloo":
            self.skipTest(_GLOO_AVG)
        mesh = self.build_device_mesh()
        for dtype, reduce_op in (
            (torch.float32, "avg"),
            (torch.float64, "avg"),
            (torch.int64, "sum"),
            (torch.uint8, "sum"),
        ):
            for name, fn, operands in CASES:
                with self.subTest(name, dtype=dtype, reduce_op=reduce_op):
                    self._check(
                        mesh,
                        fn,
                        operands,
                        dtype,
                        [Partial(reduce_op)],
                        [Partial(reduce_op)],
                        0,
                    )


DistPartialIntegerAvgMatmulTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialIntegerAvgMatmulTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
