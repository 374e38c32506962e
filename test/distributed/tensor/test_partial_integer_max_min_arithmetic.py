# Owner(s): ["oncall: distributed"]
"""An integer Partial("max")/Partial("min") is reduced before add, sub, rsub and neg.

These ops keep a pending max/min by adding the same Replicate value on every rank
(add/sub/rsub) or by reversing the ranks' order (neg, which turns a max into a min).
Integer arithmetic wraps, so neither holds in an integer dtype: int8 locals 100 / -100 of
a Partial("max") plus 50 are -106 / -50 (max -50) where the op on the reduced tensor gives
100 + 50 = -106; -(-128) is -128 in int8. Each case asserts the value against the op on
the reduced plain tensors, the placement and the collective count. Floating and bool
(add is a logical or) operands keep the Partial with no collective, as before.
"""

import functools

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)


aten = torch.ops.aten
i8, u8, i16, i32, i64 = torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64
f32, bf16 = torch.float32, torch.bfloat16


def P(dtype, rank0, rank1, reduce_op):
    """A Partial operand: rank r holds [rank0] / [rank1]."""
    return ("P", reduce_op, dtype, (rank0, rank1))


def R(dtype, value):
    return ("R", None, dtype, value)


def reduced_value(operand):
    if isinstance(operand, list):
        return [reduced_value(o) for o in operand]
    if isinstance(operand, torch.Tensor):
        return operand.clone()
    kind, reduce_op, dtype, values = operand
    if kind == "R":
        return torch.tensor([values], dtype=dtype)
    pick = torch.maximum if reduce_op == "max" else torch.minimum
    return functools.reduce(pick, [torch.tensor([v], dtype=dtype) for v in values])


# Wrap-inducing operands per integer dtype: a Partial("max") whose larger local
# overflows when the Replicate value is added, and a Partial("min") whose smaller
# local overflows when it is subtracted.
WRAPPING = {
    i8: (P(i8, 100, -100, "max"), R(i8, 50), P(i8, -100, 100, "min"), R(i8, 50)),
    u8: (P(u8, 250, 3, "max"), R(u8, 10), P(u8, 3, 200, "min"), R(u8, 5)),
    i32: (
        P(i32, 2**31 - 10, -5, "max"),
        R(i32, 20),
        P(i32, -(2**31) + 10, 5, "min"),
        R(i32, 20),
    ),
    i64: (
        P(i64, 2**63 - 10, -5, "max"),
        R(i64, 20),
        P(i64, -(2**63) + 10, 5, "min"),
        R(i64, 20),
    ),
}
# A Partial("max") and a Partial("min") whose negation wraps: -(-128) is -128 in
# int8; in uint8 -x is 256 - x, which reverses no order (-0 is 0, -1 is 255).
NEGATION_WRAPPING = {
    i8: (P(i8, -128, 5, "max"), P(i8, 5, -128, "min")),
    u8: (P(u8, 0, 1, "max"), P(u8, 0, 1, "min")),
    i32: (P(i32, -(2**31), 5, "max"), P(i32, 5, -(2**31), "min")),
    i64: (P(i64, -(2**63), 5, "max"), P(i64, 5, -(2**63), "min")),
}


class DistPartialIntegerMaxMinArithmeticTest(DTensorContinuousTestBase):
    world_size = 2

    def _dtensor(self, mesh, operand):
        if isinstance(operand, list):
            return [self._dtensor(mesh, o) for o in operand]
        if isinstance(operand, torch.Tensor):
            return operand
        kind, reduce_op, dtype, values = operand
        if kind == "R":
            return DTensor.from_local(
                torch.tensor([values], dtype=dtype),
                mesh,
                [Replicate()],
                run_check=False,
            )
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor([values[r]], dtype=dtype)
        )
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _check(self, mesh, fn, operands, placement, collectives):
        """fn on DTensors of ``operands`` against fn on the reduced tensors."""
        truth = fn(*[reduced_value(o) for o in operands])
        inputs = [self._dtensor(mesh, o) for o in operands]
        comm_mode = CommDebugMode()
        with comm_mode:
            res = fn(*inputs)
        if isinstance(res, (list, tuple)):
            (res,), (truth,) = res, truth
        self.assertEqual(comm_mode.get_total_counts(), collectives)
        self.assertEqual(res.placements, (placement,))
        self.assertEqual(res.dtype, truth.dtype)
        tol = {} if truth.dtype.is_floating_point else {"atol": 0, "rtol": 0}
        self.assertEqual(res.full_tensor(), truth, **tol)

    def test_add_sub_rsub_reduce_an_integer_max_min_partial(self):
        # Each kept the Partial with no collective and read the wrapped ranks'
        # max/min (int8: -50 for -106, 50 for 106). An out= Partial("max"/"min")
        # is kept: every rank computes the same value from the reduced input.
        mesh = self.build_device_mesh()
        for dtype, (pmax, r, pmin, s) in WRAPPING.items():
            zero = functools.partial(P, dtype, 0, 0)
            cases = [
                ("add(P(max), R)", lambda a, b: a + b, [pmax, r], Replicate()),
                (
                    "add(P(max), R, alpha=2)",
                    lambda a, b: torch.add(a, b, alpha=2),
                    [pmax, r],
                    Replicate(),
                ),
                (
                    "add(P(max), 0-dim)",
                    lambda a, b: a + b,
                    [pmax, reduced_value(r).squeeze(0)],
                    Replicate(),
                ),
                ("sub(P(min), R)", lambda a, b: a - b, [pmin, s], Replicate()),
                (
                    "sub(P(max), R, alpha=-1)",
                    lambda a, b: torch.sub(a, b, alpha=-1),
                    [pmax, r],
                    Replicate(),
                ),
                ("rsub(R, P(min))", torch.rsub, [s, pmin], Replicate()),
                (
                    "add(P(max), R, out=P(max))",
                    lambda a, b, o: torch.add(a, b, out=o),
                    [pmax, r, zero("max")],
                    Partial("max"),
                ),
                (
                    "sub(P(min), R, out=P(min))",
                    lambda a, b, o: torch.sub(a, b, out=o),
                    [pmin, s, zero("min")],
                    Partial("min"),
                ),
                (
                    "rsub.Tensor_out(R, P(min), out=P(min))",
                    lambda a, b, o: aten.rsub.Tensor_out(a, b, out=o),
                    [s, pmin, zero("min")],
                    Partial("min"),
                ),
                (
                    "_foreach_add.List",
                    torch._foreach_add,
                    [[pmax], [r]],
                    Replicate(),
                ),
                (
                    "_foreach_sub.List",
                    torch._foreach_sub,
                    [[pmin], [s]],
                    Replicate(),
                ),
            ]
            for name, fn, operands, placement in cases:
                with self.subTest(name, dtype=dtype):
                    self._check(mesh, fn, operands, placement, 1)

    def test_neg_reduces_an_integer_max_min_partial(self):
        # neg turned P(max) into P(min) with no collective: int8 read -128 for -5,
        # uint8 0 for 255.
        mesh = self.build_device_mesh()
        for dtype, (pmax, pmin) in NEGATION_WRAPPING.items():
            cases = [
                ("neg(P(max))", torch.neg, [pmax], Replicate()),
                ("neg(P(min))", torch.neg, [pmin], Replicate()),
                (
                    "neg(P(max), out=P(min))",
                    lambda a, o: torch.neg(a, out=o),
                    [pmax, P(dtype, 0, 0, "min")],
                    Partial("min"),
                ),
                ("_foreach_neg", torch._foreach_neg, [[pmax]], Replicate()),
            ]
            for name, fn, operands, placement in cases:
                with self.subTest(name, dtype=dtype):
                    self._check(mesh, fn, operands, placement, 1)

    def test_mixed_integer_dtypes_compute_in_the_promoted_dtype(self):
        if dist.get_backend() == "gloo":
            return  # int16 all-reduce; the LocalTensor twin checks it
        mesh = self.build_device_mesh()
        # int8 + int16 computes in int16, which wraps: 100 + 32700 is -32736.
        self._check(
            mesh,
            lambda a, b: a + b,
            [P(i8, 100, -100, "max"), R(i16, 32700)],
            Replicate(),
            1,
        )
        # int8 + float32 computes in float32, which does not wrap: kept.
        self._check(
            mesh,
            lambda a, b: a + b,
            [P(i8, 100, -100, "max"), R(f32, 50.0)],
            Partial("max"),
            0,
        )

    def test_in_place_on_an_integer_max_min_partial_raises(self):
        # An in-place op cannot reduce its self: it raises instead of writing the
        # wrapped ranks' values (int8: self read -50 for -106), and self is left
        # as it was.
        mesh = self.build_device_mesh()
        pmax, r, pmin, s = WRAPPING[i8]
        cases = [
            ("add_", lambda a, b: a.add_(b), pmax, r),
            ("sub_", lambda a, b: a.sub_(b), pmin, s),
            ("_foreach_add_", lambda a, b: torch._foreach_add_([a], [b]), pmax, r),
            ("_foreach_sub_", lambda a, b: torch._foreach_sub_([a], [b]), pmin, s),
        ]
        for name, fn, x, y in cases:
            with self.subTest(name):
                a, b = self._dtensor(mesh, x), self._dtensor(mesh, y)
                with self.assertRaisesRegex(RuntimeError, "in-place operations"):
                    fn(a, b)
                self.assertEqual(a.full_tensor(), reduced_value(x), atol=0, rtol=0)

    def test_floating_and_bool_keep_the_partial(self):
        # Floating arithmetic does not wrap (rounding keeps the order) and a
        # bool add is a logical or: no collective, as before.
        mesh = self.build_device_mesh()
        dtypes = (f32,) if dist.get_backend() == "gloo" else (f32, bf16)
        for dtype in dtypes:
            pmax, pmin = P(dtype, 1.5, -3.0, "max"), P(dtype, 1.5, -3.0, "min")
            r = R(dtype, 2.0)
            cases = [
                ("add(P(max), R)", lambda a, b: a + b, [pmax, r], Partial("max")),
                ("sub(P(min), R)", lambda a, b: a - b, [pmin, r], Partial("min")),
                ("rsub(R, P(min))", torch.rsub, [r, pmin], Partial("min")),
                ("neg(P(max))", torch.neg, [pmax], Partial("min")),
                ("add_(P(max), R)", lambda a, b: a.add_(b), [pmax, r], Partial("max")),
                (
                    "_foreach_add_",
                    lambda a, b: torch._foreach_add_(a, b) or a,
                    [[pmax], [r]],
                    Partial("max"),
                ),
            ]
            for name, fn, operands, placement in cases:
                with self.subTest(name, dtype=dtype):
                    self._check(mesh, fn, operands, placement, 0)
        for reduce_op in ("max", "min"):
            for locals_ in ((True, False), (False, False), (True, True)):
                for value in (True, False):
                    x, r = P(torch.bool, *locals_, reduce_op), R(torch.bool, value)
                    with self.subTest("bool add", reduce_op=reduce_op, r=value):
                        self._check(
                            mesh, lambda a, b: a + b, [x, r], Partial(reduce_op), 0
                        )


DistPartialIntegerMaxMinArithmeticTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialIntegerMaxMinArithmeticTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
