# Owner(s): ["oncall: distributed"]
"""A compiled DTensor op whose schema holds a symbolic scalar (a SymFloat from
``t.item()`` under capture_scalar_outputs, or a float input Dynamo keeps dynamic) neither
fails nor specializes that scalar during sharding propagation.

Single-dim sharding strategies are cached by their OpSchema, and hashing a SymFloat
guards on its value: an unbacked one raises "Could not guard on data-dependent
expression", a backed one is specialized (one recompile per value). Each test starts from
empty sharding caches, as a process that compiles before running the op in eager does.
The fake process group is enough: both failures are at compile time.
"""

import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


class DTensorCompileSymbolicScalarTest(TestCase):
    def setUp(self):
        super().setUp()
        _clear_sharding_prop_cache()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (4,))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def dtensor(self, placement):
        local = torch.arange(8, dtype=torch.float64).view(2, 4)
        return DTensor.from_local(local, self.mesh, [placement], run_check=False)

    def test_unbacked_scalar_from_item(self):
        def f(x):
            return x * x.sum().item()

        for placement in (Replicate(), Shard(0)):
            with self.subTest(placement=placement):
                _clear_sharding_prop_cache()
                torch._dynamo.reset()
                with torch._dynamo.config.patch(capture_scalar_outputs=True):
                    out = torch.compile(f, backend="aot_eager", fullgraph=True)(
                        self.dtensor(placement)
                    )
                expected = f(self.dtensor(placement))
                self.assertEqual(out.placements, expected.placements)
                self.assertEqual(out.to_local(), expected.to_local())

    def test_dynamic_float_is_not_specialized(self):
        def f(x, s):
            return x * s

        values = (2.0, 3.0, 4.5)
        expected = [f(self.dtensor(Shard(0)), s) for s in values]
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(f, backend=counter, fullgraph=True)
        with torch._dynamo.config.patch(specialize_float=False):
            for s, e in zip(values, expected, strict=True):
                # As each compile in a fresh process would: eager entries in the
                # sharding caches would hide the specialization.
                _clear_sharding_prop_cache()
                out = compiled(self.dtensor(Shard(0)), s)
                self.assertEqual(out.placements, e.placements)
                self.assertEqual(out.to_local(), e.to_local())
        # The first call traces with the float as a constant; the second makes it
        # dynamic; a third value must reuse that graph.
        self.assertEqual(counter.frame_count, 2)

    def test_symbolic_scalar_check_matches_tree_leaves(self):
        # The check runs on every sharding-propagation miss, so it walks the
        # schema's arguments by hand; it must see what tree_leaves sees.
        from torch.distributed.tensor._op_schema import OpStrategy, TupleStrategy
        from torch.distributed.tensor._ops.single_dim_strategy import (
            _holds_symbolic_scalar,
        )
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        from torch.utils._pytree import tree_leaves

        shape_env = ShapeEnv()
        sym_float = shape_env.create_unbacked_symfloat()
        sym_bool = shape_env.create_unbacked_symbool()
        sym_int = shape_env.create_unbacked_symint()
        strategy = OpStrategy([])
        cases = [
            ((strategy, [2, 2], [], [0, 0], False, True, None), {}),
            ((strategy, 2.5, sym_int), {"alpha": 1}),
            ((strategy, sym_float), {}),
            ((strategy, [1.0, sym_float]), {}),
            ((strategy, ([0], (sym_bool,))), {}),
            ((strategy,), {"alpha": sym_float}),
            ((strategy,), {"scale": [1.0, {"x": sym_bool}]}),
            ((TupleStrategy([strategy, strategy]), 0), {}),
        ]
        for args, kwargs in cases:
            with self.subTest(args=args, kwargs=kwargs):
                expected = any(
                    isinstance(leaf, (torch.SymFloat, torch.SymBool))
                    for leaf in tree_leaves((args, kwargs))
                )
                self.assertEqual(
                    _holds_symbolic_scalar(args)
                    or _holds_symbolic_scalar(kwargs.values()),
                    expected,
                )


if __name__ == "__main__":
    run_tests()
