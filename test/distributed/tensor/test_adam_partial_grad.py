# Owner(s): ["oncall: distributed"]
"""An Adam / AdamW step reduces a Partial DTensor gradient once, not once per use, and
matches a plain-tensor step with the reduced gradient."""

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)


def rank_grad(rank):
    return torch.tensor([[0.5 + rank, -1.0], [2.0 * rank, 0.25]])


INIT = torch.tensor([[1.0, -2.0], [0.5, 3.0]])


class DistAdamPartialGradTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _check_step(self, mesh, optim_cls, foreach, options):
        replicated = map_local_for_rank(self.rank, lambda r: INIT.clone())
        weight = torch.nn.Parameter(
            DTensor.from_local(replicated, mesh, [Replicate()], run_check=False)
        )
        grad = map_local_for_rank(self.rank, rank_grad)
        weight.grad = DTensor.from_local(grad, mesh, [Partial("sum")], run_check=False)
        optimizer = optim_cls([weight], lr=0.1, foreach=foreach, **options)

        reference = torch.nn.Parameter(INIT.clone())
        reference.grad = sum(rank_grad(r) for r in range(self.world_size))
        reference_optimizer = optim_cls([reference], lr=0.1, foreach=False, **options)

        for _ in range(2):
            comm_mode = CommDebugMode()
            with comm_mode:
                optimizer.step()
            reference_optimizer.step()
            self.assertEqual(comm_mode.get_total_counts(), 1)
            self.assertEqual(weight.full_tensor(), reference.detach())
        self.assertEqual(weight.grad.placements, (Partial("sum"),))  # .grad is not replaced

    @with_comms
    def test_step_reduces_each_partial_grad_once(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {
                "optim_cls": [torch.optim.Adam, torch.optim.AdamW],
                "foreach": [False, True],
                "options": [{}, {"weight_decay": 0.1, "amsgrad": True}, {"maximize": True}],
            },
            self._check_step,
            mesh,
        )


DistAdamPartialGradTestWithLocalTensor = create_local_tensor_test_class(DistAdamPartialGradTest)


if __name__ == "__main__":
    run_tests()
