# Owner(s): ["oncall: distributed"]
"""The sharding caches key a Python number's value class where they leave its value out.

The native (C++) sharding cache keys a Python scalar passed to a Tensor argument (a
wrapped number: `x * s`, `x / s`) by its dtype, and both the native key and the OpSchema
key of the Python sharding cache leave out a foreach op's Scalar and ScalarList, so that
a step-varying scalar keeps one entry. mul's and div's Partial("sum"/"avg") rules read
the value (a factor infinite in the computation's dtype and a divisor that is zero or
below its smallest normal number reduce first), so the keys hold its class: finite
nonzero, zero, +-inf, nan, beyond float32's range, below float32's or float64's
smallest normal number. These tests need that C++ change (`create_native_op_schema`
and the OpSchema comparison key in torch/csrc/autograd/python_variable.cpp) and are
skipped on a build without it.
"""

import unittest

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, RuntimeSchemaInfo
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


WORLD_SIZE = 2
aten = torch.ops.aten
inf = float("inf")
nan = float("nan")


def _foreach_scalar_key(value):
    return OpSchema(
        aten._foreach_mul.Scalar,
        ((), value),
        {},
        schema_info=RuntimeSchemaInfo(static_argnum=100),
    )


# Whether this build's keys hold the value class (the OpSchema key of a foreach
# Scalar 2.0 vs inf, computed in C++ like the native key).
KEYS_HOLD_VALUE_CLASS = _foreach_scalar_key(2.0) != _foreach_scalar_key(inf)
needs_value_class_keys = unittest.skipIf(
    not KEYS_HOLD_VALUE_CLASS,
    "needs the value class in the sharding cache keys (the C++ change to "
    "create_native_op_schema and the OpSchema comparison key in "
    "torch/csrc/autograd/python_variable.cpp); a build without it serves a "
    "finite factor's cached Partial plan to a later inf factor or zero divisor",
)


class ShardingCacheValueClassTest(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
        )
        self.addCleanup(dist.destroy_process_group)
        self.mode = LocalTensorMode(WORLD_SIZE)
        with self.mode:
            self.mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        _clear_sharding_prop_cache()
        self.addCleanup(_clear_sharding_prop_cache)

    def full(self, d):
        with self.mode:
            f = d.full_tensor()
        return f._local_tensors[0] if isinstance(f, LocalTensor) else f

    @needs_value_class_keys
    def test_op_schema_key_holds_value_class(self):
        # one value of each class per Python number type; values of one class share
        # a key, values of two classes do not (where the keys hold the class)
        classes = {
            "float": [
                [2.0, -0.5],
                [0.0, -0.0],
                [inf, -inf],
                [nan],
                # beyond float32's range, below its smallest normal number,
                # below float64's
                [2.0**128, -1e39],
                [2.0**-140, -1e-40],
                [2.0**-1074, 1e-310],
            ],
            "int": [[3, -1], [0]],
            "bool": [[True], [False]],
            "complex": [
                [1j, 2 + 0j],
                [0j],
                [complex(inf, 0), complex(0, -inf)],
                [complex(2.0**128, 1), complex(0, -1e39)],
                [complex(2.0**-140, 0), complex(1e-40, 1e-41)],
            ],
        }
        for kind, groups in classes.items():
            for i, group in enumerate(groups):
                for value in group:
                    for j, other_group in enumerate(groups):
                        other = other_group[0]
                        with self.subTest(kind=kind, value=value, other=other):
                            same = i == j
                            a, b = (
                                _foreach_scalar_key(value),
                                _foreach_scalar_key(other),
                            )
                            self.assertEqual(a == b, same)
                            if same:
                                self.assertEqual(hash(a), hash(b))
        # a ScalarList: each element's class
        info = RuntimeSchemaInfo(static_argnum=100)

        def key(values):
            return OpSchema(aten._foreach_div.ScalarList, ((), values), {}, info)

        self.assertEqual(key([2.0, 4.0]), key([3.0, 5.0]))
        self.assertNotEqual(key([2.0, 0.0]), key([2.0, 4.0]))
        self.assertNotEqual(key([0.0, 2.0]), key([2.0, 0.0]))

    @needs_value_class_keys
    def test_value_class_keeps_its_own_native_entry(self):
        # `x * inf` after `x * 2.0`, `x / 0` after `x / 2`, and the foreach forms: a
        # native cache miss where the key holds the class, and a later value of the
        # first class a hit. A Shard(0) x keeps its plan for every value, so only the
        # key is tested here.
        sequences = {
            "mul": [lambda x: x * 2.0, lambda x: x * inf, lambda x: x * 3.0],
            "div": [lambda x: x / 2, lambda x: x / 0, lambda x: x / 5],
            "mul 2.0**128": [
                lambda x: x * 2.0,
                lambda x: x * 2.0**128,
                lambda x: x * 3.0,
            ],
            "_foreach_mul": [
                lambda x: torch._foreach_mul([x], 2.0)[0],
                lambda x: torch._foreach_mul([x], inf)[0],
                lambda x: torch._foreach_mul([x], 3.0)[0],
            ],
            "_foreach_div ScalarList": [
                lambda x: torch._foreach_div([x, x], [2.0, 4.0])[1],
                lambda x: torch._foreach_div([x, x], [2.0, 0.0])[1],
                lambda x: torch._foreach_div([x, x], [3.0, 5.0])[1],
            ],
        }
        with self.mode:
            x = DTensor.from_local(
                LocalTensor(
                    {r: torch.tensor([1.0, -2.0]) * (r + 1) for r in range(WORLD_SIZE)}
                ),
                self.mesh,
                [Shard(0)],
                run_check=False,
            )
        stats = torch._C._get_DTensor_sharding_propagator_cache_stats
        for name, calls in sequences.items():
            with self.subTest(op=name):
                _clear_sharding_prop_cache()
                hits = []
                for fn in calls:
                    with self.mode:
                        before, _ = stats()
                        result = fn(x)
                        after, _ = stats()
                    hits.append(after - before)
                    self.assertEqual(self.full(result), fn(self.full(x)))
                self.assertEqual(hits, [0, 0, 1])


WIDE = {torch.float64}
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Per-rank pieces: a zero piece next to a positive one, pieces of opposite signs.
LOCALS = [
    [0.0, -2.0, 4.0, 1.0],
    [5.0, 5.0, 0.0, 1.0],
    [0.0, 1.0, 0.0, 1.0],
    [2.0, -8.0, 0.0, 1.0],
]
# One Partial input through alternating factors of one cache key each (a wrapped
# float, a wrapped int, a foreach Scalar, a ScalarList): every call gets the plan of
# its own value class. (name, fn, keeps the Partial: True, False, or the dtypes in
# which it does)
SEQUENCE = [
    ("x * 2.0", lambda x: x * 2.0, True),
    ("x * inf", lambda x: x * inf, False),
    ("x * 2.0", lambda x: x * 2.0, True),
    (
        "x * float64 0-d tensor 2.0",
        lambda x: x * torch.tensor(2.0, dtype=torch.float64),
        True,
    ),
    ("x * -inf", lambda x: x * -inf, False),
    ("x * 2.0**128", lambda x: x * 2.0**128, WIDE),
    ("x * 0.5", lambda x: x * 0.5, True),
    ("x / 2.0", lambda x: x / 2.0, True),
    ("x / 0.0", lambda x: x / 0.0, False),
    ("x / 4.0", lambda x: x / 4.0, True),
    ("x / 2.0**-140", lambda x: x / 2.0**-140, WIDE),
    ("x / 2.0", lambda x: x / 2.0, True),
    ("x / 2", lambda x: x / 2, True),
    ("x / 0", lambda x: x / 0, False),
    ("x / 2", lambda x: x / 2, True),
    ("_foreach_mul 2.0", lambda x: torch._foreach_mul([x], 2.0)[0], True),
    ("_foreach_mul inf", lambda x: torch._foreach_mul([x], inf)[0], False),
    ("_foreach_mul 2.0", lambda x: torch._foreach_mul([x], 2.0)[0], True),
    ("_foreach_mul 2.0**128", lambda x: torch._foreach_mul([x], 2.0**128)[0], WIDE),
    ("_foreach_div [2.0]", lambda x: torch._foreach_div([x], [2.0])[0], True),
    ("_foreach_div [0.0]", lambda x: torch._foreach_div([x], [0.0])[0], False),
    ("_foreach_div [2.0]", lambda x: torch._foreach_div([x], [2.0])[0], True),
    (
        "_foreach_mul [2.0, 3.0][1]",
        lambda x: torch._foreach_mul([x, x], [2.0, 3.0])[1],
        True,
    ),
    (
        "_foreach_mul [2.0, inf][1]",
        lambda x: torch._foreach_mul([x, x], [2.0, inf])[1],
        False,
    ),
    (
        "_foreach_mul [2.0, 3.0][1]",
        lambda x: torch._foreach_mul([x, x], [2.0, 3.0])[1],
        True,
    ),
]


class PartialFactorThroughCachesTest(DTensorContinuousTestBase):
    world_size = 2

    def _mesh(self):
        return self.build_device_mesh()

    def _placements(self, reduce_op):
        return [Partial(reduce_op)]

    def _partial(self, mesh, reduce_op, dtype):
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor(LOCALS[r], dtype=dtype)
        )
        return DTensor.from_local(
            local, mesh, self._placements(reduce_op), run_check=False
        )

    def _reduced(self, reduce_op, dtype):
        pieces = torch.tensor(LOCALS[: self.world_size], dtype=torch.float64)
        whole = pieces.sum(0) if reduce_op == "sum" else pieces.mean(0)
        return whole.to(dtype)

    @needs_value_class_keys
    def test_factor_sequence_through_caches(self):
        # Each call's value, placement and collectives as on empty caches.
        mesh = self._mesh()
        for reduce_op in ("sum", "avg"):
            for dtype in DTYPES:
                _clear_sharding_prop_cache()
                x = self._partial(mesh, reduce_op, dtype)
                truth = self._reduced(reduce_op, dtype)
                for step, (name, fn, keeps) in enumerate(SEQUENCE):
                    with self.subTest(
                        name, step=step, reduce_op=reduce_op, dtype=dtype
                    ):
                        if not isinstance(keeps, bool):
                            keeps = dtype in keeps
                        comm_mode = CommDebugMode()
                        with comm_mode:
                            res = fn(x)
                        if keeps:
                            self.assertEqual(comm_mode.get_total_counts(), 0)
                            self.assertEqual(res.placements, x.placements)
                        else:
                            self.assertEqual(comm_mode.get_total_counts(), mesh.ndim)
                            self.assertEqual(res.placements, (Replicate(),) * mesh.ndim)
                        self.assertEqual(res.full_tensor(), fn(truth), atol=0, rtol=0)


class PartialFactorThroughCaches2x2Test(PartialFactorThroughCachesTest):
    world_size = 4

    def _mesh(self):
        return init_device_mesh(self.device_type, (2, 2))

    def _placements(self, reduce_op):
        return [Partial(reduce_op), Partial(reduce_op)]


# 3 ranks and 2 x 2 (create_local_tensor_test_class wraps only the methods a class
# defines itself).
PartialFactorThroughCachesThreeRanksTest = type(
    "PartialFactorThroughCachesThreeRanksTest",
    (DTensorContinuousTestBase,),
    {
        **{
            k: v
            for k, v in PartialFactorThroughCachesTest.__dict__.items()
            if not k.startswith("__")
        },
        "world_size": 3,
    },
)
PartialFactorThroughCaches2x2Test = type(
    "PartialFactorThroughCaches2x2Test",
    (DTensorContinuousTestBase,),
    {
        **{
            k: v
            for k, v in PartialFactorThroughCachesTest.__dict__.items()
            if not k.startswith("__")
        },
        **{
            k: v
            for k, v in PartialFactorThroughCaches2x2Test.__dict__.items()
            if not k.startswith("__")
        },
    },
)

PartialFactorThroughCachesTestWithLocalTensor = create_local_tensor_test_class(
    PartialFactorThroughCachesTest, base_class=LocalDTensorContinuousTestBase
)
PartialFactorThroughCachesThreeRanksTestWithLocalTensor = (
    create_local_tensor_test_class(
        PartialFactorThroughCachesThreeRanksTest,
        base_class=LocalDTensorContinuousTestBase,
    )
)
PartialFactorThroughCaches2x2TestWithLocalTensor = create_local_tensor_test_class(
    PartialFactorThroughCaches2x2Test, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
