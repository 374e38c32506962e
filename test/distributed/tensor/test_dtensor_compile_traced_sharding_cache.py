# Owner(s): ["oncall: distributed"]
"""Sharding propagation while tracing is reused for repeated ops of a compile.

Traced ops skip the value-keyed sharding caches (an OutputSharding holds the mesh objects
of the call that computed it), so every traced op used to propagate from scratch: one
propagation per op in a trace, per layer of a model. Results are now reused for an equal
schema within one compile (the entries belong to the ShapeEnv that Dynamo's trace and
AOTAutograd's traces share, or to the FakeTensorMode when it has none), on the mesh objects
of the call that reuses them. Each test starts from empty sharding caches; the fake process
group is enough (propagation runs at compile time).
"""

import gc
import queue
import threading
from collections import deque, namedtuple, OrderedDict
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor.experimental._context_parallel._sharding_rules import (
    _single_dim_strategy_context,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.immutable_collections import immutable_list
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._pytree import tree_leaves


class DTensorCompileTracedShardingCacheTest(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.addCleanup(dist.destroy_process_group)
        self.mesh = init_device_mesh("cpu", (2, 2))
        torch._dynamo.reset()
        _clear_sharding_prop_cache()
        self.assertEqual(len(self.traced_cache()), 0)

    def traced_cache(self):
        return DTensor._op_dispatcher.sharding_propagator._traced_cache

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def dtensor(self):
        local = torch.arange(8, dtype=torch.float64).view(2, 4)
        return DTensor.from_local(
            local, self.mesh, [Shard(0), Replicate()], run_check=False
        )

    def count_mul_propagations(self, fn, *args):
        real = ShardingPropagator.propagate_op_sharding_non_cached
        calls = []

        def counting(propagator, op_schema):
            if op_schema.op is torch.ops.aten.mul.Tensor:
                calls.append(op_schema)
            return real(propagator, op_schema)

        with mock.patch.object(
            ShardingPropagator, "propagate_op_sharding_non_cached", counting
        ):
            out = fn(*args)
        return out, len(calls)

    def test_repeated_op_propagates_once_per_trace(self):
        def f(x, y):
            for _ in range(8):
                x = x * y
            return x

        x, y = self.dtensor(), self.dtensor()
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        out, calls = self.count_mul_propagations(compiled, x, y)
        expected = f(x, y)
        self.assertEqual(out.placements, expected.placements)
        self.assertEqual(out.to_local(), expected.to_local())
        # 8 equal mul schemas per trace; each trace (Dynamo's, AOTAutograd's
        # analysis and its graph capture) propagates them at most once, and
        # traces that share mesh objects share results. Measured: 2 calls;
        # without reuse, 32 (8 per trace, 4 traces).
        self.assertLessEqual(calls, 4)
        self.assertGreater(calls, 0)

    def test_reuse_keeps_the_trace_meshes(self):
        # An eager call first: its result must not leak the eager mesh object into
        # the trace (or the trace's into eager).
        def f(x, y):
            return (x * y) * y

        x, y = self.dtensor(), self.dtensor()
        f(x, y)
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x, y)
        self.assertIs(out.device_mesh, self.mesh)
        self.assertIs(f(x, y).device_mesh, self.mesh)
        self.assertEqual(out.to_local(), f(x, y).to_local())

    def test_clear_sharding_prop_cache_clears_traced_results(self):
        x, y = self.dtensor(), self.dtensor()
        torch.compile(lambda a, b: a * b, backend="aot_eager", fullgraph=True)(x, y)
        # the entries of a trace whose FakeTensorMode is still alive
        self.assertGreater(len(self.traced_cache()), 0)
        _clear_sharding_prop_cache()
        self.assertEqual(len(self.traced_cache()), 0)

    def test_later_compile_sees_restored_strategy(self):
        # A strategy swapped in for a while (as context parallel does), the caches
        # cleared on the way out: a later compile must propagate with the restored
        # strategy, as eager does, not reuse what the earlier compile computed.
        def f(x):
            return torch.nn.functional.relu(x) + 1

        def replicate_only(op, args_schema, kwargs_schema):
            return []

        x = self.dtensor()
        with _single_dim_strategy_context(torch.ops.aten.relu.default, replicate_only):
            inside = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
            self.assertEqual(inside.placements, (Replicate(), Replicate()))
        _clear_sharding_prop_cache()
        torch._dynamo.reset()
        expected = f(x)
        self.assertEqual(expected.placements, (Shard(0), Replicate()))
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(out.placements, expected.placements)
        self.assertEqual(out.to_local(), expected.to_local())

    def test_mode_kept_across_traces_sees_restored_strategy(self):
        # One FakeTensorMode held across traces (make_fx on fake inputs, as memory
        # estimation and auto-parallel tools run it), a strategy swapped in and
        # restored without clearing the caches (as context parallel's
        # unregister_cp_sharding_rules() does by default): each trace propagates
        # with the strategy registered at that time.
        def f(x):
            return torch.relu(x) + 1

        def replicate_only(op, args_schema, kwargs_schema):
            return []

        def placements(x):
            seen = []

            def g(x):
                y = f(x)
                seen.append(y.placements)
                return y

            make_fx(g)(x)
            return seen[0]

        with FakeTensorMode():
            x = DTensor.from_local(
                torch.empty(2, 4), self.mesh, [Shard(0), Replicate()], run_check=False
            )
            self.assertEqual(placements(x), (Shard(0), Replicate()))
            with _single_dim_strategy_context(
                torch.ops.aten.relu.default, replicate_only
            ):
                self.assertEqual(placements(x), (Replicate(), Replicate()))
            self.assertEqual(placements(x), (Shard(0), Replicate()))

    def test_mode_kept_across_traces_sees_restored_sub_op_strategy(self):
        # An op without a strategy of its own, propagated by decomposing it
        # (DecompShardingStrategy), depends on its sub-ops' strategies: swapping
        # and restoring one of those must reach it as well.
        def replicate_only(op, args_schema, kwargs_schema):
            return []

        aten = torch.ops.aten
        for op, sub_op in [
            (aten.hardswish.default, aten.clamp.default),
            (aten.glu.default, aten.mul.Tensor),
        ]:
            with self.subTest(op=str(op), sub_op=str(sub_op)):
                _clear_sharding_prop_cache()

                def placements(x, op=op):
                    seen = []

                    def g(x):
                        y = op(x)
                        seen.append(y.placements)
                        return y

                    make_fx(g)(x)
                    return seen[0]

                with FakeTensorMode():
                    x = DTensor.from_local(
                        torch.empty(2, 8),
                        self.mesh,
                        [Shard(0), Replicate()],
                        run_check=False,
                    )
                    self.assertEqual(placements(x), (Shard(0), Replicate()))
                    with _single_dim_strategy_context(sub_op, replicate_only):
                        self.assertEqual(placements(x), (Replicate(), Replicate()))
                    self.assertEqual(placements(x), (Shard(0), Replicate()))

    def test_clear_reaches_a_trace_on_another_thread(self):
        # _clear_sharding_prop_cache() on one thread empties the traced results
        # of a FakeTensorMode that another thread holds across traces.
        requests, replies = queue.Queue(), queue.Queue()

        def worker():
            with FakeTensorMode():
                x = DTensor.from_local(
                    torch.empty(2, 4),
                    self.mesh,
                    [Shard(0), Replicate()],
                    run_check=False,
                )
                while requests.get():
                    calls = []
                    real = ShardingPropagator.propagate_op_sharding_non_cached

                    def counting(propagator, op_schema):
                        if op_schema.op is torch.ops.aten.relu.default:
                            calls.append(op_schema)
                        return real(propagator, op_schema)

                    with mock.patch.object(
                        ShardingPropagator, "propagate_op_sharding_non_cached", counting
                    ):
                        make_fx(torch.relu)(x)
                    replies.put(len(calls))

        thread = threading.Thread(target=worker)
        thread.start()
        try:
            requests.put(True)
            self.assertEqual(replies.get(timeout=120), 1)
            requests.put(True)  # same mode, nothing cleared: reused
            self.assertEqual(replies.get(timeout=120), 0)
            _clear_sharding_prop_cache()
            requests.put(True)
            self.assertEqual(replies.get(timeout=120), 1)
        finally:
            requests.put(False)
            thread.join()

    def test_entries_do_not_outlive_their_trace(self):
        # Recompiling the same function after a reset keeps one trace's entries,
        # not one set per compile.
        def f(x, y):
            return (x * y).relu() + y

        x, y = self.dtensor(), self.dtensor()
        sizes = []
        for _ in range(3):
            torch._dynamo.reset()
            torch.compile(f, backend="aot_eager", fullgraph=True)(x, y)
            torch._dynamo.reset()
            gc.collect()
            sizes.append(len(self.traced_cache()))
        self.assertGreater(sizes[0], 0)
        self.assertEqual(sizes, [sizes[0]] * 3)

    def test_traces_of_a_compile_share_results_on_their_own_meshes(self):
        # Dynamo's trace, AOTAutograd's analysis and its graph capture each slice
        # the tp submesh into a mesh object of their own; an equal schema is
        # propagated once per compile and reused by the other traces on their own
        # mesh objects, as propagating it there again would give.
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

        def f(w, x):
            tp = w.device_mesh["tp"]
            a = DTensor.from_local(w.to_local(), tp, [Shard(0)], run_check=False)
            b = DTensor.from_local(x.to_local(), tp, [Shard(1)], run_check=False)
            for _ in range(3):
                a = a * b  # S(0) * S(1): b is redistributed
            return a

        def inputs():
            # both 8 x 4 on tp: w's local 4 x 4 is a Shard(0), x's 8 x 2 a Shard(1)
            torch.manual_seed(0)
            return tuple(
                DTensor.from_local(
                    torch.randn(*shape, dtype=torch.float64),
                    mesh,
                    [Replicate(), Replicate()],
                    run_check=False,
                ).requires_grad_()
                for shape in [(4, 4), (8, 2)]
            )

        traced = ShardingPropagator.propagate_op_sharding_traced
        propagate = ShardingPropagator.propagate_op_sharding_non_cached
        results, propagated = [], []

        def recording(propagator, op_schema):
            result = traced(propagator, op_schema)
            results.append((op_schema, result))
            return result

        def counting(propagator, op_schema):
            propagated.append(op_schema)
            return propagate(propagator, op_schema)

        eager_args, compiled_args = inputs(), inputs()
        eager = f(*eager_args)
        eager.to_local().sum().backward()
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        with (
            mock.patch.object(
                ShardingPropagator, "propagate_op_sharding_traced", recording
            ),
            mock.patch.object(
                ShardingPropagator, "propagate_op_sharding_non_cached", counting
            ),
        ):
            out = compiled(*compiled_args)
            out.to_local().sum().backward()
        self.assertEqual(out.placements, eager.placements)
        self.assertEqual(out.device_mesh, eager.device_mesh)
        self.assertEqual(out.to_local(), eager.to_local(), atol=0, rtol=0)
        for ours, ref in zip(compiled_args, eager_args, strict=True):
            self.assertEqual(ours.grad.placements, ref.grad.placements)
            self.assertEqual(ours.grad.to_local(), ref.grad.to_local(), atol=0, rtol=0)

        def forward_mul(op_schema):
            if op_schema.op is not torch.ops.aten.mul.Tensor:
                return False
            a, b = op_schema.args_spec
            return (a.placements, b.placements) == ((Shard(0),), (Shard(1),)) and (
                a.mesh is b.mesh
            )

        # The forward's mul: 12 traced calls on 4 mesh objects (Dynamo's
        # FakeScriptObject, AOTAutograd's submeshes), propagated once for the
        # compile; once per mesh object (4) without sharing across traces.
        forward = [s for s, _ in results if forward_mul(s)]
        self.assertEqual(len({id(s.args_spec[0].mesh) for s in forward}), 4)
        self.assertEqual(len([s for s in propagated if forward_mul(s)]), 1)
        # every traced result holds only mesh objects of its own call's arguments
        for op_schema, result in results:
            own = {id(spec.mesh) for spec in op_schema.args_spec}
            held = [s for s in tree_leaves(result.output_spec) if s is not None]
            if result.redistribute_schema is not None:
                held += list(result.redistribute_schema.args_spec)
            for spec in held:
                self.assertIn(id(spec.mesh), own, str(op_schema))

    def test_results_are_not_moved_to_meshes_they_do_not_follow(self):
        # A result is rebound to another call's meshes only where each of its
        # meshes is one of its arguments' and it holds nothing else of the trace
        # that computed it; otherwise the other call propagates afresh.
        from torch.distributed.tensor._op_schema import OpSchema, OutputSharding
        from torch.distributed.tensor._sharding_prop import _rebind_meshes

        mesh, other = init_device_mesh("cpu", (2, 2)), init_device_mesh("cpu", (2, 2))
        x = self.dtensor()._spec
        spec = DTensorSpec(mesh, x.placements, x.tensor_meta)
        moved = DTensorSpec(other, x.placements, x.tensor_meta)
        op = torch.ops.aten.mul.Tensor
        result = OutputSharding(
            spec, OpSchema(op, (spec, spec), {}), needs_redistribute=True
        )
        rebound = _rebind_meshes(result, (mesh, mesh), (other, other))
        self.assertIs(rebound.output_spec.mesh, other)
        self.assertEqual(rebound.output_spec, moved)
        self.assertTrue(rebound.needs_redistribute)
        self.assertEqual(
            [s.mesh for s in rebound.redistribute_schema.args_spec], [other, other]
        )
        self.assertTrue(
            all(s.mesh is other for s in rebound.redistribute_schema.args_spec)
        )
        self.assertIs(result.output_spec.mesh, mesh)  # the cached one unchanged
        third = init_device_mesh("cpu", (2, 2))
        shape_env = ShapeEnv()
        symbolic = DTensorSpec(
            mesh,
            x.placements,
            x.tensor_meta._replace(shape=(shape_env.create_unbacked_symint(), 4)),
        )
        refused = {
            "mesh of no argument": (
                OutputSharding(DTensorSpec(third, x.placements, x.tensor_meta)),
                (mesh,),
                (other,),
            ),
            "one mesh becomes two": (result, (mesh, mesh), (other, third)),
            "symbolic size": (OutputSharding(symbolic), (mesh,), (other,)),
            "tensor of the trace": (
                OutputSharding(spec, OpSchema(op, (spec, torch.ones(())), {})),
                (mesh,),
                (other,),
            ),
        }
        for name, (res, old, new) in refused.items():
            with self.subTest(name):
                self.assertIsNone(_rebind_meshes(res, old, new))

    def test_key_meshes_follow_the_pytree_leaves(self):
        # A traced lookup keys on the mesh of each DTensorSpec among the pytree
        # leaves of the schema's arguments, in tree_leaves order, and propagates
        # uncached when a leaf is a SymFloat or SymBool; the walk that collects
        # them gives what tree_leaves gives, for every container pytree knows.
        a = self.dtensor()._spec
        other_mesh = init_device_mesh("cpu", (4,))
        b = DTensor.from_local(
            torch.ones(2), other_mesh, [Replicate()], run_check=False
        )._spec
        # imported here: the helper is new, and the other tests of this file
        # should fail one by one without this PR
        from torch.distributed.tensor._sharding_prop import _collect_spec_meshes

        Pair = namedtuple("Pair", "x y")
        shape_env = ShapeEnv()
        cases = [
            (a, 2, [b, a], (1.5, [b, (a,)]), torch.float32, None, "mean"),
            (torch.ones(()), [a, torch.ones(2)], b),
            ([a, b], torch.Size([2, 4]), {"k": b, "j": [a]}, Pair(b, a)),
            (immutable_list([b, a]), OrderedDict(x=b), deque([a, b])),
            (a, shape_env.create_unbacked_symint(), torch.device("cpu")),
            (a, [b, shape_env.create_unbacked_symfloat()]),
            (b, {"k": (shape_env.create_unbacked_symbool(),)}, a),
            ((), [], {}),
        ]
        for args in cases:
            leaves = tree_leaves(args)
            symbolic = any(
                isinstance(leaf, (torch.SymFloat, torch.SymBool)) for leaf in leaves
            )
            meshes = []
            self.assertEqual(_collect_spec_meshes(args, meshes), not symbolic)
            if not symbolic:
                expected = [
                    leaf.mesh for leaf in leaves if isinstance(leaf, DTensorSpec)
                ]
                self.assertEqual(list(map(id, meshes)), list(map(id, expected)))


if __name__ == "__main__":
    run_tests()
