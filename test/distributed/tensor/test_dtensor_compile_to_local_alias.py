# Owner(s): ["oncall: distributed"]
"""A compiled ``to_local()`` of a DTensor parameter returns an alias of its local tensor,
never the local tensor object itself: with inductor, torch 2.15.0 hands back
``param._local_tensor`` and autograd then sets ``requires_grad`` / ``grad_fn`` on it,
mutating the parameter. The fake process group is enough (single process)."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.fake_pg import FakeStore


class DTensorCompileToLocalAliasTest(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        self.mesh = init_device_mesh("cpu", (2,))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def parameter(self):
        torch.manual_seed(0)
        local = torch.randn(4, 4)
        return torch.nn.Parameter(distribute_tensor(local, self.mesh, [Replicate()]))

    def check_alias(self, backend):
        param, ref = self.parameter(), self.parameter()
        inner = param._local_tensor
        out = torch.compile(lambda w: w.to_local(), backend=backend, fullgraph=True)(param)
        # the parameter's local tensor is untouched ...
        self.assertIsNot(out, inner)
        self.assertFalse(inner.requires_grad)
        self.assertIsNone(inner.grad_fn)
        # ... and the output is an alias of it, differentiable like eager's
        self.assertEqual(out.untyped_storage().data_ptr(), inner.untyped_storage().data_ptr())
        self.assertTrue(out.requires_grad)
        (out * 3).sum().backward()
        (ref.to_local() * 3).sum().backward()
        self.assertEqual(param.grad.to_local(), ref.grad.to_local(), atol=0, rtol=0)
        self.assertEqual(param.grad.placements, ref.grad.placements)

    def test_inductor(self):
        self.check_alias("inductor")

    def test_aot_eager(self):
        """aot_eager already returned a new tensor on torch 2.15.0: a guard."""
        self.check_alias("aot_eager")


if __name__ == "__main__":
    run_tests()
