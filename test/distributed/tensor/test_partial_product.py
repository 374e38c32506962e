# Owner(s): ["oncall: distributed"]
"""Views, detach, aliases, clones, selections and factories of a Partial("product")
or bitwise Partial DTensor.

None of them needs the pending reduction: views, copies and selections keep it, the
uninitialized factories inherit it like a Partial("sum") input's (#180511), the
initialized ones give a Replicate buffer, all without a collective (torch 2.15.0
all-reduces in each case).
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    RuntimeSchemaInfo,
    TupleStrategy,
)
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)

from test_single_dim_partial_placeholder import (  # the test file of the placeholder PR
    FakeMeshMixin,
)


aten = torch.ops.aten


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


class DistPartialProductTest(DTensorContinuousTestBase):
    world_size = 2

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

    def test_factories_give_replicate_without_reducing_the_input(self):
        mesh = self.build_device_mesh()
        self.run_subtests({"name": list(GIVES_REPLICATE)}, self._check_factory, mesh)

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

    def _check_reinterpreting_view(self, mesh, reduce_op, values, target, keeps):
        reduce = {
            "product": torch.mul,
            "band": torch.bitwise_and,
            "bxor": torch.bitwise_xor,
        }[reduce_op]
        values = [torch.tensor(v[0], dtype=v[1]) for v in values]
        truth = reduce(values[0], values[1]).view(target)
        local = map_local_for_rank(self.rank, values.__getitem__)
        dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
        comm_mode = CommDebugMode()
        with comm_mode:
            out = dt.view(target)
        self.assertEqual(comm_mode.get_total_counts(), 0 if keeps else 1)
        self.assertEqual(
            out.placements, (Partial(reduce_op) if keeps else Replicate(),)
        )
        self.assertEqual(out.full_tensor(), truth)

    def test_reinterpreting_views_keep_product_and_bitwise_partials_between_integers(
        self,
    ):
        # Products wrap alike in integers of one size whatever the signedness;
        # bitwise reductions act on each bit whatever the element size. A view
        # to a floating dtype reduces first.
        mesh = self.build_device_mesh()
        i8, i16, i32 = torch.int8, torch.int16, torch.int32
        for reduce_op, values, target, keeps in (
            ("product", [([16, -3], i8), ([16, 5], i8)], torch.uint8, True),
            ("product", [([16, -3], i16), ([16, 5], i16)], torch.int8, False),
            (
                "bxor",
                [([0x01020304, 7], i32), ([0x10203040, 9], i32)],
                torch.uint8,
                True,
            ),
            ("band", [([0x0F0F, 7], i16), ([0x00FF, 12], i16)], torch.int8, True),
            ("bxor", [([5, 7], i32), ([3, 9], i32)], torch.float32, False),
        ):
            if dist.get_backend() == "gloo" and any(d == i16 for _, d in values):
                continue  # gloo cannot all-reduce int16; the LocalTensor twin checks it
            self._check_reinterpreting_view(mesh, reduce_op, values, target, keeps)

    def _check_with_replicate_operand(self, mesh, reduce_op, name):
        # Replicate -> Partial exists for sum/avg/min/max only, so a product or
        # bitwise Partial next to a Replicate operand is reduced first (one
        # all-reduce) instead of asking for a conversion that cannot run.
        is_int = reduce_op != "product"
        values = [
            torch.tensor([[12, 7], [5, 3]]) + r if is_int else rank_values(r)
            for r in range(self.world_size)
        ]
        truth = values[0]
        for v in values[1:]:
            truth = {
                "product": torch.mul,
                "band": torch.bitwise_and,
                "bor": torch.bitwise_or,
                "bxor": torch.bitwise_xor,
            }[reduce_op](truth, v)
        other = torch.full((1, 2), 6 if is_int else 7.0, dtype=truth.dtype)
        index = torch.tensor([1])
        ops = {
            "cat": lambda x, r, i: torch.cat([x, r]),
            "cat_replicate_first": lambda x, r, i: torch.cat([r, x]),
            "stack": lambda x, r, i: torch.stack([x[0], r[0]]),
            "slice_scatter": lambda x, r, i: torch.slice_scatter(x, r, 0, 1, 2),
            "select_scatter": lambda x, r, i: torch.select_scatter(x, r[0], 0, 1),
            "index_fill": lambda x, r, i: x.index_fill(0, i, r[0, 0]),
        }
        local = map_local_for_rank(self.rank, values.__getitem__)
        dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
        replicate = DTensor.from_local(
            map_local_for_rank(self.rank, lambda r: other.clone()),
            mesh,
            [Replicate()],
            run_check=False,
        )
        dt_index = DTensor.from_local(
            map_local_for_rank(self.rank, lambda r: index.clone()),
            mesh,
            [Replicate()],
            run_check=False,
        )
        comm_mode = CommDebugMode()
        with comm_mode:
            out = ops[name](dt, replicate, dt_index)
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(out.placements, (Replicate(),))
        self.assertEqual(out.full_tensor(), ops[name](truth, other, index))

    def test_product_and_bitwise_partials_with_a_replicate_operand(self):
        mesh = self.build_device_mesh()
        self.run_subtests(
            {
                "reduce_op": ["product", "bxor", "band"],
                "name": [
                    "cat",
                    "cat_replicate_first",
                    "stack",
                    "slice_scatter",
                    "select_scatter",
                    "index_fill",
                ],
            },
            self._check_with_replicate_operand,
            mesh,
        )

    def _check_fill(self, mesh, reduce_op):
        # fill_ writes v on every rank. Upstream pins the resulting sum for
        # Partial("sum") (test_fill_inplace_partial_sum); avg/min/max read v.
        # For product and the bitwise reductions that value is not a fill
        # (v ** world_size, 0 for bxor at an even world size): they have no
        # plan and raise, leaving the DTensor unchanged.
        is_int = reduce_op in ("band", "bor", "bxor")
        local = map_local_for_rank(
            self.rank,
            lambda r: torch.tensor([[3, 1], [2, 5]]) + r if is_int else rank_values(r),
        )
        dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
        before = dt.to_local().clone()
        value = 5 if is_int else 2.5
        comm_mode = CommDebugMode()
        if reduce_op in ("sum", "avg", "min", "max"):
            with comm_mode:
                dt.fill_(value)
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(dt.placements, (Partial(reduce_op),))
            truth = torch.full(
                (2, 2), value * (self.world_size if reduce_op == "sum" else 1)
            )
            self.assertEqual(dt.full_tensor(), truth)
        else:
            with self.assertRaisesRegex(RuntimeError, "placement"), comm_mode:
                dt.fill_(value)
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(dt.to_local(), before)

    @staticmethod
    def _ones_like(t, dtype):
        """A Partial("product") of ones for a DTensor (a plain tensor for a plain one)."""
        if not isinstance(t, DTensor):
            return torch.ones(t.shape, dtype=dtype)
        local = torch.ones(t.to_local().shape, dtype=dtype)
        return DTensor.from_local(
            local, t.device_mesh, [Partial("product")], run_check=False
        )

    def test_integer_narrowing_keeps_a_pending_product(self):
        # An integer product wraps modulo 2**n of its dtype, so a cast to an
        # integer of no more bits (either signedness) commutes with it: int32
        # locals 2**20 + 3 and 2**12 + 5 multiply (wrapping) to the int32 value
        # whose int8 cast is the product of the int8 casts. A wider integer does
        # not wrap where int32 did, so it reduces first.
        mesh = self.build_device_mesh()
        if dist.get_backend() == "gloo":
            return  # int8/int16 all-reduce; the LocalTensor twin checks it
        i8, u8, i16, i32, i64 = (
            torch.int8,
            torch.uint8,
            torch.int16,
            torch.int32,
            torch.int64,
        )
        values = [
            torch.tensor([[2**20 + 3, 5], [-7, 3]], dtype=i32),
            torch.tensor([[2**12 + 5, 2**28], [9, -1]], dtype=i32),
        ]
        truth = values[0] * values[1]
        ops = {
            "to(int8)": (lambda t: t.to(i8), True),
            "to(uint8)": (lambda t: t.to(u8), True),
            "to(int16)": (lambda t: t.to(i16), True),
            "prod(dtype=int8)": (lambda t: t.prod(dtype=i8), True),
            "copy_ into int8": (lambda t: self._ones_like(t, i8).copy_(t), True),
            "to(int64)": (lambda t: t.to(i64), False),
            "to(float32)": (lambda t: t.to(torch.float32), False),
        }
        for name, (fn, keeps) in ops.items():
            with self.subTest(name):
                local = map_local_for_rank(self.rank, values.__getitem__)
                dt = DTensor.from_local(
                    local, mesh, [Partial("product")], run_check=False
                )
                comm_mode = CommDebugMode()
                with comm_mode:
                    out = fn(dt)
                self.assertEqual(comm_mode.get_total_counts(), 0 if keeps else 1)
                self.assertEqual(
                    out.placements,
                    (Partial("product") if keeps else Replicate(),),
                )
                self.assertEqual(out.full_tensor(), fn(truth), atol=0, rtol=0)

    def test_fill_keeps_a_pending_reduction_only_where_it_means_a_fill(self):
        mesh = self.build_device_mesh()
        reduce_ops = ["sum", "avg", "min", "max", "product", "band", "bor", "bxor"]
        self.run_subtests({"reduce_op": reduce_ops}, self._check_fill, mesh)


DistPartialProductTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialProductTest, base_class=LocalDTensorContinuousTestBase
)


class PartialProductStrategyExpansionTest(FakeMeshMixin, TestCase):
    """The product and bitwise rules are expanded only for inputs that carry such a
    Partial: other inputs get the strategies of the sum/avg/min/max rules alone (the
    counts below), which the expansion over a 3-D mesh multiplies."""

    def _count(self, op, placements, args, output_shape, list_input=False):
        t = torch.empty(8, 8)
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        spec = DTensorSpec(self.mesh, tuple(placements), meta)
        first = OpStrategy([OpSpec(spec)])
        if list_input:
            first = TupleStrategy((first, OpStrategy([OpSpec(spec)])))
        op_schema = OpSchema(
            op,
            (first, *args),
            {},
            schema_info=RuntimeSchemaInfo(1, needs_pytree=list_input),
        )
        output = torch.empty(output_shape)
        output_meta = TensorMeta(output.shape, output.stride(), output.dtype)
        if op == aten.t.default:
            output_meta = TensorMeta(output.shape, (1, 8), output.dtype)
        propagator = DTensor._op_dispatcher.sharding_propagator
        expanded = _expand_single_dim_strategy_to_mesh(
            self.mesh,
            op_schema,
            propagator.op_single_dim_strategy_funcs[op],
            output_meta,
        )
        return len(expanded(op, op_schema.args_meta, {}).strategies)

    def _counts(self, placements):
        return [
            self._count(aten.clone.default, placements, (), (8, 8)),
            self._count(aten.t.default, placements, (), (8, 8)),
            self._count(aten.select.int, placements, (1, 1), (8,)),
            self._count(aten.cat.default, placements, (1,), (8, 16), list_input=True),
        ]

    def test_ordinary_inputs_get_the_sum_avg_min_max_strategies(self):
        # clone, t, select, cat of (8, 8) inputs on a (2, 2, 2) mesh
        for placements in [
            [Shard(0), Replicate(), Partial()],
            [Shard(0), Shard(1), Replicate()],
        ]:
            self.assertEqual(self._counts(placements), [199, 199, 102, 102])
        self.assertEqual(
            self._counts([Replicate(), Replicate(), Partial("max")]), [41, 41, 41, 41]
        )

    def test_a_product_input_gets_the_product_rule(self):
        self.assertEqual(
            self._counts([Shard(0), Replicate(), Partial("product")]),
            [236, 236, 121, 121],
        )
        ops = {
            "clone": lambda x: x.clone(),
            "t": lambda x: x.t(),
            "select": lambda x: x[:, 1],
            "cat": lambda x: torch.cat([x, x], dim=1),
        }
        for reduce_op in ["product", "bxor"]:
            placements = (Shard(0), Replicate(), Partial(reduce_op))
            x = DTensor.from_local(
                torch.ones(4, 8, dtype=torch.int64),
                self.mesh,
                placements,
                shape=torch.Size([8, 8]),
                stride=(8, 1),
            )
            for name, fn in ops.items():
                with self.subTest(reduce_op=reduce_op, op=name):
                    with CommDebugMode() as comm_mode:
                        out = fn(x)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(out.placements[2], Partial(reduce_op))


if __name__ == "__main__":
    run_tests()
