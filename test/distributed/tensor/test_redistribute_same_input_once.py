# Owner(s): ["oncall: distributed"]
"""An op that receives the same DTensor more than once redistributes it once."""

import torch
import torch.distributed as dist
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Partial,
    Replicate,
    Shard,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


def rank_values(rank):
    return torch.tensor([1.0 + rank, -2.0, 0.5 * rank])


class DistRedistributeSameInputOnceTest(DTensorContinuousTestBase):
    world_size = 2

    def _partial(self, mesh):
        local = map_local_for_rank(self.rank, rank_values)
        return DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)

    def _truth(self):
        return sum(rank_values(r) for r in range(self.world_size))

    def test_addcmul_with_one_partial_twice_reduces_once(self):
        mesh = self.build_device_mesh()
        zeros = map_local_for_rank(self.rank, lambda r: torch.zeros(3))
        out = DTensor.from_local(zeros, mesh, [Replicate()], run_check=False)
        partial = self._partial(mesh)
        comm_mode = CommDebugMode()
        with comm_mode:
            out.addcmul_(partial, partial, value=0.5)
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(out.full_tensor(), 0.5 * self._truth() * self._truth())

    def test_distinct_inputs_are_still_each_redistributed(self):
        mesh = self.build_device_mesh()
        zeros = map_local_for_rank(self.rank, lambda r: torch.zeros(3))
        out = DTensor.from_local(zeros, mesh, [Replicate()], run_check=False)
        a, b = self._partial(mesh), self._partial(mesh)
        comm_mode = CommDebugMode()
        with comm_mode:
            out.addcmul_(a, b, value=0.5)
        self.assertEqual(comm_mode.get_total_counts(), 2)
        self.assertEqual(out.full_tensor(), 0.5 * self._truth() * self._truth())

    def test_masked_partial_read_twice(self):
        # A row-wise sharded embedding gives a _MaskPartial output, whose mask is
        # released by its first reduction: reading it twice used to assert.
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        weight = torch.randn(8, 4)
        ids = torch.tensor([[0, 5, 7, 2]])
        emb = distribute_tensor(weight, mesh, [Shard(0)])
        idx = distribute_tensor(ids, mesh, [Replicate()])
        y = torch.nn.functional.embedding(idx, emb)
        comm_mode = CommDebugMode()
        with comm_mode:
            out = y * y
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(
            out.full_tensor(), torch.nn.functional.embedding(ids, weight) ** 2
        )


DistRedistributeSameInputOnceTestWithLocalTensor = create_local_tensor_test_class(
    DistRedistributeSameInputOnceTest, base_class=LocalDTensorContinuousTestBase
)


class CompiledRedistributeDynamicShapesTest(TestCase):
    """Specs of a dynamic-shape trace hold SymInts and cannot be hashed: the compiled
    graph must still redistribute a twice-read input once, as eager does."""

    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (4,))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def _check(self, dynamic):
        def f(x, out):
            return x + 1, out.addcmul(x, x, value=0.5)

        def inputs():
            x = DTensor.from_local(
                torch.ones(3, 4), self.mesh, [Partial()], run_check=False
            )
            out = DTensor.from_local(
                torch.zeros(3, 4), self.mesh, [Replicate()], run_check=False
            )
            if dynamic:
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(out, 0)
            return x, out

        expected = f(*inputs())
        backend = AotEagerAndRecordGraphs()
        actual = torch.compile(f, backend=backend, fullgraph=True)(*inputs())
        (graph,) = backend.fw_graphs
        all_reduces = [
            node
            for node in graph.graph.nodes
            if node.target is torch.ops._c10d_functional.all_reduce.default
        ]
        # x + 1 reduces x once; addcmul reads x twice and reduces it once more.
        self.assertEqual(len(all_reduces), 2)
        for a, e in zip(actual, expected, strict=True):
            self.assertEqual(a.placements, e.placements)
            self.assertEqual(a.to_local(), e.to_local())

    def test_redistribute_once_with_static_shape(self):
        self._check(dynamic=False)

    def test_redistribute_once_with_dynamic_shape(self):
        self._check(dynamic=True)


if __name__ == "__main__":
    run_tests()
