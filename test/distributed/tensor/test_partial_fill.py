# Owner(s): ["oncall: distributed"]
"""fill_ / zero_ and the nn.init helpers on Partial DTensors.

Every rank writes the same value, so the result is right only if the pending
reduction maps that value to itself. Otherwise the in-place op must refuse
(leaving the tensor untouched) rather than return world_size * value.
"""

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Partial
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
    "product": lambda t: t.prod(0),
}
REFUSAL = "in-place operations that require placement changes are not supported"


def rank_values(rank):
    return torch.tensor([1.0 + rank, -2.0 - 3.0 * rank, 0.5])


class DistPartialFillTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _partial(self, mesh, reduce_op):
        local = map_local_for_rank(self.rank, rank_values)
        return DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)

    def _truth_of_reduced(self, reduce_op, per_rank):
        """The plain-tensor ground truth: reduce the per-rank values first."""
        return REDUCTIONS[reduce_op](torch.stack(per_rank))

    def _check_fill(self, mesh, reduce_op, value, fill):
        dt = self._partial(mesh, reduce_op)
        filled = torch.full((3,), float(value))
        # What the pending reduction makes of every rank holding `value`.
        reduced = self._truth_of_reduced(reduce_op, [filled] * self.world_size)
        comm_mode = CommDebugMode()
        if torch.equal(reduced, filled):
            with comm_mode:
                fill(dt, value)
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(dt.placements, (Partial(reduce_op),))
            self.assertEqual(dt.full_tensor(), filled)
        else:
            with self.assertRaisesRegex(RuntimeError, REFUSAL):
                fill(dt, value)
            truth = self._truth_of_reduced(
                reduce_op, [rank_values(r) for r in range(self.world_size)]
            )
            self.assertEqual(dt.full_tensor(), truth)  # untouched

    @with_comms
    def test_fill_keeps_partial_only_when_the_value_survives(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {
                "reduce_op": list(REDUCTIONS),
                "value": [0, 1, 1.5, -2.0],
                "fill": [torch.Tensor.fill_, nn.init.constant_],
            },
            self._check_fill,
            mesh,
        )

    @with_comms
    def test_zero_keeps_every_partial(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {
                "reduce_op": list(REDUCTIONS),
                "value": [0],
                "fill": [
                    lambda t, _: t.zero_(),
                    lambda t, _: nn.init.zeros_(t),
                ],
            },
            self._check_fill,
            mesh,
        )

    @with_comms
    def test_ones_and_empty_like_fill_do_not_multiply_by_world_size(self):
        mesh = self.build_device_mesh()
        with self.assertRaisesRegex(RuntimeError, REFUSAL):
            nn.init.ones_(self._partial(mesh, "sum"))
        empty = torch.empty_like(self._partial(mesh, "sum"))
        self.assertEqual(empty.placements, (Partial("sum"),))
        with self.assertRaisesRegex(RuntimeError, REFUSAL):
            empty.fill_(1.5)
        ones = nn.init.ones_(self._partial(mesh, "max"))
        self.assertEqual(ones.full_tensor(), torch.ones(3))

    @with_comms
    def test_layer_norm_reset_parameters_on_partial_params(self):
        # to_empty() keeps the Partial placement (empty_like), then reset_parameters()
        # fills weight with 1 and bias with 0: the sum-fill is refused, the zero kept.
        mesh = self.build_device_mesh()
        norm = nn.LayerNorm(3)
        norm.weight = nn.Parameter(self._partial(mesh, "sum"))
        norm.bias = nn.Parameter(self._partial(mesh, "sum"))
        norm.to_empty(device=self.device_type)
        self.assertEqual(norm.weight.placements, (Partial("sum"),))
        with self.assertRaisesRegex(RuntimeError, REFUSAL):
            norm.reset_parameters()
        nn.init.zeros_(norm.bias)
        self.assertEqual(norm.bias.full_tensor(), torch.zeros(3))
        norm = nn.LayerNorm(3)
        norm.weight = nn.Parameter(self._partial(mesh, "max"))
        norm.bias = nn.Parameter(self._partial(mesh, "max"))
        norm.to_empty(device=self.device_type).reset_parameters()
        self.assertEqual(norm.weight.full_tensor(), torch.ones(3))
        self.assertEqual(norm.bias.full_tensor(), torch.zeros(3))


DistPartialFillTestWithLocalTensor = create_local_tensor_test_class(DistPartialFillTest)


if __name__ == "__main__":
    run_tests()
