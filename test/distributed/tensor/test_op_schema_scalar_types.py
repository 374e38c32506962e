# Owner(s): ["oncall: distributed"]
"""OpSchemas that differ only in the type of a Python scalar are different schemas.

1 == True == 1.0 (and they hash equal), so OpSchema's comparison key made
`aten.mul.Scalar(p, True)` and `aten.mul.Scalar(p, 1)` one schema, though type promotion
gives them different output dtypes (bool and int64 for a bool p) and different sharding
(an integer product of a bool Partial(sum) DTensor reduces it first, a bool one keeps the
Partial). A sharding cache keyed by OpSchema then hands the second op the first one's
OutputSharding: the Python sharding cache (`propagate_op_sharding`), and the caches that
eager misses and traced ops use with the rest of the series.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, RuntimeSchemaInfo
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten


def rank_values(rank):
    # True on both ranks in the first element: the reduced (bool) value is True there
    return torch.tensor([True, rank == 0, rank == 1, False])


def bool_then_int(p):
    # equal schemas before the fix: the second op got the first's output spec
    b = aten.mul.Scalar(p, True)
    a = aten.mul.Scalar(p, 1)
    return b, a


class OpSchemaScalarTypeTest(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.addCleanup(dist.destroy_process_group)
        self.mesh = init_device_mesh("cpu", (4,))
        _clear_sharding_prop_cache()
        self.addCleanup(_clear_sharding_prop_cache)

    def bool_partial(self):
        local = torch.tensor([True, False, True, True])
        return DTensor.from_local(local, self.mesh, [Partial("sum")], run_check=False)

    def test_scalar_type_is_part_of_the_schema(self):
        spec = self.bool_partial()._spec
        info = RuntimeSchemaInfo(static_argnum=1)
        schemas = [
            OpSchema(aten.mul.Scalar, (spec, value), {}, info)
            for value in (1, True, 1.0)
        ]
        for i, first in enumerate(schemas):
            for j, second in enumerate(schemas):
                self.assertEqual(first == second, i == j)
        # lists of scalars (a foreach op's ScalarList) too
        self.assertNotEqual(
            OpSchema(aten.mul.Scalar, (spec, [1, 2]), {}, info),
            OpSchema(aten.mul.Scalar, (spec, [True, 2]), {}, info),
        )
        self.assertEqual(
            OpSchema(aten.mul.Scalar, (spec, [1, 2]), {}, info),
            OpSchema(aten.mul.Scalar, (spec, [1, 2]), {}, info),
        )

    def test_python_sharding_cache_tells_scalar_types_apart(self):
        propagator = DTensor._op_dispatcher.sharding_propagator
        spec = self.bool_partial()._spec
        info = RuntimeSchemaInfo(static_argnum=1)
        as_bool = propagator.propagate_op_sharding(
            OpSchema(aten.mul.Scalar, (spec, True), {}, info)
        )
        as_int = propagator.propagate_op_sharding(
            OpSchema(aten.mul.Scalar, (spec, 1), {}, info)
        )
        self.assertEqual(as_bool.output_spec.tensor_meta.dtype, torch.bool)
        self.assertEqual(as_int.output_spec.tensor_meta.dtype, torch.int64)

    def test_compiled_integer_product_of_bool_partial_reduces_it(self):
        from torch._dynamo.backends.common import aot_autograd

        graphs = []

        def forward_compiler(gm, example_inputs):
            graphs.append(gm)
            return gm

        p = self.bool_partial()
        compiled = torch.compile(
            bool_then_int, backend=aot_autograd(fw_compiler=forward_compiler)
        )
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        b, a = compiled(p)
        self.assertEqual(len(graphs), 1)
        self.assertEqual(b.placements, (Partial("sum"),))
        self.assertEqual(b._spec.tensor_meta.dtype, torch.bool)
        # the integer product reduces p first, as eager does
        self.assertEqual(a.placements, (Replicate(),))
        self.assertEqual(a._spec.tensor_meta.dtype, torch.int64)
        self.assertEqual(a.dtype, torch.int64)
        self.assertIn("all_reduce", graphs[0].code)

    def test_compiled_int_and_float_scalar_give_their_dtypes(self):
        def f(x):
            return aten.mul.Scalar(x, 2), aten.mul.Scalar(x, 2.0)

        local = torch.arange(4)
        x = DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False)
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        as_int, as_float = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        self.assertEqual(as_int._spec.tensor_meta.dtype, torch.int64)
        self.assertEqual(as_float._spec.tensor_meta.dtype, torch.float32)
        self.assertEqual(as_float.to_local(), local * 2.0)

    def test_scalar_outside_the_key_keeps_its_type(self):
        # floor_divide has no rule of its own: its decomposition's schema info puts
        # the scalar (in a Tensor slot) outside the comparison key, but its type
        # still decides the output dtype.
        local = torch.arange(1, 5)
        x = DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False)
        as_int, as_float = x // 2, x // 2.0
        self.assertEqual(as_int._spec.tensor_meta.dtype, torch.int64)
        self.assertEqual(as_float._spec.tensor_meta.dtype, torch.float32)
        self.assertEqual(as_float.to_local(), local // 2.0)
        self.assertEqual(
            as_float.view(torch.int32).to_local(), (local // 2.0).view(torch.int32)
        )


class DistOpSchemaScalarTypeTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_eager_integer_product_of_bool_partial_reduces_it(self):
        mesh = self.build_device_mesh()
        _clear_sharding_prop_cache()
        local = map_local_for_rank(self.rank, rank_values)
        p = DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)
        full = p.full_tensor()
        comm_mode = CommDebugMode()
        with comm_mode:
            b, a = bool_then_int(p)
        self.assertEqual(b.placements, (Partial("sum"),))
        self.assertEqual(b.full_tensor(), full)
        self.assertEqual(a.placements, (Replicate(),))
        self.assertEqual(a._spec.tensor_meta.dtype, torch.int64)
        self.assertEqual(a.full_tensor(), full * 1)
        self.assertEqual(comm_mode.get_total_counts(), 1)


DistOpSchemaScalarTypeTestWithLocalTensor = create_local_tensor_test_class(
    DistOpSchemaScalarTypeTest
)


if __name__ == "__main__":
    run_tests()
