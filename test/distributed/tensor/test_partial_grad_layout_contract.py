# Owner(s): ["oncall: distributed"]
"""A Partial gradient of a Replicate parameter is never reduced by autograd itself.

pytorch/pytorch#180486: autograd builds gradients with ``new_empty_strided`` + ``copy_``
(AccumulateGrad's layout contract for a non-contiguous grad, CopySlices for an in-place
op on a view). Upstream fixed it in #180511 by letting the uninitialized factories
inherit a Partial placement, which upstream's tests pin. This series keeps that policy;
these cases guard it, on the wheel, with 0 collectives: the seed's four variants
(native mm / custom autograd.Function, with and without a transpose) and CopySlices.
They pass on torch 2.15.0; with new_empty_strided giving Replicate (as the series'
former "[DTensor] new_empty_strided of a Partial DTensor gives a Replicate buffer again"
did) AccumulateGrad and CopySlices all-reduce the gradient (1 collective each).
"""

import torch
import torch.nn as nn
from torch.distributed.tensor import Partial, Replicate, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)


class CustomMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.mm(x, w)

    @staticmethod
    def backward(ctx, grad_output):
        x, w = ctx.saved_tensors
        return grad_output @ w.T, x.T @ grad_output


def rank_input(rank):
    return torch.arange(16.0).reshape(2, 8).mul(rank + 1) / 10


class DistPartialGradLayoutContractTest(DTensorContinuousTestBase):
    world_size = 2

    def _weight(self, mesh):
        torch.manual_seed(0)
        return nn.Parameter(
            distribute_tensor(torch.randn(4, 8, 8), mesh, [Replicate()])
        )

    def _loss(self, weight, x, use_transpose, use_custom_fn):
        w = weight.to_local(grad_placements=[Partial()])
        if use_transpose:
            w = w.transpose(1, 2).contiguous()
        matmul = CustomMatmul.apply if use_custom_fn else torch.mm
        return matmul(x, w[0]).sum()

    def _check_seed_case(self, mesh, use_transpose, use_custom_fn):
        weight = self._weight(mesh)
        x = map_local_for_rank(self.rank, rank_input)
        comm_mode = CommDebugMode()
        with comm_mode:
            self._loss(weight, x, use_transpose, use_custom_fn).backward()
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(weight.grad.placements, (Partial(),))
        self.assertEqual(weight.grad.stride(), weight.stride())

        # Plain-tensor truth: the sum over ranks of each rank's local gradient.
        plain = weight.full_tensor().detach().requires_grad_()
        for rank in range(self.world_size):
            w = plain.transpose(1, 2).contiguous() if use_transpose else plain
            (rank_input(rank) @ w[0]).sum().backward()
        self.assertEqual(weight.grad.full_tensor(), plain.grad)

    def test_seed_cases_keep_a_partial_grad_without_collectives(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"use_transpose": [False, True], "use_custom_fn": [False, True]},
            self._check_seed_case,
            mesh,
        )

    def test_copy_slices_keeps_a_partial_grad_without_collectives(self):
        # y = w * 1; y[0].mul_(2): CopySlices builds the grad with
        # grad.new_empty_strided(base) + copy_.
        mesh = self.build_device_mesh()
        weight = self._weight(mesh)
        upstream = map_local_for_rank(
            self.rank, lambda r: torch.ones(4, 8, 8) * (r + 1)
        )
        comm_mode = CommDebugMode()
        with comm_mode:
            y = weight.to_local(grad_placements=[Partial()]) * 1
            y[0].mul_(2)
            y.backward(upstream)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(weight.grad.placements, (Partial(),))
        truth = torch.full((4, 8, 8), 3.0)
        truth[0] *= 2
        self.assertEqual(weight.grad.full_tensor(), truth)


DistPartialGradLayoutContractTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialGradLayoutContractTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
