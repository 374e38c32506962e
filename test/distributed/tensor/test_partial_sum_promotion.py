# Owner(s): ["oncall: distributed"]
"""Ops that compute an integer or bool Partial("sum") DTensor in another dtype.

c10d sums an integer Partial("sum") in its own dtype, wrapping (int8 100 + 100 is
-56), and a bool one saturating (True on two ranks reads True). An op that computes
in another dtype (int8 ``sum()`` in int64, ``x * 0.5`` and true division in float32,
int8 + int32) gives the op on the reduced value only if it reduces first. Each case
asserts the value against the op on the reduced plain tensors, the placement and the
collective count; the cases that keep their Partial show the check costs nothing
where the op computes in the input's dtype.
"""

import contextlib
import itertools
import operator
from unittest import mock

import torch
import torch.distributed.tensor._sharding_prop as sharding_prop
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
import torch.distributed as dist
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Partial,
    Replicate,
    Shard,
)
from torch.distributed.tensor._ops.single_dim_strategy import (
    _PreparedSingleDimStrategy,
)
from torch.distributed.tensor._sharding_prop import _select_min_cost_strategy
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
)

from test_partial_rsub import (  # the test file of the rsub PR, before this one
    operand_dtensor,
    P,
    R,
    reduced_value,
)
from test_single_dim_partial_placeholder import (  # the placeholder PR's test file
    FakeMeshMixin,
)


i8, u8, i16, i32, i64, f16, f32 = (
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
)
B = torch.bool


WRAP = {  # per-rank values whose sum wraps (or saturates) in the dtype
    i8: ([[100, 70], [1, 3]], [[100, 70], [2, 2]]),
    u8: ([[200, 100], [1, 3]], [[100, 100], [2, 2]]),
    i16: ([[30000, 20000], [1, 3]], [[30000, 20000], [2, 2]]),
    i32: ([[2**31 - 1, 2**30 + 3], [1, 3]], [[2**31 - 1, 2**30 + 3], [2, 2]]),
    i64: ([[2**62, 2**24 + 1], [1, 3]], [[2**62, 1], [2, 2]]),
    B: ([[True, True], [False, True]], [[True, False], [True, True]]),
    f32: ([[1.5, -2.25], [1.0, 3.0]], [[1.5, 0.5], [2.0, 2.0]]),
}


def wrap(dtype):
    return P(dtype, *WRAP[dtype])


R_F32 = R(f32, [[1.5, 2.0], [0.25, 3.0]])

# (name, fn, operands: the first is the Partial under test, reduced: True when the
#  result is Replicate after reducing the Partial operands, collectives)
REDUCED = [
    ("int8 sum", lambda x: x.sum(), [wrap(i8)], 1),
    ("uint8 sum.dim_IntList", lambda x: x.sum(dim=1), [wrap(u8)], 1),
    ("int16 sum(dtype=float32)", lambda x: x.sum(dtype=f32), [wrap(i16)], 1),
    ("int32 prims.sum", lambda x: torch.ops.prims.sum(x, [0]), [wrap(i32)], 1),
    ("int8 nansum", lambda x: x.nansum(), [wrap(i8)], 1),
    ("bool nansum", lambda x: x.nansum(dim=1), [wrap(B)], 1),
    ("int32 cumsum", lambda x: x.cumsum(0), [wrap(i32)], 1),
    ("bool cumsum", lambda x: x.cumsum(1), [wrap(B)], 1),
    ("int8 cumsum(dtype=float32)", lambda x: x.cumsum(0, dtype=f32), [wrap(i8)], 1),
    ("bool mul int", lambda x: x * 2, [wrap(B)], 1),
    ("int8 mul float", lambda x: x * 0.5, [wrap(i8)], 1),
    ("int64 mul float Replicate", lambda x, r: x * r, [wrap(i64), R_F32], 1),
    ("uint8 div", lambda x: x / 2, [wrap(u8)], 1),
    ("int16 div float Replicate", lambda x, r: x / r, [wrap(i16), R_F32], 1),
    ("int16 add int32 Partial", operator.add, [wrap(i16), wrap(i32)], 2),
    ("bool add float32 Partial", operator.add, [wrap(B), wrap(f32)], 2),
    ("float32 sub int32 Partial", operator.sub, [wrap(f32), wrap(i32)], 2),
    ("float32 rsub int32 Partial", torch.rsub, [wrap(f32), wrap(i32)], 2),
    ("int32 xlog1py", torch.special.xlog1py, [wrap(i32), R_F32], 1),
    (
        "int8 _foreach_mul float",
        lambda x: torch._foreach_mul([x], 0.5)[0],
        [wrap(i8)],
        1,
    ),
    ("bool _foreach_mul int", lambda x: torch._foreach_mul([x], 2)[0], [wrap(B)], 1),
    (
        "int32 _foreach_mul float Replicate",
        lambda x, r: torch._foreach_mul([x], [r])[0],
        [wrap(i32), R_F32],
        1,
    ),
    ("int64 _foreach_div", lambda x: torch._foreach_div([x], 2)[0], [wrap(i64)], 1),
    # Not only integers: the reduction's dtype is a cast of each rank's value.
    ("float32 sum(dtype=int32)", lambda x: x.sum(dtype=i32), [wrap(f32)], 1),
    (
        "float32 avg mean(dtype=float16)",
        lambda x: x.mean(dtype=f16),
        [P(f32, [70000.0, 1.0], [-70000.0, 3.0], "avg")],
        1,
    ),
    # A 0-dim operand does not decide the dtype: a 0-dim float32 with a 1-D
    # float16 or bfloat16 operand computes in the narrower dtype.
    (
        "0-dim float32 add 1-D float16 Replicate",
        operator.add,
        [P(f32, 70000.0, -70000.0), R(f16, [1.0, 2.0])],
        1,
    ),
    (
        "0-dim float32 mul 1-D bfloat16 Replicate",
        operator.mul,
        [P(f32, 100.3, -100.0), R(torch.bfloat16, [1.0, 3.0])],
        1,
    ),
    # An integer average truncates, so it is not linear even in its own dtype:
    # twice the average of [1, 2] and [2, 4] is [2, 6], not [3, 6].
    ("int8 avg mul int", lambda x: x * 2, [P(i8, [1, 2], [2, 4], "avg")], 1),
    ("int64 avg cumsum", lambda x: x.cumsum(0), [P(i64, [1, 1], [0, 0], "avg")], 1),
    # cat and stack promote their inputs; slice_scatter and index_fill cast src
    # and value into self's dtype.
    (
        "cat int8 int32 Partials",
        lambda x, y: torch.cat([x, y]),
        [wrap(i8), wrap(i32)],
        2,
    ),
    (
        "cat bool int64 Partials",
        lambda x, y: torch.cat([x, y]),
        [wrap(B), wrap(i64)],
        2,
    ),
    (
        "stack int8 int32 Partials",
        lambda x, y: torch.stack([x, y]),
        [wrap(i8), wrap(i32)],
        2,
    ),
    (
        "slice_scatter int32 self int8 src",
        lambda x, y: torch.slice_scatter(x, y[:, :1], 1, 0, 1),
        [wrap(i32), wrap(i8)],
        2,
    ),
    (
        "index_fill int32 self int8 value",
        lambda x, i, v: torch.index_fill(x, 1, i, v),
        [wrap(i32), R(i64, [0]), P(i8, 100, 100)],
        2,
    ),
]


def _inplace_foreach_mul(scalar):
    def fn(x):
        torch._foreach_mul_([x], scalar)
        return x

    return fn


# Ops that compute in the input's dtype keep the Partial, with no collective.
KEPT = [
    ("int64 sum", lambda x: x.sum(), [wrap(i64)]),
    ("int64 cumsum", lambda x: x.cumsum(0), [wrap(i64)]),
    ("int8 mul int", lambda x: x * 2, [wrap(i8)]),
    ("bool mul True", lambda x: x * True, [wrap(B)]),
    ("int8 add int8 Partial", operator.add, [wrap(i8), wrap(i8)]),
    ("bool add bool Partial", operator.add, [wrap(B), wrap(B)]),
    ("int16 sum(dtype=int8)", lambda x: x.sum(dtype=i8), [wrap(i16)]),
    ("int8 nansum(dtype=int8)", lambda x: x.nansum(dtype=i8), [wrap(i8)]),
    ("float32 mul float", lambda x: x * 0.5, [wrap(f32)]),
    ("float32 div", lambda x: x / 3, [wrap(f32)]),
    ("float32 sum", lambda x: x.sum(), [wrap(f32)]),
    (
        "float16 sum(dtype=float32)",
        lambda x: x.sum(dtype=f32),
        [P(f16, [[1.5, 2.0]], [[0.25, 3.0]])],
    ),
    ("float32 mul int32 Replicate", lambda x, r: x * r, [wrap(f32), R(i32, [3])]),
    # An in-place op computes into its self's dtype, whatever its scalar or
    # its other operand's dtype (int32 wraps into int8 like the pending sum).
    ("int8 _foreach_mul_ int", _inplace_foreach_mul(2), [wrap(i8)]),
    ("int64 _foreach_mul_ [int]", _inplace_foreach_mul([3]), [wrap(i64)]),
    ("bool _foreach_mul_ True", _inplace_foreach_mul(True), [wrap(B)]),
    ("int8 add_ int32 Partial", lambda x, y: x.add_(y), [wrap(i8), wrap(i32)]),
    # Inputs of one dtype, or casts that commute with the sum (int32 narrowed
    # into int8 wraps like the int8 sum; float16 widened into float32).
    ("cat int8 Partials", lambda x, y: torch.cat([x, y]), [wrap(i8), wrap(i8)]),
    (
        "cat float16 float32 Partials",
        lambda x, y: torch.cat([x, y]),
        [P(f16, [[1.5, 2.0]], [[0.25, 3.0]]), P(f32, [[1.0, 2.5]], [[4.0, 0.5]])],
    ),
    (
        "slice_scatter int8 self int32 src",
        lambda x, y: torch.slice_scatter(x, y[:, :1], 1, 0, 1),
        [wrap(i8), wrap(i32)],
    ),
]

# out= of the dtype the op casts its result back into (no wider than the dtype
# it computes in), as an in-place op does into its self: the pending sum
# survives when each input's cast into out's dtype commutes with it.
OUT_KEPT = [
    ("add int8 int32 out=int8", torch.add, [wrap(i8), wrap(i32)], i8),
    ("mul int8 by int32 Replicate out=int8", torch.mul, [wrap(i8), R(i32, [3])], i8),
    (
        "mul float16 by float32 Replicate out=float16",
        torch.mul,
        [P(f16, [[1.5, 2.0]], [[0.25, 3.0]]), R(f32, [[2.0, 0.5]])],
        f16,
    ),
    (
        "cat int8 int32 out=int8",
        lambda x, y, out=None: torch.cat([x, y], out=out),
        [wrap(i8), wrap(i32)],
        i8,
    ),
]

# gloo cannot all-reduce int16 ("Invalid scalar type", on main too); the
# LocalTensor twin checks those cases.
GLOO_CANNOT_REDUCE = (torch.int16,)


class DistPartialSumPromotionTest(DTensorContinuousTestBase):
    world_size = 2

    def _dtensor(self, mesh, operand):
        return operand_dtensor(mesh, self.rank, operand)

    def _check(self, mesh, name, fn, operands, placement, collectives):
        if dist.get_backend() == "gloo" and any(
            o[2] in GLOO_CANNOT_REDUCE or (o[1] == "avg" and not o[2].is_floating_point)
            for o in operands
        ):
            # the LocalTensor twin checks this case (reducing an integer
            # Partial("avg") over gloo raises "result type Float can't be
            # cast to the desired output type")
            return
        truth = fn(*[reduced_value(o) for o in operands])
        inputs = [self._dtensor(mesh, o) for o in operands]
        comm_mode = CommDebugMode()
        with comm_mode:
            out = fn(*inputs)
        full = out.full_tensor()
        self.assertEqual(full.dtype, truth.dtype, msg=name)
        exact = not operands[0][2].is_floating_point
        tol = {"atol": 0, "rtol": 0} if exact else {}
        self.assertEqual(full, truth, equal_nan=True, msg=name, **tol)
        self.assertEqual(out.placements, (placement,), msg=name)
        self.assertEqual(comm_mode.get_total_counts(), collectives, msg=name)

    def test_an_op_that_promotes_reduces_first(self):
        mesh = self.build_device_mesh()
        for name, fn, operands, collectives in REDUCED:
            with self.subTest(name):
                self._check(mesh, name, fn, operands, Replicate(), collectives)

    def test_an_op_in_the_input_dtype_keeps_the_partial(self):
        mesh = self.build_device_mesh()
        for name, fn, operands in KEPT:
            with self.subTest(name):
                self._check(mesh, name, fn, operands, Partial(), 0)

    def test_an_out_of_another_dtype(self):
        # out= casts each rank's result: int8 + int8 wraps in int8 before the
        # int32 out, so a pending sum cannot be written into a Partial int32
        # out (it raises rather than return [-112, -232, 6] for [-112, 24, 6]);
        # a Replicate out gets the reduced value.
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        x = wrap(i8)
        truth = (reduced_value(x) + reduced_value(x)).to(i32)
        zeros = [[0, 0], [0, 0]]
        out = self._dtensor(mesh, P(i32, zeros, zeros))
        with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
            torch.add(self._dtensor(mesh, x), self._dtensor(mesh, x), out=out)
        out = self._dtensor(mesh, R(i32, zeros))
        torch.add(self._dtensor(mesh, x), self._dtensor(mesh, x), out=out)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # A widening float out keeps the pending sum.
        y = wrap(f32)
        out = self._dtensor(mesh, P(torch.float64, zeros, zeros))
        comm_mode = CommDebugMode()
        with comm_mode:
            torch.add(self._dtensor(mesh, y), self._dtensor(mesh, y), out=out)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.placements, (Partial(),))
        self.assertEqual(
            out.full_tensor(), (reduced_value(y) + reduced_value(y)).double()
        )

    def test_an_out_the_result_is_cast_back_into(self):
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        for name, fn, operands, out_dtype in OUT_KEPT:
            with self.subTest(name):
                plain = [reduced_value(o) for o in operands]
                # out= casts the computed result into out's dtype
                truth = fn(*plain).to(out_dtype)
                zeros = torch.zeros_like(truth).tolist()
                out = self._dtensor(mesh, P(out_dtype, zeros, zeros))
                comm_mode = CommDebugMode()
                with comm_mode:
                    fn(*[self._dtensor(mesh, o) for o in operands], out=out)
                self.assertEqual(comm_mode.get_total_counts(), 0)
                self.assertEqual(out.placements, (Partial(),))
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # A wider out still does not keep the pending sum: cat.out casts each
        # int8 input into the int32 out, where the int8 sum does not wrap.
        x = wrap(i8)
        zeros = [[0, 0]] * 4
        out = self._dtensor(mesh, P(i32, zeros, zeros))
        with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
            torch.cat([self._dtensor(mesh, x), self._dtensor(mesh, x)], out=out)
        out = self._dtensor(mesh, R(i32, zeros))
        torch.cat([self._dtensor(mesh, x), self._dtensor(mesh, x)], out=out)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(
            out.full_tensor(),
            torch.cat([reduced_value(x), reduced_value(x)]).to(i32),
            atol=0,
            rtol=0,
        )

    def _run_out(self, fn, operands, out):
        """fn(*operands, out=out) on DTensors; returns the collective count."""
        comm_mode = CommDebugMode()
        with comm_mode:
            fn(*operands, out=out)
        return comm_mode.get_total_counts()

    def test_an_in_place_or_out_variant_accumulates_in_its_dtype(self):
        # cumsum_ accumulates in self's dtype, cumsum.out and sum.IntList_out
        # in out's: an integer pending sum wraps alike and stays pending (they
        # used to be checked as accumulating in int64, and raised).
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        for dtype in (i8, u8, i16, i32):
            x = wrap(dtype)
            reduced = reduced_value(x)
            with self.subTest("cumsum_", dtype=dtype):
                t = self._dtensor(mesh, x)
                comm_mode = CommDebugMode()
                with comm_mode:
                    t.cumsum_(0)
                self.assertEqual(comm_mode.get_total_counts(), 0)
                self.assertEqual(t.placements, (Partial(),))
                self.assertEqual(t.full_tensor(), reduced.clone().cumsum_(0))
            for name, fn, truth in [
                (
                    "cumsum.out",
                    lambda a, out: torch.cumsum(a, 0, out=out),
                    reduced.cumsum(0).to(dtype),
                ),
                (
                    "sum.IntList_out",
                    lambda a, out: torch.sum(a, 0, out=out),
                    reduced.sum(0).to(dtype),
                ),
                (
                    "nansum.out",
                    lambda a, out: torch.nansum(a, 0, out=out),
                    reduced.sum(0).to(dtype),
                ),
            ]:
                with self.subTest(name, dtype=dtype):
                    zeros = torch.zeros_like(truth).tolist()
                    out = self._dtensor(mesh, P(dtype, zeros, zeros))
                    count = self._run_out(fn, [self._dtensor(mesh, x)], out)
                    self.assertEqual(count, 0)
                    self.assertEqual(out.placements, (Partial(),))
                    self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # A wider out does not wrap where the int8 sum does: it reduces first
        # (a Partial out raises). The sharding cache tells the outs apart.
        x = wrap(i8)
        truth = torch.cumsum(reduced_value(x), 0, dtype=i32)
        zeros = torch.zeros_like(truth).tolist()
        # (the error names out's placement and what to do)
        with self.assertRaisesRegex(
            RuntimeError,
            r"no valid sharding strategy.*placement \(Partial\(sum\),\) of out=.*"
            r"Pass a Replicate out",
        ):
            self._run_out(
                lambda a, out: torch.cumsum(a, 0, out=out),
                [self._dtensor(mesh, x)],
                self._dtensor(mesh, P(i32, zeros, zeros)),
            )
        out = self._dtensor(mesh, R(i32, zeros))
        count = self._run_out(
            lambda a, out: torch.cumsum(a, 0, out=out), [self._dtensor(mesh, x)], out
        )
        self.assertEqual(count, 1)
        self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # A float16 out of a float32 sum rounds (and overflows) each rank's
        # sum: a Partial out raises, a Replicate one gets the reduced sum.
        z = P(f32, [[70000.0, 1.0]], [[-70000.0, 3.0]])
        sum_out = lambda a, out: torch.sum(a, 1, out=out)  # noqa: E731
        with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
            self._run_out(
                sum_out,
                [self._dtensor(mesh, z)],
                self._dtensor(mesh, P(f16, [0.0], [0.0])),
            )
        out = self._dtensor(mesh, R(f16, [0.0]))
        self.assertEqual(self._run_out(sum_out, [self._dtensor(mesh, z)], out), 1)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.full_tensor(), reduced_value(z).sum(1).to(f16))
        # mean.dtype_out averages in out's dtype: a float16 out rounds (and
        # overflows) each rank's float32 value before the average, so the
        # input is reduced first (a float16 Partial("avg") out then holds the
        # same mean on every rank).
        y = P(f32, [[70000.0, 1.0]], [[-70000.0, 3.0]], "avg")
        mean_out = torch.ops.aten.mean.dtype_out
        for out_dtype, placement, collectives in [
            (f32, Partial("avg"), 0),
            (f16, Replicate(), 1),
            (f16, Partial("avg"), 1),
        ]:
            with self.subTest("mean.dtype_out", out_dtype=out_dtype):
                if placement == Replicate():
                    out = self._dtensor(mesh, R(out_dtype, 0.0))
                else:
                    out = self._dtensor(mesh, P(out_dtype, 0.0, 0.0, "avg"))
                count = self._run_out(
                    lambda a, out: mean_out(a, out=out), [self._dtensor(mesh, y)], out
                )
                self.assertEqual(count, collectives)
                self.assertEqual(out.placements, (placement,))
                self.assertEqual(
                    out.full_tensor(),
                    mean_out(reduced_value(y), out=torch.empty((), dtype=out_dtype)),
                )

    def test_a_max_or_min_out_that_holds_the_partial_operand(self):
        # maximum/minimum return one of their operands: where the Partial
        # operand's dtype casts into out's keeping order, a Replicate value out
        # cannot hold is every rank's result (above its range) or none's, so
        # the pending max/min survives the cast into out.
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        xs = [[-100, 5, 127, -128]], [[3, -7, 0, -1]]
        cases = [
            (
                "maximum int8 P(max) int32 R",
                torch.maximum,
                "max",
                [[2**20, -(2**20), 100, 255]],
                i32,
            ),
            (
                "minimum int8 P(min) int64 R",
                torch.minimum,
                "min",
                [[2**40, -(2**40), 100, 255]],
                i64,
            ),
        ]
        for name, fn, reduce_op, r, r_dtype in cases:
            with self.subTest(name):
                x = P(i8, *xs, reduce_op)
                y = R(r_dtype, r)
                zeros = [[0, 0, 0, 0]]
                out = self._dtensor(mesh, P(i8, zeros, zeros, reduce_op))
                ops = [self._dtensor(mesh, x), self._dtensor(mesh, y)]
                count = self._run_out(fn, ops, out)
                self.assertEqual(count, 0)
                self.assertEqual(out.placements, (Partial(reduce_op),))
                truth = fn(reduced_value(x), reduced_value(y)).to(i8)
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # uint8 and int8 operands: each rank's maximum lies in [0, 255] (its
        # minimum in [-128, 127]), which a uint8 (an int8) out holds, whatever
        # the int8 (uint8) operand's values: the Partial stays pending.
        u = [[0, 200, 3]], [[7, 1, 3]]
        s8 = [[-128, 127, -1]], [[100, -5, 4]]
        for name, fn, reduce_op, x, y, out_dtype in [
            ("maximum u8 P(max) i8 P(max)", torch.maximum, "max", u, s8, u8),
            ("maximum u8 R i8 P(max)", torch.maximum, "max", None, s8, u8),
            ("fmax u8 P(max) i8 P(max)", torch.fmax, "max", u, s8, u8),
            ("minimum u8 P(min) i8 P(min)", torch.minimum, "min", u, s8, i8),
            # the other direction's rules: max(c, min_k a_k) = min_k max(c, a_k)
            # lies in [0, 255] on every rank too
            ("maximum u8 R i8 P(min)", torch.maximum, "min", None, s8, u8),
            ("minimum u8 P(max) i8 R", torch.minimum, "max", u, None, i8),
        ]:
            with self.subTest(name):
                x = R(u8, u[0]) if x is None else P(u8, *x, reduce_op)
                y = R(i8, s8[0]) if y is None else P(i8, *y, reduce_op)
                zeros = [[0, 0, 0]]
                out = self._dtensor(mesh, P(out_dtype, zeros, zeros, reduce_op))
                ops = [self._dtensor(mesh, x), self._dtensor(mesh, y)]
                self.assertEqual(self._run_out(fn, ops, out), 0)
                self.assertEqual(out.placements, (Partial(reduce_op),))
                truth = fn(reduced_value(x), reduced_value(y)).to(out_dtype)
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # Operands carrying the other Partial type than out's (or a
        # Partial("sum")), which DTensor does not redistribute into out's:
        # the all-Replicate rule reduces them (it is expanded only for such
        # operands, so the calls above see the op's own rules alone).
        for name, fn, x, y, out_reduce_op, collectives in [
            ("maximum u8 P(max) i8 P(max) out=P(min)", torch.maximum,
             P(u8, *u, "max"), P(i8, *s8, "max"), "min", 2),
            ("maximum u8 P(min) i8 P(min) out=P(max)", torch.maximum,
             P(u8, *u, "min"), P(i8, *s8, "min"), "max", 2),
            ("maximum u8 P(min) i8 R out=P(max)", torch.maximum,
             P(u8, *u, "min"), R(i8, s8[0]), "max", 1),
            ("maximum u8 P(sum) i8 R out=P(max)", torch.maximum,
             P(u8, [[0, 100, 3]], [[7, 100, 0]]), R(i8, s8[0]), "max", 1),
        ]:  # fmt: skip
            with self.subTest(name):
                zeros = [[0, 0, 0]]
                out = self._dtensor(mesh, P(u8, zeros, zeros, out_reduce_op))
                ops = [self._dtensor(mesh, x), self._dtensor(mesh, y)]
                self.assertEqual(self._run_out(fn, ops, out), collectives)
                self.assertEqual(out.placements, (Partial(out_reduce_op),))
                truth = fn(reduced_value(x), reduced_value(y)).to(u8)
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # Not a selection: int8 + int32 wraps into the int8 out per rank, so
        # the Partial operand is reduced first (the Partial(max) out then
        # holds the same value on every rank).
        x = P(i8, [[100, 20]], [[20, 100]], "max")
        y = R(i32, [[100, 100]])
        out = self._dtensor(mesh, P(i8, [[0, 0]], [[0, 0]], "max"))
        count = self._run_out(
            torch.add, [self._dtensor(mesh, x), self._dtensor(mesh, y)], out
        )
        self.assertEqual(count, 1)
        self.assertEqual(out.placements, (Partial("max"),))
        truth = (reduced_value(x) + reduced_value(y)).to(i8)
        self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # A Partial operand out's dtype does not hold is reduced first.
        x = P(i16, [[300, 100]], [[100, 300]], "max")
        out = self._dtensor(mesh, P(i8, [[0, 0]], [[0, 0]], "max"))
        count = self._run_out(
            torch.maximum,
            [self._dtensor(mesh, x), self._dtensor(mesh, R(i8, [[0, 0]]))],
            out,
        )
        self.assertEqual(count, 1)
        self.assertEqual(
            out.full_tensor(), torch.tensor([[44, 44]], dtype=i8), atol=0, rtol=0
        )

    def test_nan_to_num_scalars_do_not_promote_an_integer_input(self):
        # nan_to_num converts nan, posinf and neginf into the input's dtype (an
        # integer or bool input has none to replace): its out= of the input's
        # dtype is no cast, and a Partial("max"/"min") input stays pending.
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        for reduce_op in ("max", "min"):
            for name, x, kwargs in [
                ("int8 nan=3.0", P(i8, [[127, 0, 1, -128]], [[-128, 1, 0, 3]], reduce_op), {"nan": 3.0}),
                ("int32 posinf, neginf", P(i32, [[5, -7]], [[-2, 9]], reduce_op), {"posinf": 1e30, "neginf": -1e30}),
                ("bool nan=3.0", P(torch.bool, [[True, False, True]], [[False, False, True]], reduce_op), {"nan": 3.0}),
            ]:  # fmt: skip
                with self.subTest(name, reduce_op=reduce_op):
                    plain = reduced_value(x)
                    zeros = [[0] * plain.shape[-1]]
                    out = self._dtensor(mesh, P(x[2], zeros, zeros, reduce_op))
                    count = self._run_out(
                        lambda t, out: torch.nan_to_num(t, **kwargs, out=out),
                        [self._dtensor(mesh, x)],
                        out,
                    )
                    self.assertEqual(count, 0)
                    self.assertEqual(out.placements, (Partial(reduce_op),))
                    truth = torch.nan_to_num(plain, **kwargs)
                    self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)

    def test_a_replicate_operand_into_a_max_min_or_avg_partial(self):
        # Every rank computes the same value from Replicate operands, and one
        # value on every rank is a Partial("max"/"min"/"avg") of itself in any
        # dtype: an out or a self of another dtype keeps it, with no
        # collective (a Replicate operand of another dtype used to be checked
        # as if it were the Partial one, and raised).
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        a = R(i32, [300, -300, 100, 7])
        b = R(i32, [0, 0, 200, 1])
        for name, fn, out_dtype, reduce_op in [
            ("maximum out=int8 P(max)", torch.maximum, i8, "max"),
            ("minimum out=uint8 P(min)", torch.minimum, u8, "min"),
        ]:
            with self.subTest(name):
                out = self._dtensor(mesh, P(out_dtype, [0] * 4, [0] * 4, reduce_op))
                ops = [self._dtensor(mesh, a), self._dtensor(mesh, b)]
                self.assertEqual(self._run_out(fn, ops, out), 0)
                self.assertEqual(out.placements, (Partial(reduce_op),))
                truth = fn(reduced_value(a), reduced_value(b)).to(out_dtype)
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # mean.dtype_out of a Replicate float32 into a float16 Partial("avg")
        with self.subTest("mean.dtype_out out=float16 P(avg)"):
            x = R(f32, [1.0, 2.0, 3.0, 5.0])
            out = self._dtensor(mesh, P(f16, 0.0, 0.0, "avg"))
            mean_out = torch.ops.aten.mean.dtype_out
            count = self._run_out(
                lambda t, out: mean_out(t, out=out), [self._dtensor(mesh, x)], out
            )
            self.assertEqual(count, 0)
            self.assertEqual(out.placements, (Partial("avg"),))
            self.assertEqual(out.full_tensor(), torch.tensor(2.75, dtype=f16))
        # A pointwise out= of float16 from float32 Replicate operands keeps the
        # float16 Partial("avg") out, as mean.dtype_out does.
        for name, fn in [("add", torch.add), ("mul", torch.mul), ("sub", torch.sub)]:
            with self.subTest(f"{name} out=float16 P(avg)"):
                a_f, b_f = R(f32, [1.5, 2.0, -3.0]), R(f32, [0.25, 4.0, 1.0])
                out = self._dtensor(mesh, P(f16, [0.0] * 3, [0.0] * 3, "avg"))
                ops = [self._dtensor(mesh, a_f), self._dtensor(mesh, b_f)]
                self.assertEqual(self._run_out(fn, ops, out), 0)
                self.assertEqual(out.placements, (Partial("avg"),))
                truth = fn(reduced_value(a_f), reduced_value(b_f)).to(f16)
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # Integer and bool true division computes in float32: a float32
        # Partial("avg") out is the same quotient on every rank (it raised:
        # the integer Partial("avg") input rule was dropped and no rule from
        # Replicate inputs was added, the out having the computed dtype).
        for dtype in (i32, B):
            with self.subTest("div out=float32 P(avg)", dtype=dtype):
                a_i, b_i = R(dtype, [1, 7, 1]), R(dtype, [3, 2, 1])
                out = self._dtensor(mesh, P(f32, [0.0] * 3, [0.0] * 3, "avg"))
                ops = [self._dtensor(mesh, a_i), self._dtensor(mesh, b_i)]
                self.assertEqual(self._run_out(torch.div, ops, out), 0)
                self.assertEqual(out.placements, (Partial("avg"),))
                truth = torch.div(reduced_value(a_i), reduced_value(b_i))
                self.assertEqual(out.full_tensor(), truth, atol=0, rtol=0)
        # Where no rule gives out's placement from Replicate inputs, the
        # error does not ask to redistribute them.
        with self.assertRaisesRegex(
            RuntimeError,
            r"placement \(Partial\(sum\),\) of out=: no rule of the op gives "
            r"that placement from Replicate inputs.*Pass a Replicate out\.",
        ):
            self._run_out(
                lambda a, out: torch.cumsum(a, 0, out=out),
                [self._dtensor(mesh, R(i8, [100, 100]))],
                self._dtensor(mesh, P(i32, [0, 0], [0, 0])),
            )
        # index_fill with a plain 0-dim tensor value (an int64 Replicate)
        index = torch.tensor([1, 3])
        idx = DTensor.from_local(index, mesh, [Replicate()], run_check=False)
        for dtype, reduce_op, in_place in [
            (i8, "max", True),
            (i32, "max", True),
            (i32, "max", False),
            (i8, "min", True),
        ]:
            with self.subTest("index_fill", dtype=dtype, in_place=in_place):
                x = P(dtype, [100, 70, -100, 5], [100, 70, -100, -3], reduce_op)
                truth = reduced_value(x).index_fill(0, index, torch.tensor(5))
                t = self._dtensor(mesh, x)
                comm_mode = CommDebugMode()
                with comm_mode:
                    if in_place:
                        res = t.index_fill_(0, idx, torch.tensor(5))
                    else:
                        res = t.index_fill(0, idx, torch.tensor(5))
                self.assertEqual(comm_mode.get_total_counts(), 0)
                self.assertEqual(res.placements, (Partial(reduce_op),))
                self.assertEqual(res.full_tensor(), truth, atol=0, rtol=0)

    def test_index_fill_keeps_a_max_or_min_value_of_a_narrower_dtype(self):
        # An order-keeping cast (an integer widening) commutes with max/min:
        # no collective, in place or not (the in-place op used to raise).
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        index = torch.tensor([1, 3])
        for reduce_op in ("max", "min"):
            x = P(i32, [1, 2, 3, 4], [5, 6, 7, 8], reduce_op)
            v = P(i8, 50, -5, reduce_op)
            truth = reduced_value(x).index_fill(0, index, reduced_value(v))
            for in_place in (False, True):
                with self.subTest(reduce_op=reduce_op, in_place=in_place):
                    t = self._dtensor(mesh, x)
                    value = self._dtensor(mesh, v)
                    idx = DTensor.from_local(
                        index, mesh, [Replicate()], run_check=False
                    )
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        if in_place:
                            res = t.index_fill_(0, idx, value)
                        else:
                            res = torch.index_fill(t, 0, idx, value)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(reduce_op),))
                    self.assertEqual(res.full_tensor(), truth, atol=0, rtol=0)

    def test_a_replicate_operand_of_another_dtype_keeps_a_partial_sum(self):
        # A Replicate operand (a DTensor or a plain 0-dim tensor) is split into
        # a Partial("sum") whose conversion into the Partial operand's dtype is
        # exact (an integer is kept whole on one rank, zeros on the others), so
        # adding it keeps the pending sum with no collective: in place, out=,
        # foreach and out of place (the first three raised, the last reduced).
        mesh = self.build_device_mesh()
        dtypes = (f32,) if dist.get_backend() == "gloo" else (f32, torch.bfloat16, f16)
        xs = [1.5, 2.0, 3.0, 1.0], [0.5, -2.0, 1.0, 3.0]
        IS = [1, 2, 3, 4], [5, 6, 7, 8]

        def foreach_add_(x, y):
            torch._foreach_add_([x], [y])
            return x

        cases = [
            ("add_ 0-dim int64", lambda x, y: x.add_(y), torch.tensor(5)),
            ("add_ 0-dim bool", lambda x, y: x.add_(y), torch.tensor(True)),
            ("sub_ 0-dim float32", lambda x, y: x.sub_(y), torch.tensor(0.5)),
            ("+ 0-dim int64", operator.add, torch.tensor(5)),
            ("add_ int64 R", lambda x, y: x.add_(y), R(i64, [5, 1, 2, 3])),
            ("- int64 R", operator.sub, R(i64, [5, 1, 2, 3])),
            ("add(out=self) int32 R", lambda x, y: torch.add(x, y, out=x), None),
            ("_foreach_add_ int64 R", foreach_add_, R(i64, [5, 1, 2, 3])),
        ]
        for dtype in dtypes:
            for name, fn, other in cases:
                if dtype == f16 and name == "sub_ 0-dim float32":
                    continue  # float32 into float16 narrows the range: below
                if other is None:
                    other = R(i32, [5, 1, 2, 3])
                with self.subTest(name, dtype=dtype):
                    x = P(dtype, *xs)
                    if isinstance(other, torch.Tensor):
                        plain_other = dt_other = other
                    else:
                        plain_other = reduced_value(other)
                        dt_other = self._dtensor(mesh, other)
                    truth = fn(reduced_value(x), plain_other)
                    t = self._dtensor(mesh, x)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(t, dt_other)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(),))
                    self.assertEqual(res.dtype, dtype)
                    self.assertEqual(res.full_tensor(), truth)
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        # A 0-dim float operand whose range the Partial's dtype does not hold
        # is converted into that dtype before it is split, as the op converts
        # it: float64 1e5 overflows float16, its halves (50000) would not, so
        # split first the pieces would read finite values where the op gives
        # -inf. Converted first, each rank subtracts inf / 2: the Partial is
        # kept, in place too.
        big = torch.tensor(1e5, dtype=torch.float64)
        x = P(f16, *xs)
        self._check(mesh, "f16 P - 0-dim f64 1e5", lambda t: t - big, [x], Partial(), 0)
        self._check(
            mesh, "f16 P.sub_(0-dim f64 1e5)", lambda t: t.sub_(big), [x], Partial(), 0
        )
        # A Partial operand of another dtype is still reduced first: int8
        # 100 + 100 wraps in the pending sum, not in int32; int64 rounds per
        # rank into float32 (the in-place op, which cannot reduce its self,
        # raises).
        for name, fn, operands, collectives in [
            (
                "int8 P + int32 R",
                operator.add,
                [wrap(i8), R(i32, [[1, 2], [3, 4]])],
                1,
            ),
            ("float32 P + int64 P", operator.add, [P(f32, *xs), P(i64, *IS)], 2),
        ]:
            with self.subTest(name):
                self._check(mesh, name, fn, operands, Replicate(), collectives)
        with self.assertRaisesRegex(RuntimeError, "in-place operations"):
            self._dtensor(mesh, P(f32, *xs)).add_(self._dtensor(mesh, P(i64, *IS)))

    def test_a_replicate_integer_operand_split_into_a_partial_sum_out(self):
        # mul's [P(sum), R, P(sum)] rule splits a Replicate operand into the
        # out's Partial("sum"): an integer or bool one is converted into the
        # float32 mul computes in and divided by the world size (kept whole,
        # its zeros would meet the inf below: 0 * inf is nan), and the float
        # operand is reduced (torch.mul(f32_avg_partial, torch.tensor(3),
        # out=f32_sum_partial) raised "Redistribution from one partial type
        # (P(avg)) to another (P(sum)) is unsupported").
        mesh = self.build_device_mesh()
        xs = [1.5, -2.0], [3.0, -4.0]
        infs = [float("inf"), -2.0], [float("inf"), -4.0]
        zeros = [0.0, 0.0]
        for name, x, other in [
            ("P(avg) * 0-dim int64", P(f32, *xs, "avg"), torch.tensor(3)),
            ("P(max) * 0-dim int64", P(f32, *xs, "max"), torch.tensor(3)),
            ("P(avg) * int32 R", P(f32, *xs, "avg"), R(i32, [3, 3])),
            ("P(avg) * 0-dim bool", P(f32, *xs, "avg"), torch.tensor(True)),
            ("P(avg) inf * 0-dim int64", P(f32, *infs, "avg"), torch.tensor(3)),
            ("P(avg) inf * int32 R", P(f32, *infs, "avg"), R(i32, [3, 3])),
            ("P(avg) inf * 0-dim bool", P(f32, *infs, "avg"), torch.tensor(True)),
        ]:
            with self.subTest(name):
                plain_other = (
                    other if isinstance(other, torch.Tensor) else reduced_value(other)
                )
                truth = torch.mul(reduced_value(x), plain_other)
                out = self._dtensor(mesh, P(f32, zeros, zeros))
                operands = [self._dtensor(mesh, x), self._dtensor(mesh, other)]
                self.assertEqual(self._run_out(torch.mul, operands, out), 1)
                self.assertEqual(out.placements, (Partial(),))
                self.assertEqual(out.full_tensor(), truth)
        if dist.get_backend() == "gloo":
            return  # int8 all-reduce; the LocalTensor twin checks it
        # An integer Partial operand in that slot is still reduced first: its
        # pending sum wraps in int8 (100 + 100 is -56), not in float32.
        y = P(i8, [100, 1], [100, 2])
        truth = torch.mul(torch.tensor([1.0, 2.0]), reduced_value(y))
        out = self._dtensor(mesh, P(f32, zeros, zeros))
        operands = [self._dtensor(mesh, R(f32, [1.0, 2.0])), self._dtensor(mesh, y)]
        self._run_out(torch.mul, operands, out)
        self.assertEqual(out.placements, (Partial(),))
        self.assertEqual(out.full_tensor(), truth)

    def test_an_out_from_replicate_integer_operands(self):
        # A Partial("sum") out of mul/div from Replicate integer or bool
        # operands: the operand is split into the out's Partial("sum"), with
        # a Python scalar as the other operand (one tensor input) and in an
        # integer computation cast into a float out (int32 * int64 into
        # float32: the whole product on one rank, 0 on the others). Both ran
        # with no collective without the promotion check and raised "no
        # valid sharding strategy" with it.
        mesh = self.build_device_mesh()
        inf = float("inf")
        zeros = [0.0, 0.0]
        cases = [
            ("int32 R * inf", torch.mul, R(i32, [3, -3]), inf),
            ("int8 R * 2.5", torch.mul, R(i8, [100, -3]), 2.5),
            ("bool R * inf", torch.mul, R(B, [True, False]), inf),
            ("int32 R / 2", torch.div, R(i32, [3, -3]), 2),
            ("int32 R / 0", torch.div, R(i32, [3, 0]), 0),
            ("uint8 R / 0.0", torch.div, R(u8, [3, 0]), 0.0),
            ("int32 R * int64 R", torch.mul, R(i32, [3, -3]), R(i64, [2**40, -1])),
            ("bool R * int64 R", torch.mul, R(B, [True, False]), R(i64, [2**40, -1])),
            # int64 wraps (2**40 * 2**40 is 0), as the op on plain tensors
            ("int64 R * int64 R", torch.mul, R(i64, [2**40, 3]), R(i64, [2**40, -1])),
        ]
        for name, fn, x, other in cases:
            with self.subTest(name):
                plain = [reduced_value(x), other]
                if isinstance(other, tuple):
                    plain[1] = reduced_value(other)
                truth = fn(*plain).to(f32)
                out = self._dtensor(mesh, P(f32, zeros, zeros))
                operands = [
                    self._dtensor(mesh, x),
                    self._dtensor(mesh, other) if isinstance(other, tuple) else other,
                ]
                self.assertEqual(self._run_out(fn, operands, out), 0)
                self.assertEqual(out.placements, (Partial(),))
                self.assertEqual(out.full_tensor(), truth, equal_nan=True)
        # The same calls with a Partial("sum") operand cannot keep it: its
        # pending sum wraps in its own dtype (int64 2**62 + 1 on each rank),
        # so per-rank results cast into float32 are not the op on it. It is
        # reduced (one all-reduce) and the Replicate operand split into the
        # out's Partial("sum"); with a Python scalar nothing can carry that
        # Partial, and the call raises.
        x = P(i64, [2**62 + 1], [2**62 + 1])
        truth = torch.mul(reduced_value(x), reduced_value(R(i64, [3]))).to(f32)
        out = self._dtensor(mesh, P(f32, [0.0], [0.0]))
        operands = [self._dtensor(mesh, x), self._dtensor(mesh, R(i64, [3]))]
        self.assertEqual(self._run_out(torch.mul, operands, out), 1)
        self.assertEqual(out.placements, (Partial(),))
        self.assertEqual(out.full_tensor(), truth)
        x = P(i32, [2**31 - 5], [2**31 - 5])
        out = self._dtensor(mesh, P(f32, [0.0], [0.0]))
        with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
            torch.mul(self._dtensor(mesh, x), inf, out=out)
        out = self._dtensor(mesh, R(f32, [0.0]))
        self.assertEqual(
            self._run_out(torch.mul, [self._dtensor(mesh, x), inf], out), 1
        )
        self.assertEqual(out.full_tensor(), torch.mul(reduced_value(x), inf))
        # Nor from a Shard operand where another operand is split: zero-padded
        # into a Partial("sum"), the shard sits on one rank and the split
        # Replicate value on another, whose int64 sum would wrap once, not
        # per rank. mul's [P(sum), P(sum), R] splits nothing else: it runs.
        a = torch.tensor([2**62 + 1, 5, 2**62 + 3, 7])
        b = torch.tensor([2**62, 1, 2**62, 1])
        shard = distribute_tensor(a, mesh, [Shard(0)])
        rep = distribute_tensor(b, mesh, [Replicate()])
        out = distribute_tensor(torch.zeros(4), mesh, [Partial()])
        with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
            torch.add(shard, rep, out=out)
        out = distribute_tensor(torch.zeros(4), mesh, [Replicate()])
        torch.add(shard, rep, out=out)
        self.assertEqual(out.full_tensor(), (a + b).to(f32))
        out = distribute_tensor(torch.zeros(4), mesh, [Partial()])
        torch.mul(shard, rep, out=out)
        self.assertEqual(out.placements, (Partial(),))
        self.assertEqual(out.full_tensor(), (a * b).to(f32))
        # A Shard operand with a Python scalar: zero-padded into the out's
        # Partial, its zeros would meet inf (0 * inf is nan): it raises.
        out = distribute_tensor(torch.zeros(4), mesh, [Partial()])
        with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
            torch.mul(shard, inf, out=out)

    def test_cached_plans_tell_the_accumulation_dtype_apart(self):
        # The dtype kwarg is part of the sharding cache key (the PR before this
        # one): a sum() plan kept for int64 must not serve sum(dtype=float32),
        # which rounds each rank's value. Foreach scalars are not (they change
        # every step): an out-of-place foreach op on an integer Partial reduces
        # it whatever the scalar.
        mesh = self.build_device_mesh()
        x = wrap(i64)
        self._check(mesh, "int64 sum", lambda t: t.sum(), [x], Partial(), 0)
        self._check(
            mesh, "then sum(dtype)", lambda t: t.sum(dtype=f32), [x], Replicate(), 1
        )
        for scalar in (2, 0.5):
            self._check(
                mesh,
                f"_foreach_mul({scalar})",
                lambda t, s=scalar: torch._foreach_mul([t], s)[0],
                [x],
                Replicate(),
                1,
            )


class RulesForAnOperandOfAnotherDtypeTest(TestCase):
    """The rules read without placements (upstream's strategy validator queries
    them so) name a Partial at an operand whose dtype the op converts only
    where something else can carry that Partial: another operand whose dtype
    keeps it, or an out=. bool_partial / bool_replicate (true division in
    float32) must reduce the bool operand, and the runtime does; the rule
    [P(sum), P(sum), R] was still returned, and the validator reported it as
    a wrong rule of div, true_divide and special.xlog1py."""

    def _partial_at(self, op, args, kwargs=None):
        from torch.distributed.tensor._ops.strategy_validation import (
            query_single_dim_strategy,
        )

        rules = query_single_dim_strategy(op, args, kwargs or {})
        return {
            (i, p.reduce_op)
            for rule in rules
            for i, p in enumerate(rule[1 : 1 + len(args)])
            if isinstance(p, Partial)
        }

    def test_no_partial_at_a_converted_operand_without_a_carrier(self):
        aten = torch.ops.aten
        for shape in [(), (3,)]:
            b = torch.ones(shape, dtype=B)
            n = torch.ones(shape, dtype=i64)
            for op, args in [
                (aten.div.Tensor, (b, b)),
                (aten.div.Tensor, (n, n)),
                (aten.special_xlog1py.default, (b, b)),
                (aten.mul.Tensor, (b, torch.ones(shape))),
                (aten.div.Tensor, (n, 2.5)),
            ]:
                with self.subTest(op=str(op), shape=shape, dtype=str(args[0].dtype)):
                    self.assertNotIn((0, "sum"), self._partial_at(op, args))
                    self.assertNotIn((0, "avg"), self._partial_at(op, args))

    def test_a_carrier_keeps_the_rule(self):
        aten = torch.ops.aten
        f = torch.ones(3)
        n = torch.ones(3, dtype=i64)
        # another operand whose dtype keeps the Partial
        self.assertIn((1, "sum"), self._partial_at(aten.add.Tensor, (f, n)))
        # an out=
        for op, args, out in [
            (aten.div.out, (n, 2), f),
            (aten.mul.out, (n, 2.5), f),
            (aten.mul.out, (n.int(), n), f),
        ]:
            with self.subTest(op=str(op)):
                self.assertIn((0, "sum"), self._partial_at(op, args, {"out": out}))


class MaxMinFitRulesTest(TestCase):
    def test_all_replicate_rules_only_for_another_partial_type(self):
        # maximum(u8, i8, out=u8) keeps every max and min rule (out holds
        # every selected value). Its all-Replicate rules serve only operands
        # that carry a placement no kept rule takes (a Shard, another Partial
        # type): they are expanded only then, so a P(max)-only or P(min)-only
        # call sees the op's own rules.
        from torch.distributed.tensor._dtensor_spec import TensorMeta
        from torch.distributed.tensor._ops.single_dim_strategy import (
            _fill_partial_placeholders,
        )

        aten = torch.ops.aten
        funcs = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs
        info = funcs[aten.maximum.out]

        def meta(dtype):
            return TensorMeta(torch.Size([4]), (1,), dtype)

        rules = info.func(aten.maximum.out, (meta(u8), meta(i8)), {"out": meta(u8)})

        def replicated_outputs(placements):
            return {
                rule[0].reduce_op
                for rule in _fill_partial_placeholders(placements, rules)
                if isinstance(rule[0], Partial)
                and all(isinstance(p, Replicate) for p in rule[1:-1])
            }

        self.assertEqual(replicated_outputs({Partial("max")}), set())
        self.assertEqual(replicated_outputs({Partial("min"), Replicate()}), set())
        self.assertEqual(
            replicated_outputs({Partial("max"), Partial("min")}), {"max", "min"}
        )
        self.assertEqual(replicated_outputs({Partial("max"), Partial()}), {"max"})
        # Shard operands into a Partial out: no kept rule takes Shard to
        # Partial(max), so the all-Replicate rule is needed there too
        self.assertEqual(replicated_outputs({Shard(0), Partial("max")}), {"max"})
        self.assertEqual(
            replicated_outputs({Shard(0), Replicate(), Partial("min")}), {"min"}
        )


class MaxMinOutRulesPerMeshDimTest(FakeMeshMixin, TestCase):
    """maximum/minimum(u8, i8, out=) whose out holds every selected value keep
    their all-Replicate rules (a Partial out) for operands carrying another
    placement; on a multi-dim mesh they are expanded only on the mesh dims
    where the selection can pick them."""

    def selections(self, fn, mesh, placements, every_dim):
        # the selected strategy of each propagation, and the number of
        # strategies it was picked from; every_dim: the rules on every mesh
        # dim, as before they were left out per mesh dim
        picks = []

        def recording_select(strategy, op_schema=None):
            op_spec = _select_min_cost_strategy(strategy, op_schema)
            picks.append(
                (op_spec.input_specs, op_spec.output_specs, len(strategy.strategies))
            )
            return op_spec

        tensors = [
            DTensor.from_local(
                torch.zeros(0, dtype=dtype),
                mesh,
                ps,
                run_check=False,
                shape=torch.Size((8, 8)),
                stride=(8, 1),
            )
            for ps, dtype in placements
        ]
        _clear_sharding_prop_cache()
        with contextlib.ExitStack() as stack:
            stack.enter_context(
                mock.patch.object(
                    sharding_prop, "_select_min_cost_strategy", recording_select
                )
            )
            if every_dim:
                stack.enter_context(
                    mock.patch.object(
                        _PreparedSingleDimStrategy,
                        "rules_per_mesh_dim_for_out",
                        lambda *args: None,
                    )
                )
            try:
                fn(*tensors)
            except Exception as e:
                return type(e).__name__, str(e)
        return picks

    def test_fewer_strategies_and_the_same_selection(self):
        S0, R, Pmax, Pmin = Shard(0), Replicate(), Partial("max"), Partial("min")
        ops = [
            (lambda a, b, out: torch.maximum(a, b, out=out), u8, i8, u8),
            (lambda a, b, out: torch.minimum(a, b, out=out), u8, i8, i8),
        ]
        # per mesh dim: Shard, Replicate, either Partial and mixes of them;
        # (R, R) into a Partial out keeps the rule (nothing to redistribute)
        pairs = [(S0, Pmax), (S0, Pmin), (R, Pmax), (Pmax, Pmax), (R, R), (Pmin, S0)]
        # rank 0 is outside the last mesh: every redistribution costs 0 there
        off_mesh = DeviceMesh("cpu", torch.arange(4, 8).view(2, 2))
        fewer = 0
        for mesh, mesh_pairs in [
            (self.mesh["b", "c"], pairs),
            (off_mesh, pairs[:4]),
            (self.mesh, pairs[:3]),
        ]:
            for (fn, da, db, do), pa, pb, po in itertools.product(
                ops, mesh_pairs, mesh_pairs, mesh_pairs
            ):
                if mesh.ndim == 3:
                    pa, pb, po = ((*p[:1], R, *p[1:]) for p in (pa, pb, po))
                placements = [(pa, da), (pb, db), (po, do)]
                per_dim = self.selections(fn, mesh, placements, every_dim=False)
                every = self.selections(fn, mesh, placements, every_dim=True)
                msg = f"{mesh.ndim}-D {pa} {pb} out={po}"
                if isinstance(every[0], str):
                    self.assertEqual(per_dim, every, msg=msg)
                    continue
                self.assertEqual(
                    [pick[:2] for pick in per_dim], [pick[:2] for pick in every], msg
                )
                fewer += per_dim[0][2] < every[0][2]
                if (pa, pb, po) == ((S0, Pmax),) * 3 and mesh.ndim == 2:
                    # the rule serves no mesh dim here (the benchmark's row)
                    self.assertLess(per_dim[0][2], every[0][2], msg=msg)
        self.assertGreater(fewer, 20)


DistPartialSumPromotionTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialSumPromotionTest, base_class=LocalDTensorContinuousTestBase
)


class NarrowedFloatOperandTest(TestCase):
    """A 0-dim float operand that the op converts into a narrower dtype
    (float32 x + float64 0-dim v) and that is split from Replicate into a
    Partial("sum") is converted before the split, as the op converts the whole
    value. LocalTensor on the fake process group, at 2, 3 and 4 ranks."""

    def _run(self, ws, body):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ws)
        try:
            mesh = init_device_mesh("cpu", (ws,))
            with LocalTensorMode(frozenset(range(ws))):
                body(mesh)
        finally:
            dist.destroy_process_group()

    @staticmethod
    def _partial(mesh, dtype, per_rank):
        ws = mesh.size()
        local = LocalTensor(
            {r: torch.tensor(per_rank[r], dtype=dtype) for r in range(ws)}
        )
        return DTensor.from_local(local, mesh, [Partial()], run_check=False)

    def test_a_narrowed_float_operand_is_split_after_its_conversion(self):
        f64, c64, c128, bf16 = (
            torch.float64,
            torch.complex64,
            torch.complex128,
            torch.bfloat16,
        )
        # (name, op, mode, x's dtype, the operand's dtype, its value); x's
        # rank 0 holds [1, -2, 3], the others zeros, except "near max": each
        # rank holds -3e38 / world size, so that split before its conversion
        # float64 5e38 would give each rank a finite float32 piece and read
        # 2e38 where the op gives inf
        cases = [
            ("add", "out", f32, f64, 2.5),
            ("add", "plain", f32, f64, 2.5),
            ("add", "inplace", f32, f64, 2.5),
            ("sub", "out", f32, f64, 1 / 3),
            ("sub", "inplace", f32, f64, 1 / 3),
            ("mul", "plain", f32, f64, 2.5),
            ("div", "inplace", f32, f64, 2.5),
            ("add", "plain", bf16, f64, 2.5),
            ("add", "inplace", f16, f32, 2.5),
            ("add", "out", f16, f64, 1e5),
            ("sub", "inplace", f16, f64, 1e5),
            ("add", "plain", c64, c128, 2 + 1j),
            ("add", "inplace", c64, f64, 2.5),
            ("add", "out", "near max", f64, 5e38),
            ("add", "inplace", "near max", f64, 5e38),
        ]

        def body(mesh):
            ws = mesh.size()
            for op, mode, dtype, sdtype, v in cases:
                with self.subTest(op, mode=mode, x=dtype, s=sdtype, v=v, ws=ws):
                    if dtype == "near max":
                        dtype, per_rank = f32, [[-3e38 / ws] * 3] * ws
                    else:
                        per_rank = [[1.0, -2.0, 3.0]] + [[0.0] * 3] * (ws - 1)
                    full = sum(torch.tensor(p, dtype=dtype) for p in per_rank)
                    s = torch.tensor(v, dtype=sdtype)
                    x = self._partial(mesh, dtype, per_rank)
                    fn = getattr(torch, op)
                    if mode == "inplace":
                        truth = getattr(full, op + "_")(s)
                    else:
                        truth = fn(full, s)
                    out = self._partial(mesh, truth.dtype, [[0.0] * 3] * ws)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        if mode == "out":
                            res = fn(x, s, out=out)
                        elif mode == "inplace":
                            res = getattr(x, op + "_")(s)
                        else:
                            res = fn(x, s)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(),))
                    self.assertEqual(res.dtype, truth.dtype)
                    got = res.full_tensor()._local_tensors[0]
                    # a float16 Partial adds its piece on each rank and rounds
                    # there, as any float16 Partial(sum): at 3 ranks 2.5 / 3
                    # rounds (one float16 ulp)
                    tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == f16 else {}
                    self.assertEqual(got, truth, equal_nan=True, **tol)
            # complex32 is not split (its division is not implemented on
            # CPU): float16 x + a 0-dim complex128 reduces x first
            per_rank = [[1.0, -2.0, 3.0]] + [[0.0] * 3] * (ws - 1)
            x = self._partial(mesh, f16, per_rank)
            s = torch.tensor(2 + 1j, dtype=c128)
            comm_mode = CommDebugMode()
            with comm_mode:
                res = x + s
            self.assertEqual(comm_mode.get_total_counts(), 1)
            self.assertEqual(res.placements, (Replicate(),))
            full = torch.tensor([1.0, -2.0, 3.0], dtype=f16)
            self.assertEqual(res.full_tensor()._local_tensors[0], full + s)

        for ws in (2, 3, 4):
            self._run(ws, body)

    def test_a_wider_operand_the_op_computes_in_keeps_the_partial(self):
        # A 1-dim float64 Replicate operand of an in-place or out= add/sub
        # into a narrower float Partial(sum) x: the op computes in float64
        # (the operand is never converted; it is split in float64) and casts
        # each rank's result into x's dtype once, as a Partial of that dtype
        # rounds. The Partial is kept with no collective (it raised).
        f64 = torch.float64
        ops = [
            ("x.add_(y)", lambda x, y: x.add_(y)),
            ("x.sub_(y, alpha=2)", lambda x, y: x.sub_(y, alpha=2)),
            ("add(x, y, out=x)", lambda x, y: torch.add(x, y, out=x)),
        ]

        values = [1.0, -2.5, 0.5, 3.0]
        cases = list(
            itertools.product(
                ops, (f32, torch.bfloat16, f16), (2.5, 1e5, -7e4, 1 / 3, 3e38)
            )
        )
        # the op on plain tensors (outside LocalTensorMode)
        truths = [
            fn(torch.tensor(values, dtype=dtype), torch.full((4,), v, dtype=f64))
            for (_, fn), dtype, v in cases
        ]

        def body(mesh):
            ws = mesh.size()
            per_rank = [values] + [[0.0] * 4] * (ws - 1)
            for ((name, fn), dtype, v), truth in zip(cases, truths):
                with self.subTest(name, x=dtype, v=v, ws=ws):
                    y = torch.full((4,), v, dtype=f64)
                    x = self._partial(mesh, dtype, per_rank)
                    yd = distribute_tensor(y, mesh, [Replicate()])
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(x, yd)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(),))
                    got = res.full_tensor()._local_tensors[0]
                    # each rank rounds its result into x's dtype
                    self.assertEqual(got, truth, atol=1e-2, rtol=1e-2)
            # the same from two Replicate operands into a narrower out
            for (name, fn), (adtype, odtype), v in itertools.product(
                out_ops, ((f32, f16), (f64, f32)), (7e4, 1e5, 1 / 3)
            ):
                with self.subTest(name, a=adtype, out=odtype, v=v, ws=ws):
                    a = torch.tensor(values, dtype=adtype) * v
                    b = torch.tensor(values, dtype=adtype)
                    truth = fn(a, b, torch.empty(4, dtype=odtype))
                    out = self._partial(mesh, odtype, [[0.0] * 4] * ws)
                    ra, rb = (distribute_tensor(t, mesh, [Replicate()]) for t in (a, b))
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(ra, rb, out)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(),))
                    got = res.full_tensor()._local_tensors[0]
                    self.assertEqual(got, truth, atol=1e-2, rtol=1e-2)

        out_ops = [
            ("add(a, b, out=out)", lambda a, b, out: torch.add(a, b, out=out)),
            (
                "sub(a, b, alpha=2, out=out)",
                lambda a, b, out: torch.sub(a, b, alpha=2, out=out),
            ),
        ]
        for ws in (2, 3):
            self._run(ws, body)

    def test_an_out_from_replicate_float_operands_of_another_half_dtype(self):
        # mul/add/div/sub of Replicate operands into a Partial(sum) out= whose
        # dtype the computed dtype neither holds nor is held by (bfloat16
        # into float16, float64 into complex64). The operand split into the
        # out's Partial(sum) holds the result / world size on each rank, and
        # its cast into out's dtype sums to the result's cast: the Partial is
        # kept with no collective, the value of the op on plain tensors. These
        # raised "no valid sharding strategy"; with a Partial operand it still
        # does.
        bf16, f64, c64, i64 = (
            torch.bfloat16,
            torch.float64,
            torch.complex64,
            torch.int64,
        )
        a = [1e5, 3.0, 7.0, -1.5, 65536.0, 3e38, 2.0**-14, -0.0]
        c = [0.5, 3.0, -2.0, 1.0, 1.0, 2.0, 4.0, 1.0]
        ops = [
            ("mul", torch.mul),
            ("add", torch.add),
            ("sub", torch.sub),
            ("div", torch.div),
        ]
        dtypes = [
            (bf16, bf16, f16),
            (i64, bf16, f16),
            (bf16, i64, f16),
            (f64, f64, c64),
        ]

        def operand(values, dtype):
            if dtype == i64:
                return torch.tensor([int(min(abs(v), 2**40)) for v in values])
            return torch.tensor(values, dtype=f64).to(dtype)

        cases = list(itertools.product(ops, dtypes))
        # the op on plain tensors (outside LocalTensorMode)
        truths = [
            fn(
                operand(a, adtype),
                operand(c, cdtype),
                out=torch.zeros(len(a), dtype=odtype),
            )
            for (_, fn), (adtype, cdtype, odtype) in cases
        ]

        def body(mesh):
            ws = mesh.size()
            for ((name, fn), (adtype, cdtype, odtype)), truth in zip(cases, truths):
                with self.subTest(name, a=adtype, c=cdtype, out=odtype, ws=ws):
                    ra = distribute_tensor(operand(a, adtype), mesh, [Replicate()])
                    rc = distribute_tensor(operand(c, cdtype), mesh, [Replicate()])
                    out = self._partial(mesh, odtype, [[0.0] * len(a)] * ws)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(ra, rc, out=out)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(),))
                    got = res.full_tensor()._local_tensors[0]
                    self.assertEqual(got, truth, atol=0, rtol=0, equal_nan=True)
            # With a Partial operand the rule is refused, as before: reduced
            # first, the split of the Replicate operand in bfloat16 rounds
            # where the user's pieces did not (1.0 * 1.0 reads 1.001953125 at
            # 3 ranks; 3 * 2**-24 reads 2**-22 at 2 and 4).
            x = self._partial(
                mesh, bf16, [[131072.0]] + [[-130048.0]] + [[0.0]] * (ws - 2)
            )
            y = distribute_tensor(torch.tensor([0.5], dtype=bf16), mesh, [Replicate()])
            out = self._partial(mesh, f16, [[0.0]] * ws)
            with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
                torch.mul(x, y, out=out)
            # float16 into bfloat16 stays refused: the op overflows in float16
            # (65504 + 10000 is inf), its per-rank halves do not, and their
            # bfloat16 sum would read 75776.
            fa = distribute_tensor(
                torch.tensor([65504.0], dtype=f16), mesh, [Replicate()]
            )
            fc = distribute_tensor(torch.tensor([1e4], dtype=f16), mesh, [Replicate()])
            out = self._partial(mesh, bf16, [[0.0]] * ws)
            with self.assertRaisesRegex(RuntimeError, "no valid sharding strategy"):
                torch.add(fa, fc, out=out)

        for ws in (2, 4):
            self._run(ws, body)

    def _mul_into_partial_out(self, mesh, a, adtype, v, vdtype, odtype, placement):
        # torch.mul(x, v, out=out): x from a on `placement`, a 0-dim Replicate
        # v, and a zero Partial(sum) out; returns the result and its collectives
        x = distribute_tensor(torch.tensor(a, dtype=adtype), mesh, [placement])
        rv = distribute_tensor(torch.tensor(v, dtype=vdtype), mesh, [Replicate()])
        out = self._partial(mesh, odtype, [[0.0] * len(a)] * mesh.size())
        comm_mode = CommDebugMode()
        with comm_mode:
            res = torch.mul(x, rv, out=out)
        return res, comm_mode

    def test_a_second_mul_operand_is_split_in_the_dtype_the_op_reads_it_in(self):
        # mul of a bfloat16/float16 Shard(0) or Replicate x by a 0-dim float64
        # or float32 Replicate v into a Partial(sum) out= splits v. The CPU
        # kernel reads the whole v as a float32 scalar, not rounded into x's
        # dtype (bfloat16 64896 * float64 1/3 is 21632; bfloat16(1/3) gives
        # 21760; float16 x * float64 1e5 is finite where float16(1e5) is
        # inf): v is split in float32, as the op reads it, and the result is
        # the op's on plain tensors, bit for bit.
        bf16, f64 = torch.bfloat16, torch.float64
        a = [64896.0, 3.0, 1.0, -7.5, 300.0, 12345.0, 0.1, -2.0]
        cases = list(
            itertools.product(
                (bf16, f16),
                (f64, f32),
                (1 / 3, 0.1, 2.718281828459045, 1e5),
                ("x's", f32),
                (Shard(0), Replicate()),
            )
        )
        cases = [
            (adtype, vdtype, v, adtype if odtype == "x's" else odtype, pl)
            for adtype, vdtype, v, odtype, pl in cases
        ]
        # the op on plain tensors (outside LocalTensorMode)
        truths = [
            torch.mul(
                torch.tensor(a, dtype=adtype),
                torch.tensor(v, dtype=vdtype),
                out=torch.zeros(len(a), dtype=odtype),
            )
            for adtype, vdtype, v, odtype, _ in cases
        ]

        def body(mesh):
            ws = mesh.size()
            for (adtype, vdtype, v, odtype, pl), truth in zip(cases, truths):
                # Known limit, as on stock: each rank's piece of a float16
                # product that overflows only whole stays finite in a wider
                # out (1.0 * 1e5 reads 99968); the other elements are exact.
                exact = truth.isfinite() | (odtype == adtype)
                with self.subTest(a=adtype, v=vdtype, value=v, out=odtype, x=pl, ws=ws):
                    res, comm_mode = self._mul_into_partial_out(
                        mesh, a, adtype, v, vdtype, odtype, pl
                    )
                    # a Shard(0) x is gathered (all_gather) and v split
                    self.assertEqual(
                        comm_mode.get_total_counts(), 1 if pl == Shard(0) else 0
                    )
                    self.assertEqual(res.placements, (Partial(),))
                    self.assertEqual(res.dtype, odtype)
                    got = res.full_tensor()._local_tensors[0]
                    self.assertEqual(
                        got[exact], truth[exact], atol=0, rtol=0, equal_nan=True
                    )

        for ws in (2, 4):
            self._run(ws, body)

    def test_a_second_mul_operand_beyond_the_half_range_into_a_wider_out(
        self,
    ):
        # float16/bfloat16 x * a 0-dim v beyond x's range but finite in
        # float32 (1e5; GradScaler's float32 65536 scale), into a float32,
        # float64 or complex64 Partial(sum) out=: the op reads v as a float32
        # scalar, so every product that fits x's dtype is finite. v is split
        # in float32 as it is, not turned into x's inf (which would read inf
        # for every element and nan for a zero). At world sizes 2 and 4 the
        # pieces are exact.
        a = [0.5, 1e-3, 0.0, -0.25, 2.0**-14]
        cases = [
            (torch.float16, torch.float64, 1e5, torch.float32),
            (torch.float16, torch.float32, 65536.0, torch.float32),
            (torch.float16, torch.float32, 1e5, torch.float64),
            (torch.float16, torch.float64, 1e5, torch.complex64),
            (torch.bfloat16, torch.float64, 3.0e38, torch.float64),
        ]
        truths = [
            torch.mul(
                torch.tensor(a, dtype=adtype),
                torch.tensor(v, dtype=vdtype),
                out=torch.zeros(len(a), dtype=odtype),
            )
            for adtype, vdtype, v, odtype in cases
        ]

        def body(mesh):
            ws = mesh.size()
            for (adtype, vdtype, v, odtype), truth in zip(cases, truths):
                with self.subTest(a=adtype, v=vdtype, value=v, out=odtype, ws=ws):
                    self.assertTrue(truth.isfinite().all())
                    res, comm_mode = self._mul_into_partial_out(
                        mesh, a, adtype, v, vdtype, odtype, Shard(0)
                    )
                    self.assertEqual(comm_mode.get_total_counts(), 1)
                    self.assertEqual(res.placements, (Partial(),))
                    got = res.full_tensor()._local_tensors[0]
                    self.assertEqual(got, truth, atol=0, rtol=0)

        for ws in (2, 4):
            self._run(ws, body)

    def test_an_operand_the_op_converts_exactly_keeps_the_partial(self):
        # A 1-dim Replicate operand of an in-place, out= or foreach add/sub
        # into a Partial(sum) x, where the op computes in a third dtype that
        # holds both exactly (complex64 x and float64 y in complex128,
        # float16 x and bfloat16 y in float32): the operand is split in its
        # dtype and each rank's result is cast once into x's dtype, as a
        # Partial of that dtype rounds. The Partial is kept with no
        # collective (it raised).
        ops = [
            ("x.add_(y)", lambda x, y: x.add_(y)),
            ("x.sub_(y, alpha=2)", lambda x, y: x.sub_(y, alpha=2)),
            ("add(x, y, out=x)", lambda x, y: torch.add(x, y, out=x)),
            ("_foreach_add_([x], [y])", lambda x, y: torch._foreach_add_([x], [y])),
        ]
        values = [1.0, -2.5, 0.5, 3.0]
        y_values = [0.5, 4.0, -8.0, 1e4]
        cases = list(
            itertools.product(
                ops, ((torch.complex64, torch.float64), (f16, torch.bfloat16))
            )
        )

        def call(fn, x, y):
            fn(x, y)
            return x

        # the op on plain tensors (outside LocalTensorMode)
        truths = [
            call(
                fn,
                torch.tensor(values, dtype=xdtype),
                torch.tensor(y_values, dtype=ydtype),
            )
            for (_, fn), (xdtype, ydtype) in cases
        ]

        def body(mesh):
            ws = mesh.size()
            per_rank = [values] + [[0.0] * 4] * (ws - 1)
            for ((name, fn), (xdtype, ydtype)), truth in zip(cases, truths):
                with self.subTest(name, x=xdtype, y=ydtype, ws=ws):
                    x = self._partial(mesh, xdtype, per_rank)
                    yd = distribute_tensor(
                        torch.tensor(y_values, dtype=ydtype), mesh, [Replicate()]
                    )
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        call(fn, x, yd)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(x.placements, (Partial(),))
                    got = x.full_tensor()._local_tensors[0]
                    # each rank rounds its result into x's dtype
                    self.assertEqual(got, truth, atol=1e-2, rtol=1e-2)

        # Every operand 0-dim: the op computes in y's dtype and y is split in
        # it; out=x casts each rank's result into x's dtype.
        zero_dim = [
            (xdtype, ydtype, v)
            for xdtype, ydtype in (
                (f32, torch.float64),
                (f16, f32),
                (torch.complex64, torch.float64),
                (f16, torch.bfloat16),
            )
            for v in (2.5, 1e5)
        ]
        zero_dim_truths = [
            torch.add(
                torch.tensor(values[0], dtype=xdtype),
                torch.tensor(v, dtype=ydtype),
                out=torch.tensor(values[0], dtype=xdtype),
            )
            for xdtype, ydtype, v in zero_dim
        ]

        def zero_dim_body(mesh):
            ws = mesh.size()
            per_rank = [values[0]] + [0.0] * (ws - 1)
            for (xdtype, ydtype, v), truth in zip(zero_dim, zero_dim_truths):
                with self.subTest("add(x, y, out=x), 0-dim", x=xdtype, y=ydtype, v=v):
                    x = self._partial(mesh, xdtype, per_rank)
                    yd = distribute_tensor(
                        torch.tensor(v, dtype=ydtype), mesh, [Replicate()]
                    )
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        torch.add(x, yd, out=x)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(x.placements, (Partial(),))
                    got = x.full_tensor()._local_tensors[0]
                    self.assertEqual(got, truth, atol=1e-2, rtol=1e-2)

        for ws in (2, 3):
            self._run(ws, body)
            self._run(ws, zero_dim_body)

    def test_a_foreach_operand_is_split_per_computed_dtype(self):
        # The same 0-dim Replicate y for entries of different dtypes: the
        # float16 entry converts y into float16 before its split (1e5 reads
        # inf there), the float32 entry splits it as it is; the split made
        # for one entry is not reused for the other, in either order.
        f64 = torch.float64
        cases = [
            (dtypes, ydtype, v)
            for ydtype, v in ((f32, 1e5), (f64, 1e5), (f64, 5e38), (f32, 65519.0))
            for dtypes in (
                (ydtype, f16),
                (f16, ydtype),
                (f32, torch.bfloat16),
                (torch.bfloat16, f32),
            )
        ]
        values = [-60000.0, 1.0]
        ops = [
            ("_foreach_add", lambda xs, y: torch._foreach_add(xs, [y, y])),
            ("_foreach_add_", lambda xs, y: torch._foreach_add_(xs, [y, y]) or xs),
        ]
        # the op on plain tensors (outside LocalTensorMode)
        truths = [
            fn(
                [torch.tensor(values, dtype=d) for d in dtypes],
                torch.tensor(v, dtype=ydtype),
            )
            for (_, fn), (dtypes, ydtype, v) in itertools.product(ops, cases)
        ]

        def body(mesh):
            ws = mesh.size()
            per_rank = [values] + [[0.0] * 2] * (ws - 1)
            for ((name, fn), (dtypes, ydtype, v)), truth in zip(
                itertools.product(ops, cases), truths
            ):
                with self.subTest(name, xs=dtypes, y=ydtype, v=v, ws=ws):
                    xs = [self._partial(mesh, d, per_rank) for d in dtypes]
                    y = distribute_tensor(
                        torch.tensor(v, dtype=ydtype), mesh, [Replicate()]
                    )
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(xs, y)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    for r, t in zip(res, truth):
                        self.assertEqual(r.placements, (Partial(),))
                        got = r.full_tensor()._local_tensors[0]
                        # float16/bfloat16 entries round on each rank
                        self.assertEqual(got, t, atol=0, rtol=1e-2)

        for ws in (2, 4):
            self._run(ws, body)

    def test_a_complex_operand_is_split_by_parts(self):
        # A complex operand split from Replicate into a Partial("sum") divides
        # its real and imaginary parts by the world size each: a complex
        # division reads nan in a part where the other is infinite, (inf+0j)
        # / 2 is inf+nanj. A complex128 5e38+0j converted into complex64
        # before its split is inf+0j; so is a complex64 inf+0j operand.
        c64, c128, f64 = torch.complex64, torch.complex128, torch.float64
        ops = [
            ("add(y, x)", lambda y, x: torch.add(y, x)),
            ("sub(y, x)", lambda y, x: torch.sub(y, x)),
            ("rsub(x, y)", lambda y, x: torch.rsub(x, y)),
            ("add(y, x, alpha=2)", lambda y, x: torch.add(y, x, alpha=2)),
            ("x.add_(y)", lambda y, x: x.add_(y)),
        ]
        # (x's dtype, y's dtype, y's value)
        cases = [
            (f32, c128, 5e38 + 0j),
            (f32, c128, 3.5e38 + 1j),
            (f32, c128, 1 + 5e38j),
            (c64, f64, 5e38),
            (c64, c128, 5e38 + 0j),
            (c64, c64, complex(float("inf"), 0.0)),
            (c64, c64, complex(1.0, float("-inf"))),
            (c64, c128, 2 + 1j),
        ]

        def body(mesh):
            ws = mesh.size()
            per_rank = [[1.0, 2.0]] + [[0.0] * 2] * (ws - 1)
            for (name, fn), (dtype, ydtype, v) in itertools.product(ops, cases):
                y = torch.tensor(v, dtype=ydtype)
                full = torch.tensor(per_rank[0], dtype=dtype)
                if name == "x.add_(y)" and not dtype.is_complex:
                    continue  # a complex y does not add into a float self
                with self.subTest(name, x=dtype, y=ydtype, v=v, ws=ws):
                    truth = fn(y, full.clone())
                    x = self._partial(mesh, dtype, per_rank)
                    yd = distribute_tensor(y, mesh, [Replicate()])
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(yd, x)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(res.placements, (Partial(),))
                    self.assertEqual(res.dtype, truth.dtype)
                    got = torch.view_as_real(res.full_tensor()._local_tensors[0])
                    # at 3 ranks a third of a part rounds (last bit)
                    tol = {"atol": 1e-6, "rtol": 1e-6} if ws == 3 else {}
                    self.assertEqual(got, torch.view_as_real(truth), **tol)

        for ws in (2, 3, 4):
            self._run(ws, body)


if __name__ == "__main__":
    run_tests()
