# Owner(s): ["oncall: distributed"]
"""new_empty_strided of a Partial DTensor gives a Replicate buffer.

Only correct with the single-clone clone_obey_contract in libtorch (a C++ change): on a
build without it, autograd's layout-contract path would reduce a Partial gradient. The
tests therefore run where the running libtorch has that change, and skip on a wheel.
The #180486 scenario itself (a Partial transposed grad of a Replicate parameter needs no
collective) is test_partial_new_empty.py's, which passes with either fix in place.
"""

import unittest
from functools import cache

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)
from torch.utils._python_dispatch import TorchDispatchMode


class _RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@cache
def libtorch_clones_grads_in_one_op() -> bool:
    """Whether this libtorch's AccumulateGrad fixes a transposed grad with one clone."""
    leaf = torch.zeros(3, 4, requires_grad=True)
    grad = torch.ones(4, 3).t()
    with _RecordOps() as recorder:
        torch.autograd.backward(leaf, grad)
    return torch.ops.aten.new_empty_strided.default not in recorder.ops


needs_single_clone = unittest.skipUnless(
    libtorch_clones_grads_in_one_op(),
    "needs libtorch built with the single-clone clone_obey_contract "
    "(torch/csrc/autograd/utils/grad_layout_contract.h); see `torch-overlay build`",
)


class DistPartialNewEmptyStridedTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @needs_single_clone
    @with_comms
    def test_new_empty_strided_then_fill(self):
        mesh = self.build_device_mesh()
        local = map_local_for_rank(self.rank, lambda r: torch.full((2, 3), 1.0 + r))
        partial = DTensor.from_local(local, mesh, [Partial("sum")], run_check=False)
        buffer = partial.new_empty_strided((2, 3), (3, 1))
        self.assertEqual(buffer.placements, (Replicate(),))
        buffer.fill_(1.5)
        self.assertEqual(buffer.full_tensor(), torch.full((2, 3), 1.5))


DistPartialNewEmptyStridedTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialNewEmptyStridedTest
)


if __name__ == "__main__":
    run_tests()
