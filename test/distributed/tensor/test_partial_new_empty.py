# Owner(s): ["oncall: distributed"]
"""new_empty of a Partial DTensor gives a Replicate buffer.

Whatever the caller writes into an uninitialized buffer next (fill_, a random init, a
copy_ from another Partial) must not pick up the input's pending reduction. The
layout-contract path of autograd, which relies on new_empty_strided, keeps working.
"""

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)

REDUCTIONS = {
    "sum": lambda t: t.sum(0),
    "avg": lambda t: t.mean(0),
    "min": lambda t: t.amin(0),
    "max": lambda t: t.amax(0),
}


def rank_values(rank):
    return torch.tensor([[1.0 + rank, -2.0 * rank], [0.5, 3.0 - rank]])


class DistPartialNewEmptyTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _partial(self, mesh, reduce_op, values=rank_values):
        local = map_local_for_rank(self.rank, values)
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _truth(self, reduce_op, values=rank_values):
        return REDUCTIONS[reduce_op](torch.stack([values(r) for r in range(self.world_size)]))

    def _check_fill(self, mesh, reduce_op, shape):
        comm_mode = CommDebugMode()
        with comm_mode:
            buffer = self._partial(mesh, reduce_op).new_empty(shape)
            buffer.fill_(1.5)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(buffer.placements, (Replicate(),))
        self.assertEqual(buffer.full_tensor(), torch.full(shape, 1.5))

    @with_comms
    def test_new_empty_then_fill(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {"reduce_op": list(REDUCTIONS), "shape": [(2, 2), (3,)]}, self._check_fill, mesh
        )

    @with_comms
    def test_new_empty_then_random_init(self):
        mesh = self.build_device_mesh()
        for init in (nn.init.uniform_, nn.init.normal_, lambda t: t.bernoulli_(0.5)):
            buffer = self._partial(mesh, "sum").new_empty((2, 2))
            init(buffer)
            self.assertEqual(buffer.placements, (Replicate(),))
            full = buffer.full_tensor()
            self.assertTrue(torch.isfinite(full).all())
            self.assertEqual(buffer.to_local(), full)  # every rank holds the same values

    def _check_copy(self, mesh, reduce_op):
        source = self._partial(mesh, reduce_op, lambda r: rank_values(r) * 3)
        buffer = self._partial(mesh, "sum").new_empty((2, 2))
        comm_mode = CommDebugMode()
        with comm_mode:
            buffer.copy_(source)
        self.assertEqual(comm_mode.get_total_counts(), 1)  # reduce the source once
        self.assertEqual(buffer.placements, (Replicate(),))
        self.assertEqual(buffer.full_tensor(), self._truth(reduce_op, lambda r: rank_values(r) * 3))

    @with_comms
    def test_new_empty_then_copy_from_another_partial(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"reduce_op": ["max", "avg", "sum"]}, self._check_copy, mesh)

    @with_comms
    def test_transposed_partial_grad_of_replicate_param_is_not_reduced(self):
        # pytorch/pytorch#180486 through the installed AccumulateGrad: new_empty_strided
        # still inherits Partial, so the layout-contract copy needs no collective.
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        weight = nn.Parameter(distribute_tensor(torch.randn(4, 6), mesh, [Replicate()]))

        def local_grad(rank):
            return torch.arange(24.0).reshape(6, 4).mul(rank + 1).t()

        grad = DTensor.from_local(
            map_local_for_rank(self.rank, local_grad), mesh, [Partial("sum")], run_check=False
        )
        comm_mode = CommDebugMode()
        with comm_mode:
            torch.autograd.backward(weight, grad)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(weight.grad.placements, (Partial("sum"),))
        self.assertEqual(weight.grad.stride(), weight.stride())
        self.assertEqual(weight.grad.full_tensor(), sum(local_grad(r) for r in range(2)))


DistPartialNewEmptyTestWithLocalTensor = create_local_tensor_test_class(DistPartialNewEmptyTest)


if __name__ == "__main__":
    run_tests()
