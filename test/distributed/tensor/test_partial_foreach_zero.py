# Owner(s): ["oncall: distributed"]
"""_foreach_zero_ (optimizers' zero_grad(set_to_none=False) with foreach=True) on Partial
DTensors: zeros reduce to zeros under every reduction, so no placement change and no
collective is needed (torch 2.15.0 raises; the per-tensor zero_ path works)."""

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)


class DistPartialForeachZeroTest(DTensorContinuousTestBase):
    world_size = 2

    def _dtensor(self, mesh, placement):
        local = map_local_for_rank(self.rank, lambda r: torch.arange(4.0) + r + 1)
        return DTensor.from_local(local, mesh, [placement], run_check=False)

    def _check_zero_grad(self, mesh, reduce_op, foreach):
        ones = map_local_for_rank(self.rank, lambda r: torch.ones(4))
        weight = torch.nn.Parameter(
            DTensor.from_local(ones, mesh, [Replicate()], run_check=False)
        )
        weight.grad = self._dtensor(mesh, Partial(reduce_op))
        optimizer = torch.optim.Adam([weight], foreach=foreach)
        comm_mode = CommDebugMode()
        with comm_mode:
            optimizer.zero_grad(set_to_none=False)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(weight.grad.placements, (Partial(reduce_op),))
        self.assertEqual(weight.grad.full_tensor(), torch.zeros(4))

    def test_zero_grad_keeps_partial_grads(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"reduce_op": list(Partial.ALL_REDUCE_OPS), "foreach": [True, False]},
            self._check_zero_grad,
            mesh,
        )

    def test_foreach_zero_on_mixed_placements(self):
        mesh = self.build_device_mesh()
        placements = [Partial("sum"), Partial("max"), Shard(0), Replicate()]
        tensors = [self._dtensor(mesh, p) for p in placements]
        comm_mode = CommDebugMode()
        with comm_mode:
            torch._foreach_zero_(tensors)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        for tensor, placement in zip(tensors, placements, strict=True):
            self.assertEqual(tensor.placements, (placement,))
            self.assertEqual(tensor.full_tensor(), torch.zeros(tensor.shape))


DistPartialForeachZeroTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialForeachZeroTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
