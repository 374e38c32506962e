# Owner(s): ["oncall: distributed"]
"""A Python scalar and a 0-d tensor do not share a native sharding-cache entry.

`x + 3` passes 3 to add.Tensor's Tensor argument as a wrapped number, a 0-d tensor that
DTensor's Python side receives back as the Python scalar 3 and plans for as a scalar (on a
Partial(sum) `x`: reduce `x`). `x + torch.tensor(3)` is planned for a Replicate 0-d tensor
(split it into a Partial(sum), no collective). The native (C++) sharding cache keyed the
wrapped number like that 0-d tensor, so whichever call came first decided the plan of the
other: `x + torch.tensor(3)` then `x + 3` read x + 6 on 2 ranks; the other order raised
AttributeError. A float scalar shares its key with a float64 0-d tensor the same way.

Each case clears the caches, runs the tensor call and the scalar call in one order, and
compares each outcome with the same call on empty caches, and each value with the op on
the reduced plain tensors.
"""

import itertools
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.debug import (
    _clear_sharding_prop_cache,
    _get_python_sharding_prop_cache_info,
)
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


WORLD_SIZE = 2

OPS = {
    "add": lambda x, s, out: x + s,
    "sub": lambda x, s, out: x - s,
    "add_": lambda x, s, out: x.add_(s),
    "mul_out": lambda x, s, out: torch.mul(x, s, out=out),
}

# Each Python scalar and the 0-d tensor whose native key it shared: a wrapped
# number is int64 for an int and float64 for a float.
SCALARS = {
    "int": (3, lambda: torch.tensor(3)),
    "float": (2.5, lambda: torch.tensor(2.5, dtype=torch.float64)),
}


class NativeShardingCacheScalarKeyTest(TestCase):
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

    def dtensor(self, placement, values):
        with self.mode:
            return DTensor.from_local(
                LocalTensor({r: values(r) for r in range(WORLD_SIZE)}),
                self.mesh,
                [placement],
                run_check=False,
            )

    def full(self, d):
        with self.mode:
            f = d.full_tensor()
        return f._local_tensors[0] if isinstance(f, LocalTensor) else f

    def outcome(self, op, placement, s):
        """The call's value (reduced) and its plain-tensor value, or its error type."""
        x = self.dtensor(
            placement, lambda r: torch.tensor([1.5 * (r + 1), -2.0 * (r + 1)])
        )
        out = self.dtensor(Partial("sum"), lambda r: torch.zeros(2))
        plain = OPS[op](self.full(x), s, torch.zeros(2))
        try:
            with self.mode:
                result = OPS[op](x, s, out)
        except Exception as e:
            return type(e), None
        return self.full(result), plain

    def test_scalar_and_zero_dim_tensor_keep_their_own_plans(self):
        for op in OPS:
            for placement in (Partial("sum"), Partial("avg"), Partial("max")):
                for kind, (scalar, tensor) in SCALARS.items():
                    calls = {"tensor": tensor, "scalar": lambda scalar=scalar: scalar}
                    alone = {}
                    for name, make in calls.items():
                        _clear_sharding_prop_cache()
                        alone[name] = self.outcome(op, placement, make())
                    for order in (("tensor", "scalar"), ("scalar", "tensor")):
                        with self.subTest(
                            op=op, placement=placement, scalar=kind, order=order
                        ):
                            _clear_sharding_prop_cache()
                            for name in order:
                                got, plain = self.outcome(op, placement, calls[name]())
                                expected, _ = alone[name]
                                if isinstance(expected, type):
                                    # Raises on empty caches too: add_ of a scalar
                                    # to a Partial(sum) or Partial(max) needs a
                                    # placement change, and out= a P(avg) -> P(sum)
                                    # redistribution, which is not supported.
                                    self.assertIs(got, expected, name)
                                    continue
                                self.assertNotIsInstance(got, type, name)
                                self.assertEqual(got, plain, msg=name)
                                self.assertEqual(got, expected, msg=name)

    def test_output_dtype_follows_scalar_or_tensor(self):
        # int64 x * 2.5 computes in float32 (a Python float takes the default
        # dtype), x * float64 0-d tensor in float64: no redistribution either
        # way, but the output specs differ.
        for order in (("tensor", "scalar"), ("scalar", "tensor")):
            with self.subTest(order=order):
                _clear_sharding_prop_cache()
                for name in order:
                    x = self.dtensor(Shard(0), lambda r: torch.arange(2) + 2 * r)
                    s = (
                        2.5
                        if name == "scalar"
                        else torch.tensor(2.5, dtype=torch.float64)
                    )
                    plain = self.full(x) * s
                    with self.mode:
                        result = x * s
                    self.assertEqual(result.dtype, plain.dtype, msg=name)
                    self.assertEqual(result._spec.tensor_meta.dtype, plain.dtype)
                    self.assertEqual(self.full(result), plain, msg=name)

    def test_replicate_zero_dim_dtensor_and_scalar_keep_their_own_plans(self):
        # A Replicate 0-d DTensor of a wrapped number's dtype has the native key
        # of the Python scalar too: on a Partial(sum) x, x + d (split d) then
        # x + 3 read x + 6 on 2 ranks; the float64 form handed its dtype on.
        cases = [
            ("add", Partial("sum"), torch.float32, 3, torch.int64),
            ("sub", Partial("sum"), torch.float32, 3, torch.int64),
            ("add", Partial("avg"), torch.float32, 2.5, torch.float64),
            ("mul", Shard(0), torch.int64, 2.5, torch.float64),
            ("add", Partial("sum"), torch.bool, True, torch.bool),
        ]
        fns = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}
        for op, placement, dtype, scalar, scalar_dtype in cases:
            for order in (("dtensor", "scalar"), ("scalar", "dtensor")):
                with self.subTest(op=op, placement=placement, dtype=dtype, order=order):
                    _clear_sharding_prop_cache()
                    for name in order:
                        x = self.dtensor(
                            placement,
                            lambda r: (torch.tensor([1.0, 2.0]) * (r + 1)).to(dtype),
                        )
                        d = self.dtensor(
                            Replicate(),
                            lambda r: torch.tensor(scalar, dtype=scalar_dtype),
                        )
                        s = scalar if name == "scalar" else d
                        plain = fns[op](
                            self.full(x),
                            scalar if name == "scalar" else self.full(d),
                        )
                        with self.mode:
                            result = fns[op](x, s)
                        self.assertEqual(result.dtype, plain.dtype, msg=name)
                        self.assertEqual(self.full(result), plain, msg=name)
                        if name == "scalar" and placement == Partial("sum"):
                            # A Python scalar reduces x first: x + 3 is not split.
                            self.assertEqual(result.placements, (Replicate(),))

    def test_new_scalar_values_add_no_sharding_cache_entries(self):
        # x + s on a Partial(sum) x plans for a scalar (reduce x first), which
        # a 0-d tensor's key entry must not take: each call is finished
        # outside the native cache, and the sharding caches must not keep an
        # entry per value of s.
        x = self.dtensor(Partial("sum"), lambda r: torch.tensor([1.0, 2.0]) * (r + 1))
        with self.mode:
            x + 0.5
        size = _get_python_sharding_prop_cache_info().currsize
        for i in range(20):
            s = 0.25 * i + 1.0
            with self.mode:
                result = x + s
            self.assertEqual(self.full(result), self.full(x) + s)
            self.assertEqual(result.placements, (Replicate(),))
        self.assertEqual(_get_python_sharding_prop_cache_info().currsize, size)

    def test_repeated_scalar_op_hits_the_native_cache(self):
        # A scalar whose plan a 0-d tensor shares keeps its native entry.
        x = self.dtensor(Shard(0), lambda r: torch.tensor([1.0, 2.0]) + r)
        with self.mode:
            x * 0.5
            hits, _ = torch._C._get_DTensor_sharding_propagator_cache_stats()
            result = x * 0.5
            hits_after, _ = torch._C._get_DTensor_sharding_propagator_cache_stats()
        self.assertEqual(hits_after, hits + 1)
        self.assertEqual(self.full(result), self.full(x) * 0.5)

    def test_twin_plan_reuses_the_call_tensor_meta(self):
        # Deciding whether a scalar and its 0-d tensor twin share the native
        # entry plans the twin too, on a sharding cache miss. In add, sub, mul,
        # div and floor_divide the twin's output has the call's shape and
        # strides and a dtype type promotion gives: one fake tensor
        # propagation per miss, not two (the first eager call of each schema
        # paid twice the propagation for it). Values and placements as on
        # empty caches in either order are test_*_keep_their_own_plans'.
        cases = {
            "x * 0.5": (Partial("sum"), torch.float32, lambda x: x * 0.5),
            "x / 2": (Partial("sum"), torch.float32, lambda x: x / 2),
            "int64 x * 2": (Partial("sum"), torch.int64, lambda x: x * 2),
            "x.mul_(0.5)": (Partial("sum"), torch.float32, lambda x: x.mul_(0.5)),
            "x * f64 0-d": (
                Partial("sum"),
                torch.float32,
                lambda x: x * torch.tensor(0.5, dtype=torch.float64),
            ),
            # the twin's dtype differs (float64): not shared, no twin plan
            "int64 x * 2.5": (Shard(0), torch.int64, lambda x: x * 2.5),
        }
        propagate = ShardingPropagator._propagate_tensor_meta_non_cached
        for name, (placement, dtype, fn) in cases.items():
            with self.subTest(op=name):
                x = self.dtensor(
                    placement, lambda r: (torch.tensor([2.0, -4.0]) * (r + 1)).to(dtype)
                )
                plain = fn(self.full(x).clone())
                _clear_sharding_prop_cache()
                with mock.patch.object(
                    ShardingPropagator,
                    "_propagate_tensor_meta_non_cached",
                    autospec=True,
                    side_effect=propagate,
                ) as counted:
                    with self.mode:
                        result = fn(x)
                self.assertEqual(counted.call_count, 1)
                self.assertEqual(result.dtype, plain.dtype)
                self.assertEqual(self.full(result), plain)

    def test_scalar_factor_twin_is_not_planned_again(self):
        # x * s, x / s, x.mul_(s) and x.div_(s) with a Python scalar s keep the
        # placements of x (Shard, Replicate, Partial sum or avg): the 0-d tensor
        # twin's plan is the same, so a sharding propagation miss runs one
        # strategy, not two, and the result still goes to the native cache.
        import torch.distributed.tensor._sharding_prop as sharding_prop

        cases = {
            "x * 0.5": (torch.float32, lambda x: x * 0.5),
            "x / 2": (torch.float32, lambda x: x / 2),
            "int64 x * 2": (torch.int64, lambda x: x * 2),
            "x.mul_(0.5)": (torch.float32, lambda x: x.mul_(0.5)),
            "x.div_(4)": (torch.float32, lambda x: x.div_(4)),
        }
        placements = [Partial("sum"), Partial("avg"), Shard(0), Replicate()]
        expand = sharding_prop._expand_single_dim_strategy_to_mesh
        for (name, (dtype, fn)), placement in itertools.product(
            cases.items(), placements
        ):
            if placement == Partial("avg") and not dtype.is_floating_point:
                continue  # an integer Partial(avg) is reduced first
            with self.subTest(op=name, placement=placement):

                def values(r, dtype=dtype):
                    return (torch.tensor([2.0, -4.0]) * (r + 1)).to(dtype)

                x = self.dtensor(placement, values)
                plain = fn(self.full(x).clone())
                _clear_sharding_prop_cache()
                with mock.patch.object(
                    sharding_prop,
                    "_expand_single_dim_strategy_to_mesh",
                    side_effect=expand,
                ) as counted:
                    with self.mode:
                        result = fn(x)
                self.assertEqual(counted.call_count, 1)
                self.assertEqual(result.placements, (placement,))
                self.assertEqual(self.full(result), plain)
                x = self.dtensor(placement, values)
                with self.mode:
                    hits, _ = torch._C._get_DTensor_sharding_propagator_cache_stats()
                    result = fn(x)
                    hits_after, _ = (
                        torch._C._get_DTensor_sharding_propagator_cache_stats()
                    )
                self.assertEqual(hits_after, hits + 1)
                self.assertEqual(self.full(result), plain)

    def test_scalar_factor_twin_plan_agrees_with_the_twin_strategy(self):
        # Where the twin's plan is taken to be the call's without planning it,
        # planning the twin (its strategy, with the call's output tensor meta)
        # gives no redistribution and the same output spec.
        from torch.distributed.tensor._dispatch import OpDispatcher

        keeps = OpDispatcher._twin_keeps_scalar_plan
        propagator = DTensor._op_dispatcher.sharding_propagator
        answers = []

        def checked(schema, twin_schema, output_sharding):
            answer = keeps(schema, twin_schema, output_sharding)
            if answer:
                twin = propagator.propagate_op_sharding_non_cached(
                    twin_schema, output_sharding.output_spec.tensor_meta
                )
                answers.append(
                    (
                        twin.needs_redistribute,
                        twin.output_spec == output_sharding.output_spec,
                    )
                )
            return answer

        ops = {
            "mul": lambda x, s: x * s,
            "div": lambda x, s: x / s,
            "mul_": lambda x, s: x.mul_(s),
            "div_": lambda x, s: x.div_(s),
        }
        dtypes = [
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.complex64,
            torch.int64,
            torch.uint8,
            torch.bool,
        ]
        placements = [Partial("sum"), Partial("avg"), Shard(0), Replicate()]
        with mock.patch.object(
            OpDispatcher, "_twin_keeps_scalar_plan", staticmethod(checked)
        ):
            for fn, dtype, placement, s in itertools.product(
                ops.values(), dtypes, placements, [True, 3, 2.5, 1j]
            ):
                x = self.dtensor(
                    placement, lambda r: (torch.tensor([2, 4]) * (r + 1)).to(dtype)
                )
                _clear_sharding_prop_cache()
                try:
                    with self.mode:
                        fn(x, s)
                except RuntimeError:
                    pass  # e.g. an integer x.div_(s): the kernel refuses it
        self.assertGreater(len(answers), 100)
        self.assertEqual(set(answers), {(False, True)})

    def test_zero_dim_tensor_without_scalar_form_hits_the_native_cache(self):
        # In these ops a Python scalar goes to a Scalar overload (_foreach_mul.Scalar,
        # masked_fill.Scalar, clamp, where via scalar_tensor, pow.Tensor_Scalar),
        # never as a wrapped number to the Tensor argument that holds the float64 or
        # int64 0-d tensor, so no scalar shares its native entry: a repeated call is
        # a native cache hit, as on a Python scalar-free op.
        x = self.dtensor(Replicate(), lambda r: torch.tensor([1.5, -2.0, 0.5, 4.0]))
        s = self.dtensor(Shard(0), lambda r: torch.tensor([1.5, -2.0]) + r)
        m = self.dtensor(
            Replicate(), lambda r: torch.tensor([True, False, True, False])
        )
        f64 = torch.tensor(0.75, dtype=torch.float64)
        i64 = torch.tensor(2)
        cases = {
            "_foreach_mul": (lambda a, m: torch._foreach_mul([a, a], f64)[1], s),
            "masked_fill": (lambda a, m: a.masked_fill(m, f64), x),
            "clamp": (lambda a, m: torch.clamp(a, min=f64), x),
            "where": (lambda a, m: torch.where(m, a, f64), x),
            "pow": (lambda a, m: a**i64, s),
        }
        for name, (fn, a) in cases.items():
            with self.subTest(op=name):
                _clear_sharding_prop_cache()
                with self.mode:
                    fn(a, m)
                    hits, _ = torch._C._get_DTensor_sharding_propagator_cache_stats()
                    result = fn(a, m)
                    hits_after, _ = (
                        torch._C._get_DTensor_sharding_propagator_cache_stats()
                    )
                self.assertEqual(hits_after, hits + 1)
                self.assertEqual(self.full(result), fn(self.full(a), self.full(m)))


if __name__ == "__main__":
    run_tests()
