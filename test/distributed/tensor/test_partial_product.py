# Owner(s): ["oncall: distributed"]
"""Views, detach, aliases, clones, selections and factories of a Partial("product")
or bitwise Partial DTensor.

None of them needs the pending reduction: views, copies and selections keep it, the
uninitialized factories inherit it like a Partial("sum") input's (#180511), the
initialized ones give a Replicate buffer, all without a collective (torch 2.15.0
all-reduces in each case).
"""

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


def rank_values(rank):
    return torch.tensor([[2.0 + rank, -1.0], [0.5, 3.0 * (rank + 1)]])


def _index_select(t, index):
    index = torch.tensor(index)
    if isinstance(t, DTensor):
        index = DTensor.from_local(index, t.device_mesh, [Replicate()], run_check=False)
    return t.index_select(0, index)


KEEPS_PRODUCT = {
    "detach": lambda t: t.detach(),
    "alias": lambda t: torch.ops.aten.alias(t),
    "clone": lambda t: t.clone(),
    "t": lambda t: t.t(),
    "transpose": lambda t: t.transpose(0, 1),
    "view": lambda t: t.view(4),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "select": lambda t: t.select(0, 1),
    "index": lambda t: t[1],
    "slice": lambda t: t[:, 1:],
    "narrow": lambda t: t.narrow(1, 0, 1),
    "split": lambda t: t.split(1)[1],
    "unbind": lambda t: t.unbind(1)[0],
    "cat": lambda t: torch.cat([t, t]),
    "index_select": lambda t: _index_select(t, [1, 0, 1]),
    "zero_": lambda t: t.zero_(),
}
GIVES_REPLICATE = {
    "new_zeros": lambda t: t.new_zeros((2, 2)),
    "new_ones": lambda t: t.new_ones((3,)),
    "new_full": lambda t: t.new_full((2, 2), 7.0),
    "zeros_like": lambda t: torch.zeros_like(t),
}


class DistPartialProductTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _product(self, mesh):
        local = map_local_for_rank(self.rank, rank_values)
        return DTensor.from_local(local, mesh, [Partial("product")], run_check=False)

    def _truth(self):
        return torch.stack([rank_values(r) for r in range(self.world_size)]).prod(0)

    def _check_keeps(self, mesh, name):
        comm_mode = CommDebugMode()
        with comm_mode:
            out = KEEPS_PRODUCT[name](self._product(mesh))
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.placements, (Partial("product"),))
        self.assertEqual(out.full_tensor(), KEEPS_PRODUCT[name](self._truth()))

    @with_comms
    def test_views_and_copies_keep_the_pending_product(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"name": list(KEEPS_PRODUCT)}, self._check_keeps, mesh)

    def _check_factory(self, mesh, name):
        comm_mode = CommDebugMode()
        with comm_mode:
            out = GIVES_REPLICATE[name](self._product(mesh))
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.full_tensor(), GIVES_REPLICATE[name](self._truth()))

    @with_comms
    def test_factories_give_replicate_without_reducing_the_input(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"name": list(GIVES_REPLICATE)}, self._check_factory, mesh)

    @with_comms
    def test_uninitialized_factories_give_replicate_without_reducing(self):
        # Unlike sum/avg/min/max (#180511), a product buffer could not take a
        # Replicate value later (no Replicate -> Partial("product") conversion).
        mesh = self.build_device_mesh()
        for make in (
            torch.empty_like,
            lambda t: t.new_empty((2, 2)),
            lambda t: t.new_empty_strided((2, 2), (2, 1)),
        ):
            comm_mode = CommDebugMode()
            with comm_mode:
                out = make(self._product(mesh))
                out.copy_(torch.zeros_like(out))
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(out.placements, (Replicate(),))
            self.assertEqual(out.full_tensor(), torch.zeros(2, 2))

    @with_comms
    def test_copy_slices_with_a_product_gradient(self):
        # y = w * 1; y[0].mul_(2): CopySlices builds the grad with
        # grad.new_empty_strided(base) + copy_ of a Replicate result.
        mesh = self.build_device_mesh()
        ones = map_local_for_rank(self.rank, lambda r: torch.ones(2, 2))
        weight = torch.nn.Parameter(
            DTensor.from_local(ones, mesh, [Replicate()], run_check=False)
        )
        y = weight.to_local(grad_placements=[Partial("product")]) * 1
        y[0].mul_(2)
        y.backward(map_local_for_rank(self.rank, rank_values))
        truth = self._truth().clone()
        truth[0] *= 2**self.world_size
        self.assertEqual(weight.grad.full_tensor(), truth)

    @with_comms
    def test_bitwise_partials_pass_through_views_and_selections(self):
        mesh = self.build_device_mesh()
        for reduce_op, reduce in (
            ("band", lambda a, b: a & b),
            ("bor", lambda a, b: a | b),
            ("bxor", lambda a, b: a ^ b),
        ):
            values = [
                torch.tensor([[12, 7], [5, 3]]) + r for r in range(self.world_size)
            ]
            truth = values[0]
            for v in values[1:]:
                truth = reduce(truth, v)
            local = map_local_for_rank(self.rank, values.__getitem__)
            dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
            for name in ("t", "select", "slice", "clone", "cat"):
                comm_mode = CommDebugMode()
                with comm_mode:
                    out = KEEPS_PRODUCT[name](dt)
                self.assertEqual(comm_mode.get_total_counts(), 0, (reduce_op, name))
                self.assertEqual(out.placements, (Partial(reduce_op),))
                self.assertEqual(out.full_tensor(), KEEPS_PRODUCT[name](truth))

    @with_comms
    def test_accumulate_grad_keeps_a_product_gradient(self):
        mesh = self.build_device_mesh()
        ones = map_local_for_rank(self.rank, lambda r: torch.ones(2, 2))
        weight = torch.nn.Parameter(
            DTensor.from_local(ones, mesh, [Replicate()], run_check=False)
        )
        local = weight.to_local(grad_placements=[Partial("product")])
        upstream = map_local_for_rank(self.rank, rank_values)
        comm_mode = CommDebugMode()
        with comm_mode:
            local.backward(upstream)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(weight.grad.placements, (Partial("product"),))
        self.assertEqual(weight.grad.full_tensor(), self._truth())


DistPartialProductTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialProductTest
)


if __name__ == "__main__":
    run_tests()
