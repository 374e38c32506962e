# Owner(s): ["oncall: distributed"]
"""A compiled function whose output DTensor lives on a submesh sliced inside it compiles
with inductor and matches eager.

The forward graph derives such a submesh from the input's mesh with DeviceMesh's
reconstruct function. On torch 2.15.0 that node's target is the op packet
``torch.ops.device_mesh._get_submesh``, and inductor refuses it: "device_mesh._get_submesh
is not an OpOverload". torchtitan's graph_trainer (SimpleFSDP) slices the submesh inside
forward this way. The fake process group is enough: the failure is at compile time.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


def on_tp(w):
    return DTensor.from_local(w.to_local(), w.device_mesh["tp"], [Replicate()])


class DTensorCompileSubmeshTest(TestCase):
    def setUp(self):
        super().setUp()
        # Each test traces from an empty sharding cache, as in a fresh process.
        torch._C._clear_DTensor_sharding_propagator_cache()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def replicated(self):
        torch.manual_seed(0)
        local = torch.randn(4, 4, dtype=torch.float64)
        return distribute_tensor(local, self.mesh, [Replicate()] * 2).requires_grad_()

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_output_on_submesh_made_inside(self, backend):
        w, ref = self.replicated(), self.replicated()
        out = torch.compile(on_tp, backend=backend, fullgraph=True)(w)
        expected = on_tp(ref)
        self.assertEqual(out.device_mesh, self.mesh["tp"])
        self.assertEqual(out.placements, expected.placements)
        self.assertEqual(out.to_local(), expected.to_local(), atol=0, rtol=0)
        out.to_local().sum().backward()
        expected.to_local().sum().backward()
        self.assertEqual(w.grad.placements, ref.grad.placements)
        self.assertEqual(w.grad.to_local(), ref.grad.to_local(), atol=0, rtol=0)


instantiate_parametrized_tests(DTensorCompileSubmeshTest)


if __name__ == "__main__":
    run_tests()
