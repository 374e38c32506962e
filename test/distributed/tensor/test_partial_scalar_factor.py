# Owner(s): ["oncall: distributed"]
"""mul and div keep a Partial("sum"/"avg") pending only for a finite factor and a
nonzero divisor.

(a + b) * s = a * s + b * s fails for s = inf where a piece is 0 (0 * inf is nan)
or where pieces have opposite signs (-inf + inf is nan), and the same holds for a
division by zero: on 2 ranks, Partial("sum") pieces [0, 5] * inf read nan where the
sum times inf is inf. "Finite" and "zero" are judged in the computation's dtype: a
float32, bfloat16 or float16 tensor computes in float32, where 2.0**128 is inf and
2.0**-160 is 0 (a divisor below float32's smallest normal number is refused too).
Each case asserts the value against the op on the reduced plain tensor, the
placement and the collective count, for Partial("sum") and Partial("avg"), in
float32, bfloat16, float16 and float64, on 2 and 3 ranks and a 2 x 2 mesh, each call
on empty sharding caches (a propagation miss). A foreach op's ScalarList gives each
element its own number.
"""

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)


aten = torch.ops.aten
inf = float("inf")
nan = float("nan")
# Per-rank pieces: a zero piece next to a positive one, pieces of opposite signs,
# one rank holding the whole value, all ranks equal.
LOCALS = [
    [0.0, -2.0, 4.0, 1.0],
    [5.0, 5.0, 0.0, 1.0],
    [0.0, 1.0, 0.0, 1.0],
    [2.0, -8.0, 0.0, 1.0],
]
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

WIDE = {torch.float64}
CAST_ERROR = "can't be cast to the desired output type"
# (name, fn, keeps the Partial: True, False, or the dtypes in which it does)
CASES = [
    ("x * 2.0", lambda x: x * 2.0, True),
    ("x * 3", lambda x: x * 3, True),
    ("x * nan", lambda x: x * nan, True),
    ("x * inf", lambda x: x * inf, False),
    ("x * -inf", lambda x: x * -inf, False),
    ("inf * x", lambda x: inf * x, False),
    ("torch.mul(x, inf)", lambda x: torch.mul(x, inf), False),
    # finite in float64, inf in float32 (the computation dtype of float32,
    # bfloat16 and float16)
    ("x * 2.0**128", lambda x: x * 2.0**128, WIDE),
    ("x * -(2.0**128)", lambda x: x * -(2.0**128), WIDE),
    ("mul.Scalar(x, 2.0**128)", lambda x: aten.mul.Scalar(x, 2.0**128), WIDE),
    (
        "_foreach_mul(Scalar 2.0**128)",
        lambda x: torch._foreach_mul([x], 2.0**128)[0],
        WIDE,
    ),
    ("x / 2.0", lambda x: x / 2.0, True),
    ("x / inf", lambda x: x / inf, True),
    # 0 in float32 / below float32's smallest normal number / below float64's
    ("x / 2.0**-160", lambda x: x / 2.0**-160, WIDE),
    ("x / 2.0**-140", lambda x: x / 2.0**-140, WIDE),
    ("div.Scalar(x, 2.0**-140)", lambda x: aten.div.Scalar(x, 2.0**-140), WIDE),
    (
        "_foreach_div(ScalarList [2.0**-140])",
        lambda x: torch._foreach_div([x], [2.0**-140])[0],
        WIDE,
    ),
    ("x / 2.0**-1074", lambda x: x / 2.0**-1074, False),
    ("x / 0.0", lambda x: x / 0.0, False),
    ("x / -0.0", lambda x: x / -0.0, False),
    ("x / 0", lambda x: x / 0, False),
    ("torch.true_divide(x, 0.0)", lambda x: torch.true_divide(x, 0.0), False),
    ("mul.Scalar(x, 2.0)", lambda x: aten.mul.Scalar(x, 2.0), True),
    ("mul.Scalar(x, inf)", lambda x: aten.mul.Scalar(x, inf), False),
    ("div.Scalar(x, 2.0)", lambda x: aten.div.Scalar(x, 2.0), True),
    ("div.Scalar(x, 0.0)", lambda x: aten.div.Scalar(x, 0.0), False),
    ("_foreach_mul(Scalar inf)", lambda x: torch._foreach_mul([x], inf)[0], False),
    ("_foreach_mul(Scalar 2)", lambda x: torch._foreach_mul([x], 2.0)[0], True),
    (
        "_foreach_mul(ScalarList [2, inf])",
        lambda x: torch._foreach_mul([x, x], [2.0, inf])[1],
        False,
    ),
    ("_foreach_div(Scalar 0)", lambda x: torch._foreach_div([x], 0.0)[0], False),
    (
        "_foreach_div(ScalarList [0])",
        lambda x: torch._foreach_div([x], [0.0])[0],
        False,
    ),
]


class PartialScalarFactorTest(DTensorContinuousTestBase):
    world_size = 2

    def _mesh(self):
        return self.build_device_mesh()

    def _placements(self, reduce_op):
        return [Partial(reduce_op)]

    def _partial(self, mesh, reduce_op, dtype):
        placements = self._placements(reduce_op)
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor(LOCALS[r], dtype=dtype)
        )
        return DTensor.from_local(local, mesh, placements, run_check=False)

    def _reduced(self, reduce_op, dtype, fn=None):
        """The reduced input in dtype, or with fn, fn of each piece reduced (the
        value of a plan that keeps the Partial pending through fn)."""
        pieces = torch.tensor(LOCALS[: self.world_size], dtype=torch.float64)
        if fn is not None:
            pieces = fn(pieces)
        whole = pieces.sum(0) if reduce_op == "sum" else pieces.mean(0)
        return whole.to(dtype)

    def _check(self, fn, x, truth, keeps):
        if not isinstance(keeps, bool):
            keeps = x.dtype in keeps
        comm_mode = CommDebugMode()
        with comm_mode:
            res = fn(x)
        if keeps:
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(res.placements, x.placements)
        else:
            self.assertGreater(comm_mode.get_total_counts(), 0)
            self.assertEqual(res.placements, (Replicate(),) * x.device_mesh.ndim)
        self.assertEqual(res.full_tensor(), truth, atol=0, rtol=0)

    def test_factor_values(self):
        mesh = self._mesh()
        for reduce_op in ("sum", "avg"):
            for dtype in DTYPES:
                for name, fn, keeps in CASES:
                    with self.subTest(name, reduce_op=reduce_op, dtype=dtype):
                        # each call on empty caches (a sharding propagation miss)
                        _clear_sharding_prop_cache()
                        self._check(
                            fn,
                            self._partial(mesh, reduce_op, dtype),
                            fn(self._reduced(reduce_op, dtype)),
                            keeps,
                        )

    def test_in_place_non_finite_factor_refused(self):
        # In place, a Partial self that must be reduced first is refused, as for
        # every op that needs a placement change; a finite factor stays pending.
        mesh = self._mesh()
        for reduce_op in ("sum", "avg"):
            x = self._partial(mesh, reduce_op, torch.float32)
            truth = self._reduced(reduce_op, torch.float32)
            x.mul_(2.0)
            self.assertEqual(x.placements, tuple(self._placements(reduce_op)))
            self.assertEqual(x.full_tensor(), truth * 2.0, atol=0, rtol=0)
            for fn in (lambda t: t.mul_(inf), lambda t: t.div_(0.0)):
                # on empty caches (a cache hit of a finite factor's plan needs
                # the value class in the keys)
                _clear_sharding_prop_cache()
                with self.assertRaisesRegex(RuntimeError, "placement"):
                    fn(self._partial(mesh, reduce_op, torch.float32))

    def test_integer_partial(self):
        # An integer or bool Partial("sum") times a float factor computes in a
        # floating dtype, so it is reduced first whatever the factor's value;
        # in place, the kernel's dtype error is raised as for a plain tensor
        # (not a placement error), and an integer factor keeps it pending.
        mesh = self._mesh()
        partial = tuple(self._placements("sum"))
        replicate = (Replicate(),) * mesh.ndim
        out_of_place = [
            ("x * inf", lambda x: x * inf, False),
            ("x * -inf", lambda x: x * -inf, False),
            ("x * 1e39", lambda x: x * 1e39, False),
            ("x * 2.0**130", lambda x: x * 2.0**130, False),
            ("x * 2.0", lambda x: x * 2.0, False),
            ("x / 0", lambda x: x / 0, False),
            ("x / 0.0", lambda x: x / 0.0, False),
            ("x / 2.0**-160", lambda x: x / 2.0**-160, False),
            (
                "_foreach_mul(Scalar inf)",
                lambda x: torch._foreach_mul([x], inf)[0],
                False,
            ),
            ("x * 3", lambda x: x * 3, True),
        ]
        in_place = [
            ("x.mul_(inf)", lambda x: x.mul_(inf)),
            ("x.mul_(1e39)", lambda x: x.mul_(1e39)),
            ("x.mul_(2.0)", lambda x: x.mul_(2.0)),
            ("x.div_(0.0)", lambda x: x.div_(0.0)),
            ("x.div_(0)", lambda x: x.div_(0)),
            ("_foreach_mul_([x], inf)", lambda x: torch._foreach_mul_([x], inf)),
        ]
        for dtype in (torch.int64, torch.int32, torch.bool):
            pieces = torch.stack(
                [torch.tensor(p).to(dtype) for p in LOCALS[: self.world_size]]
            )
            truth = pieces.sum(0).to(dtype)
            for name, fn, keeps in out_of_place:
                if keeps and dtype == torch.bool:
                    keeps = False  # bool * 3 computes in int64
                with self.subTest(name, dtype=dtype):
                    _clear_sharding_prop_cache()
                    x = self._partial(mesh, "sum", dtype)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        res = fn(x)
                    if keeps:
                        self.assertEqual(comm_mode.get_total_counts(), 0)
                        self.assertEqual(res.placements, partial)
                    else:
                        self.assertGreater(comm_mode.get_total_counts(), 0)
                        self.assertEqual(res.placements, replicate)
                    self.assertEqual(res.full_tensor(), fn(truth.clone()))
            for name, fn in in_place:
                with self.subTest(name, dtype=dtype):
                    # the dtype error (from the kernel, or from sharding
                    # propagation's meta run for div_), as for a plain tensor
                    with self.assertRaisesRegex(RuntimeError, CAST_ERROR):
                        fn(truth.clone())
                    _clear_sharding_prop_cache()
                    with self.assertRaisesRegex(RuntimeError, CAST_ERROR):
                        fn(self._partial(mesh, "sum", dtype))

    def _replicate(self, mesh, dtype):
        local = torch.tensor(LOCALS[0], dtype=dtype)
        placements = [Replicate()] * mesh.ndim
        return DTensor.from_local(local, mesh, placements, run_check=False)

    def test_foreach_scalar_list_per_element(self):
        # Each element is judged by its own number: a finite one keeps its
        # Partial element pending, a refusing one reduces only its element, and
        # one that meets no Partial reduces nothing (in place too).
        mesh = self._mesh()
        for reduce_op in ("sum", "avg"):
            for dtype in DTYPES:
                truth = self._reduced(reduce_op, dtype)
                rep = torch.tensor(LOCALS[0], dtype=dtype)
                partial = tuple(self._placements(reduce_op))
                replicate = (Replicate(),) * mesh.ndim
                huge = inf if dtype in WIDE else 2.0**128
                cases = [
                    # (name, fn, second input is Partial, truths, placements,
                    # collectives)
                    (
                        "_foreach_mul([P, P], [2.0, huge])",
                        lambda a, b: torch._foreach_mul([a, b], [2.0, huge]),
                        True,
                        (truth * 2.0, truth * huge),
                        (partial, replicate),
                        mesh.ndim,
                    ),
                    (
                        "_foreach_div([P, P], [2.0, 0.0])",
                        lambda a, b: torch._foreach_div([a, b], [2.0, 0.0]),
                        True,
                        (truth / 2.0, truth / 0.0),
                        (partial, replicate),
                        mesh.ndim,
                    ),
                    (
                        "_foreach_mul([P, R], [2.0, huge])",
                        lambda a, b: torch._foreach_mul([a, b], [2.0, huge]),
                        False,
                        (truth * 2.0, rep * huge),
                        (partial, replicate),
                        0,
                    ),
                    (
                        "_foreach_mul_([P, R], [2.0, huge])",
                        lambda a, b: (torch._foreach_mul_([a, b], [2.0, huge]), [a, b])[
                            1
                        ],
                        False,
                        (truth * 2.0, rep * huge),
                        (partial, replicate),
                        0,
                    ),
                    (
                        "_foreach_div_([P, R], [2.0, 0.0])",
                        lambda a, b: (torch._foreach_div_([a, b], [2.0, 0.0]), [a, b])[
                            1
                        ],
                        False,
                        (truth / 2.0, rep / 0.0),
                        (partial, replicate),
                        0,
                    ),
                ]
                for name, fn, both_partial, truths, placements, count in cases:
                    with self.subTest(name, reduce_op=reduce_op, dtype=dtype):
                        _clear_sharding_prop_cache()
                        a = self._partial(mesh, reduce_op, dtype)
                        b = (
                            self._partial(mesh, reduce_op, dtype)
                            if both_partial
                            else self._replicate(mesh, dtype)
                        )
                        comm_mode = CommDebugMode()
                        with comm_mode:
                            results = fn(a, b)
                        self.assertEqual(comm_mode.get_total_counts(), count)
                        for res, t, p in zip(results, truths, placements):
                            self.assertEqual(res.placements, p)
                            self.assertEqual(res.full_tensor(), t, atol=0, rtol=0)

    def test_foreach_scalar_list_pairing_order(self):
        # The sharding caches' keys leave a ScalarList's numbers out, so a
        # call whose refusing number meets no floating pending element (a
        # Replicate or an integer Partial one) must not cache a plan that the
        # same call with the numbers swapped would get: there the refusing
        # number meets the floating Partial element.
        mesh = self._mesh()
        replicate = (Replicate(),) * mesh.ndim
        for other in ("replicate", "int64 partial"):
            for reduce_op in ("sum", "avg"):
                with self.subTest(other=other, reduce_op=reduce_op):
                    _clear_sharding_prop_cache()
                    truth = self._reduced(reduce_op, torch.float32)
                    if other == "replicate":
                        b = self._replicate(mesh, torch.float32)
                        b_truth = torch.tensor(LOCALS[0], dtype=torch.float32)
                    else:
                        b = self._partial(mesh, "sum", torch.int64)
                        b_truth = torch.stack(
                            [torch.tensor(p) for p in LOCALS[: self.world_size]]
                        ).sum(0)
                    a = self._partial(mesh, reduce_op, torch.float32)
                    first = torch._foreach_mul([a, b], [2.0, inf])
                    self.assertEqual(first[0].full_tensor(), truth * 2.0)
                    self.assertEqual(first[1].full_tensor(), b_truth * inf)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        second = torch._foreach_mul([a, b], [inf, 2.0])
                    self.assertEqual(second[0].placements, replicate)
                    self.assertGreater(comm_mode.get_total_counts(), 0)
                    self.assertEqual(second[0].full_tensor(), truth * inf)
                    self.assertEqual(second[1].full_tensor(), b_truth * 2.0)


class PartialScalarFactor2x2Test(PartialScalarFactorTest):
    world_size = 4

    def _mesh(self):
        return init_device_mesh(self.device_type, (2, 2))

    def _placements(self, reduce_op):
        return [Partial(reduce_op), Partial(reduce_op)]


# The same tests on 3 ranks (create_local_tensor_test_class wraps only the methods a
# class defines itself).
PartialScalarFactorThreeRanksTest = type(
    "PartialScalarFactorThreeRanksTest",
    (DTensorContinuousTestBase,),
    {
        **{
            k: v
            for k, v in PartialScalarFactorTest.__dict__.items()
            if not k.startswith("__")
        },
        "world_size": 3,
    },
)
PartialScalarFactor2x2Test = type(
    "PartialScalarFactor2x2Test",
    (DTensorContinuousTestBase,),
    {
        **{
            k: v
            for k, v in PartialScalarFactorTest.__dict__.items()
            if not k.startswith("__")
        },
        **{
            k: v
            for k, v in PartialScalarFactor2x2Test.__dict__.items()
            if not k.startswith("__")
        },
    },
)

PartialScalarFactorTestWithLocalTensor = create_local_tensor_test_class(
    PartialScalarFactorTest, base_class=LocalDTensorContinuousTestBase
)
PartialScalarFactorThreeRanksTestWithLocalTensor = create_local_tensor_test_class(
    PartialScalarFactorThreeRanksTest, base_class=LocalDTensorContinuousTestBase
)
PartialScalarFactor2x2TestWithLocalTensor = create_local_tensor_test_class(
    PartialScalarFactor2x2Test, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
