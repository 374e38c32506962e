# Owner(s): ["oncall: distributed"]
"""threshold and nan_to_num keep a Partial("max")/Partial("min") only where their
arguments keep them non-decreasing.

threshold(x, t, v) is x where x > t and v elsewhere: non-decreasing only for v <= t.
nan_to_num(x, nan, posinf, neginf) maps inf to posinf and -inf to neginf: non-decreasing
only where posinf is at least, and neginf at most, every finite value of the dtype (the
defaults are the dtype's limits). On 2 ranks, Partial("max") locals 5 / -3 through
threshold(x, 0, 10) are 5 / 10 per rank, whose max 10 is not threshold(5, 0, 10) = 5.
Each case asserts the value against the op on the reduced plain tensors, the placement
and the collective count, for Partial("max") and Partial("min"), on 2 and 3 ranks.
"""

import functools

import torch
import torch.nn.functional as F
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
inf = float("inf")
nan = float("nan")
# Per-rank locals: every rank's max and min differ from its own value somewhere,
# with inf, -inf and values beyond +-100 on some ranks (inf next to 500 and
# -inf next to -300 on another rank).
LOCALS = [
    [5.0, -1.0, inf, -300.0, 500.0, -0.5],
    [-3.0, -2.0, 500.0, -inf, 7.0, -500.0],
    [0.5, 7.0, 2.0, 4.0, -8.0, 300.0],
]

# (name, fn, keeps the Partial)
MONOTONE = [
    ("threshold(0, -10)", lambda x: torch.threshold(x, 0.0, -10.0), True),
    ("threshold(0, 0)", lambda x: torch.threshold(x, 0.0, 0.0), True),
    ("threshold(-2.5, -2.5)", lambda x: torch.threshold(x, -2.5, -2.5), True),
    ("F.threshold(1, -1)", lambda x: F.threshold(x, 1.0, -1.0), True),
    ("nan_to_num()", torch.nan_to_num, True),
    ("nan_to_num(nan=3)", lambda x: torch.nan_to_num(x, nan=3.0), True),
    (
        "nan_to_num(posinf=inf, neginf=-inf)",
        lambda x: torch.nan_to_num(x, posinf=inf, neginf=-inf),
        True,
    ),
    (
        "nan_to_num(posinf=1e39, neginf=-1e39)",
        lambda x: torch.nan_to_num(x, posinf=1e39, neginf=-1e39),
        True,
    ),
    (
        "nan_to_num(posinf=finfo.max, neginf=finfo.min)",
        lambda x: torch.nan_to_num(
            x, posinf=torch.finfo(x.dtype).max, neginf=torch.finfo(x.dtype).min
        ),
        True,
    ),
    # x <= nan never holds: the identity (torch.threshold's kernel), whatever the
    # order of the locals
    ("threshold(nan, 3)", lambda x: torch.threshold(x, nan, 3.0), True),
]
NOT_MONOTONE = [
    ("threshold(0, 10)", lambda x: torch.threshold(x, 0.0, 10.0), False),
    ("threshold(-2.5, 10)", lambda x: torch.threshold(x, -2.5, 10.0), False),
    ("threshold(0, 1e-3)", lambda x: torch.threshold(x, 0.0, 1e-3), False),
    ("F.threshold(1, 2)", lambda x: F.threshold(x, 1.0, 2.0), False),
    ("nan_to_num(posinf=-100)", lambda x: torch.nan_to_num(x, posinf=-100.0), False),
    ("nan_to_num(neginf=100)", lambda x: torch.nan_to_num(x, neginf=100.0), False),
    ("nan_to_num(posinf=100)", lambda x: torch.nan_to_num(x, posinf=100.0), False),
    ("nan_to_num(neginf=-100)", lambda x: torch.nan_to_num(x, neginf=-100.0), False),
    (
        "nan_to_num(posinf=-6, neginf=6)",
        lambda x: torch.nan_to_num(x, posinf=-6.0, neginf=6.0),
        False,
    ),
]

# The kernel reads the scalars in the input's dtype (threshold's t in float32
# for a half or bfloat16 input on CPU): compared there, not as Python numbers.
# (name, dtype, locals per rank, fn, keeps the Partial)
F16 = [
    [0.1, 1.0, 5.0, -1.0],
    [0.0999755859375, 0.5, -3.0, 2.0],
    [0.10003662109375, 0.999, 0.5, 0.0],
]
INTS = [[5, -1, 0, 1], [-3, 2, 1, 0], [0, 0, -2, 3]]
U8 = [[0, 7, 6], [1, 3, 0], [2, 0, 5]]
F16_INF = [[inf, 1.0, -inf], [65504.0, -inf, 2.0], [3.0, 4.0, 65504.0]]
CAST = [
    # uint8 wraps v = -1 to 255: x <= 0 gives 255, x = 1 stays 1
    (
        "uint8 threshold(0, -1)",
        torch.uint8,
        U8,
        lambda x: torch.threshold(x, 0, -1),
        False,
    ),
    # -250 is 6, the value next above t = 5
    (
        "uint8 threshold(5, -250)",
        torch.uint8,
        U8,
        lambda x: torch.threshold(x, 5, -250),
        True,
    ),
    # t = -1 is 255: every x becomes 0
    (
        "uint8 threshold(-1, 0)",
        torch.uint8,
        U8,
        lambda x: torch.threshold(x, -1, 0),
        True,
    ),
    # 1e-300 is 0 in float32
    (
        "float32 threshold(0, 1e-300)",
        torch.float32,
        LOCALS,
        lambda x: torch.threshold(x, 0.0, 1e-300),
        True,
    ),
    # ... but not in float64, where 5e-324 lies between
    (
        "float64 threshold(0, 1e-300)",
        torch.float64,
        LOCALS,
        lambda x: torch.threshold(x, 0.0, 1e-300),
        False,
    ),
    # an integer t and v truncate; v = 1 is the value next above t = 0
    (
        "int32 threshold(0, 0.5)",
        torch.int32,
        INTS,
        lambda x: torch.threshold(x, 0, 0.5),
        True,
    ),
    (
        "int32 threshold(-0.5, 0)",
        torch.int32,
        INTS,
        lambda x: torch.threshold(x, -0.5, 0),
        True,
    ),
    (
        "int32 threshold(0, 1)",
        torch.int32,
        INTS,
        lambda x: torch.threshold(x, 0, 1),
        True,
    ),
    (
        "int32 threshold(0, 2)",
        torch.int32,
        INTS,
        lambda x: torch.threshold(x, 0, 2),
        False,
    ),
    # float16 0.10001 is 0.10004, the value next above 0.1 (0.09998 in
    # float16, 0.1 in float32); 0.1001 is 0.10010, with 0.10004 between
    (
        "float16 threshold(0.1, 0.10001)",
        torch.float16,
        F16,
        lambda x: torch.threshold(x, 0.1, 0.10001),
        True,
    ),
    (
        "float16 threshold(0.1, 0.1001)",
        torch.float16,
        F16,
        lambda x: torch.threshold(x, 0.1, 0.1001),
        False,
    ),
    # bfloat16 0.1 and 0.1001 are both 0.10010, and no bfloat16 value lies
    # between float32's 0.1 and 0.10010
    (
        "bfloat16 threshold(0.1, 0.1001)",
        torch.bfloat16,
        F16,
        lambda x: torch.threshold(x, 0.1, 0.1001),
        True,
    ),
    # 0.9999 is 1.0 in float16 but not in float32 (CPU's compare): v = 1.0 is
    # t in float16 and the value next above t in float32
    (
        "float16 threshold(0.9999, 1)",
        torch.float16,
        F16,
        lambda x: torch.threshold(x, 0.9999, 1.0),
        True,
    ),
    # ... but 1.00098, the value next above 1.0, is not next above float32's
    # 0.9999: x = 1.0 stays 1.0 on CPU while 0.5 becomes 1.00098
    (
        "float16 threshold(0.9999, 1.00098)",
        torch.float16,
        F16,
        lambda x: torch.threshold(x, 0.9999, 1.0009765625),
        False,
    ),
    # float16 65490 is 65504, its largest value; 65480 is 65472
    (
        "float16 nan_to_num(posinf=65490)",
        torch.float16,
        F16_INF,
        lambda x: torch.nan_to_num(x, posinf=65490.0, neginf=-65490.0),
        True,
    ),
    (
        "float16 nan_to_num(posinf=65480)",
        torch.float16,
        F16_INF,
        lambda x: torch.nan_to_num(x, posinf=65480.0),
        False,
    ),
]


class PartialMaxMinMonotoneArgsTest(DTensorContinuousTestBase):
    world_size = 2

    def _partial(self, mesh, reduce_op, dtype=torch.float32, locals_=LOCALS):
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor(locals_[r], dtype=dtype)
        )
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _reduced(self, reduce_op, dtype=torch.float32, locals_=LOCALS):
        pick = torch.maximum if reduce_op == "max" else torch.minimum
        return functools.reduce(
            pick,
            [torch.tensor(locals_[r], dtype=dtype) for r in range(self.world_size)],
        )

    def _check(self, fn, x, truth, placement, collectives):
        comm_mode = CommDebugMode()
        with comm_mode:
            res = fn(x)
        self.assertEqual(comm_mode.get_total_counts(), collectives)
        self.assertEqual(res.placements, (placement,))
        self.assertEqual(res.full_tensor(), truth, atol=0, rtol=0)

    def _cases(self, cases):
        mesh = self.build_device_mesh()
        for reduce_op in ("max", "min"):
            for name, fn, keeps in cases:
                with self.subTest(name, reduce_op=reduce_op):
                    self._check(
                        fn,
                        self._partial(mesh, reduce_op),
                        fn(self._reduced(reduce_op)),
                        Partial(reduce_op) if keeps else Replicate(),
                        0 if keeps else 1,
                    )

    def test_monotone_arguments_keep_the_partial(self):
        self._cases(MONOTONE)

    def test_other_arguments_reduce_first(self):
        self._cases(NOT_MONOTONE)

    def test_arguments_are_part_of_the_cache_key(self):
        # The same op, input spec and dtypes with another value: each call
        # gets its own plan, in either order.
        mesh = self.build_device_mesh()
        for reduce_op in ("max", "min"):
            truth = self._reduced(reduce_op)
            x = self._partial(mesh, reduce_op)
            for _ in range(2):
                for name, fn, keeps in (MONOTONE[0], NOT_MONOTONE[0]) + (
                    MONOTONE[4],
                    NOT_MONOTONE[4],
                    MONOTONE[4],
                    NOT_MONOTONE[5],
                ):
                    with self.subTest(name, reduce_op=reduce_op):
                        self._check(
                            fn,
                            x,
                            fn(truth),
                            Partial(reduce_op) if keeps else Replicate(),
                            0 if keeps else 1,
                        )

    def test_in_place_and_out(self):
        mesh = self.build_device_mesh()
        for reduce_op in ("max", "min"):
            truth = self._reduced(reduce_op)
            keep = [
                ("threshold_(0, -10)", lambda x: torch.threshold_(x, 0.0, -10.0)),
                ("nan_to_num_()", lambda x: x.nan_to_num_()),
                (
                    "threshold.out(0, -10)",
                    lambda x: aten.threshold.out(
                        x, 0.0, -10.0, out=torch.empty_like(x)
                    ),
                ),
                (
                    "nan_to_num(out=)",
                    lambda x: torch.nan_to_num(x, out=torch.empty_like(x)),
                ),
            ]
            for name, fn in keep:
                with self.subTest(name, reduce_op=reduce_op):
                    self._check(
                        fn,
                        self._partial(mesh, reduce_op),
                        fn(truth.clone()),
                        Partial(reduce_op),
                        0,
                    )
            refuse = [
                ("threshold_(0, 10)", lambda x: torch.threshold_(x, 0.0, 10.0)),
                ("nan_to_num_(posinf=-100)", lambda x: x.nan_to_num_(posinf=-100.0)),
            ]
            for name, fn in refuse:
                with self.subTest(name, reduce_op=reduce_op):
                    x = self._partial(mesh, reduce_op)
                    before = x.to_local().clone()
                    with self.assertRaisesRegex(RuntimeError, "in-place operations"):
                        fn(x)
                    self.assertEqual(x.to_local(), before)
            # An out= of another placement than the input's Partial: the value
            # is computed from the reduced input.
            for name, fn in (
                (
                    "threshold.out(0, 10)",
                    lambda x, o: aten.threshold.out(x, 0.0, 10.0, out=o),
                ),
                (
                    "nan_to_num(posinf=-100, out=)",
                    lambda x, o: torch.nan_to_num(x, posinf=-100.0, out=o),
                ),
            ):
                with self.subTest(name, reduce_op=reduce_op):
                    x = self._partial(mesh, reduce_op)
                    out = DTensor.from_local(
                        torch.empty(len(LOCALS[0])),
                        mesh,
                        [Replicate()],
                        run_check=False,
                    )
                    self._check(
                        lambda x: fn(x, out),
                        x,
                        fn(truth, torch.empty_like(truth)),
                        Replicate(),
                        1,
                    )

    def test_scalars_compared_in_the_input_dtype(self):
        mesh = self.build_device_mesh()
        for reduce_op in ("max", "min"):
            for name, dtype, locals_, fn, keeps in CAST:
                with self.subTest(name, reduce_op=reduce_op):
                    self._check(
                        fn,
                        self._partial(mesh, reduce_op, dtype, locals_),
                        fn(self._reduced(reduce_op, dtype, locals_)),
                        Partial(reduce_op) if keeps else Replicate(),
                        0 if keeps else 1,
                    )
            # In place: the arguments that keep the order in the dtype keep
            # the Partial; uint8's wrapped -1 is refused.
            for name, dtype, locals_, fn in (
                (
                    "float32 threshold_(0, 1e-300)",
                    torch.float32,
                    LOCALS,
                    lambda x: torch.threshold_(x, 0.0, 1e-300),
                ),
                (
                    "int32 threshold_(0, 0.5)",
                    torch.int32,
                    INTS,
                    lambda x: torch.threshold_(x, 0, 0.5),
                ),
                (
                    "float16 threshold_(0.1, 0.10001)",
                    torch.float16,
                    F16,
                    lambda x: torch.threshold_(x, 0.1, 0.10001),
                ),
                (
                    "float16 nan_to_num_(posinf=65490)",
                    torch.float16,
                    F16_INF,
                    lambda x: x.nan_to_num_(posinf=65490.0),
                ),
            ):
                with self.subTest(name, reduce_op=reduce_op):
                    self._check(
                        fn,
                        self._partial(mesh, reduce_op, dtype, locals_),
                        fn(self._reduced(reduce_op, dtype, locals_)),
                        Partial(reduce_op),
                        0,
                    )
            with self.subTest("uint8 threshold_(0, -1)", reduce_op=reduce_op):
                x = self._partial(mesh, reduce_op, torch.uint8, U8)
                before = x.to_local().clone()
                with self.assertRaisesRegex(RuntimeError, "in-place operations"):
                    torch.threshold_(x, 0, -1)
                self.assertEqual(x.to_local(), before)

    def test_other_dtypes(self):
        mesh = self.build_device_mesh()
        for reduce_op in ("max", "min"):
            for dtype in (torch.float64, torch.bfloat16):
                truth = self._reduced(reduce_op, dtype)
                for name, fn, keeps in (MONOTONE[4], NOT_MONOTONE[4], NOT_MONOTONE[5]):
                    with self.subTest(name, reduce_op=reduce_op, dtype=dtype):
                        self._check(
                            fn,
                            self._partial(mesh, reduce_op, dtype),
                            fn(truth),
                            Partial(reduce_op) if keeps else Replicate(),
                            0 if keeps else 1,
                        )
            # An integer input has no inf: nan_to_num copies it whatever its
            # arguments, and keeps the Partial.
            ints = [[5, -1, 3], [-3, -2, 1], [0, 7, 2]]
            fn = lambda x: torch.nan_to_num(x, posinf=-100.0, neginf=100.0)  # noqa: E731
            with self.subTest("int32 nan_to_num", reduce_op=reduce_op):
                self._check(
                    fn,
                    self._partial(mesh, reduce_op, torch.int32, ints),
                    fn(self._reduced(reduce_op, torch.int32, ints)),
                    Partial(reduce_op),
                    0,
                )


# The same tests on 3 ranks (create_local_tensor_test_class wraps only the
# methods a class defines itself).
PartialMaxMinMonotoneArgsThreeRanksTest = type(
    "PartialMaxMinMonotoneArgsThreeRanksTest",
    (DTensorContinuousTestBase,),
    {
        **{
            k: v
            for k, v in PartialMaxMinMonotoneArgsTest.__dict__.items()
            if not k.startswith("__")
        },
        "world_size": 3,
    },
)

PartialMaxMinMonotoneArgsTestWithLocalTensor = create_local_tensor_test_class(
    PartialMaxMinMonotoneArgsTest, base_class=LocalDTensorContinuousTestBase
)
PartialMaxMinMonotoneArgsThreeRanksTestWithLocalTensor = create_local_tensor_test_class(
    PartialMaxMinMonotoneArgsThreeRanksTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
