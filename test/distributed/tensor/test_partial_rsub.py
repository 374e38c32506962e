# Owner(s): ["oncall: distributed"]
"""rsub (other - alpha * self) gets sub's sharding rules with the operands swapped.

Without its own rules rsub.Tensor was propagated through its decomposition (a cast
into the computed dtype, then sub): a Partial("sum") minus a Replicate operand of
another dtype reduced the Partial first, ``rsub(i8 P, i8 R)`` read a wrong value and
``rsub.Tensor_out`` had no strategy. Each case asserts the value against the op on
the reduced plain tensors, the dtype, the placement and the collective count.
"""

import functools
import operator

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


i8, u8, i64 = torch.int8, torch.uint8, torch.int64
f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


def P(dtype, rank0, rank1, reduce_op="sum"):
    """A Partial operand: its rank r holds rank0 / rank1."""
    return ("P", reduce_op, dtype, (rank0, rank1))


def R(dtype, value):
    return ("R", None, dtype, value)


def reduced_value(operand):
    kind, reduce_op, dtype, values = operand
    if kind == "R":
        return torch.tensor(values, dtype=dtype)
    per_rank = [torch.tensor(v, dtype=dtype) for v in values]
    if reduce_op in ("max", "min"):
        pick = torch.maximum if reduce_op == "max" else torch.minimum
        return functools.reduce(pick, per_rank)
    if reduce_op == "avg":
        total = functools.reduce(operator.add, per_rank)
        if dtype.is_floating_point:
            return total / len(per_rank)
        return total // len(per_rank)  # the cases' sums are not negative
    # c10d's sum: in the dtype, so int8 wraps and bool saturates (add is or)
    return functools.reduce(operator.add, per_rank)


def operand_dtensor(mesh, rank, operand):
    """The DTensor of a ``P(...)``/``R(...)`` operand on ``rank``; a plain tensor is
    returned as is."""
    if isinstance(operand, torch.Tensor):
        return operand
    kind, reduce_op, dtype, values = operand
    if kind == "R":
        return DTensor.from_local(
            torch.tensor(values, dtype=dtype), mesh, [Replicate()], run_check=False
        )
    local = map_local_for_rank(rank, lambda r: torch.tensor(values[r], dtype=dtype))
    return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)


XS = [1.5, 2.0, 3.0, 1.0], [0.5, -2.0, 1.0, 3.0]


class DistPartialRsubTest(DTensorContinuousTestBase):
    world_size = 2

    def _dtensor(self, mesh, operand):
        return operand_dtensor(mesh, self.rank, operand)

    def _check(self, mesh, fn, operands, placement, collectives):
        """fn on DTensors of ``operands`` against fn on the reduced tensors."""
        plain = [
            o if isinstance(o, torch.Tensor) else reduced_value(o) for o in operands
        ]
        truth = fn(*plain)
        inputs = [self._dtensor(mesh, o) for o in operands]
        comm_mode = CommDebugMode()
        with comm_mode:
            res = fn(*inputs)
        self.assertEqual(comm_mode.get_total_counts(), collectives)
        self.assertEqual(res.placements, (placement,))
        self.assertEqual(res.dtype, truth.dtype)
        exact = not truth.dtype.is_floating_point
        tol = {"atol": 0, "rtol": 0} if exact else {}
        self.assertEqual(res.full_tensor(), truth, **tol)

    def test_a_replicate_operand_of_another_dtype_keeps_a_partial_sum(self):
        # The Replicate operand is split into a Partial("sum") that converts
        # exactly (an integer whole on one rank, zeros on the others), as for
        # sub: no collective (through the decomposition: one all-reduce, and
        # rsub.Tensor_out had no strategy).
        mesh = self.build_device_mesh()
        dtypes = (f32,) if dist.get_backend() == "gloo" else (f32, bf16, f16)
        cases = [
            ("rsub 0-dim int64", torch.rsub, torch.tensor(5)),
            ("rsub int64 R", torch.rsub, R(i64, [5, 1, 2, 3])),
            (
                "rsub(int64 R, P) alpha=2",
                lambda x, y: torch.rsub(y, x, alpha=2),
                R(i64, [5, 1, 2, 3]),
            ),
            (
                "rsub.Tensor_out(out=self) int64 R",
                lambda x, y: torch.ops.aten.rsub.Tensor_out(x, y, out=x),
                R(i64, [5, 1, 2, 3]),
            ),
        ]
        for dtype in dtypes:
            for name, fn, other in cases:
                with self.subTest(name, dtype=dtype):
                    self._check(mesh, fn, [P(dtype, *XS), other], Partial(), 0)

    def test_the_result_has_the_promoted_dtype(self):
        # The decomposition computed these in float32 and, for int8, per rank
        # before the wrapping sum: rsub(i8 P, i8 R) read -197.0 for 59.
        if dist.get_backend() == "gloo":
            return  # int8/float16 all-reduce; the LocalTensor twin checks it
        mesh = self.build_device_mesh()
        with self.subTest("rsub(float16 P, uint8 R)"):
            self._check(
                mesh, torch.rsub, [P(f16, *XS), R(u8, [5, 1, 2, 3])], Partial(), 0
            )
        with self.subTest("rsub(int8 P, int8 R)"):
            self._check(
                mesh,
                torch.rsub,
                [P(i8, [100, 1], [100, 2]), R(i8, [3, 1])],
                Partial(),
                0,
            )

    def test_what_sub_reduces_rsub_reduces(self):
        mesh = self.build_device_mesh()
        # rsub(P(max), R) is R - P(max): a negated max is not a max.
        x = P(f32, *XS, reduce_op="max")
        self._check(mesh, torch.rsub, [x, R(f32, [1.0, 2.0, 3.0, 4.0])], Replicate(), 1)
        # Through other it is kept: rsub(R, P(max)) is P(max) - R.
        r = R(f32, [1.0, 2.0, 3.0, 4.0])
        self._check(mesh, torch.rsub, [r, x], Partial("max"), 0)

    def test_a_bool_operand_raises_as_plain_torch(self):
        # The decomposition cast the bool operand and returned a value; plain
        # torch (and sub) refuse a bool operand.
        mesh = self.build_device_mesh()
        x = self._dtensor(mesh, P(f32, *XS))
        b = self._dtensor(mesh, R(torch.bool, [True, False, True, False]))
        with self.assertRaisesRegex(NotImplementedError, "with a bool tensor"):
            torch.rsub(reduced_value(P(f32, *XS)), torch.tensor([True, False] * 2))
        with self.assertRaisesRegex(NotImplementedError, "with a bool tensor"):
            torch.rsub(x, b)


DistPartialRsubTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialRsubTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
