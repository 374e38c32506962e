# Owner(s): ["oncall: distributed"]
"""Sharding propagation of a single-dim rule leaves out, on each mesh dim, the rules
that need at an input a product or bitwise Partial the input does not carry there: no
redistribution produces such a Partial, so the strategies that use them cost infinity
and the minimum-cost selection picks the same strategy without them."""

import itertools
from unittest import mock

import torch
import torch.distributed.tensor._sharding_prop as sharding_prop
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    RuntimeSchemaInfo,
)
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
)
from torch.distributed.tensor._sharding_prop import _select_min_cost_strategy
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests, TestCase

from test_single_dim_keep_inputs import (  # the test file of the keep-inputs PR
    OPS as KEEP_INPUTS_OPS,
    RunOpMixin,
)


aten = torch.ops.aten


def _all_rules(*args, **kwargs):
    kwargs["leave_out_unreachable_partials"] = False
    return _expand_single_dim_strategy_to_mesh(*args, **kwargs)


OPS = {
    name: KEEP_INPUTS_OPS[name]
    for name in (
        "clone",
        "t",
        "select",
        "slice",
        "split",
        "cat",
        "new_zeros",
        "zero_",
        "copy_",
        "add",
    )
}
PLACEMENTS = [Replicate(), Shard(0), Shard(1), Partial("product"), Partial("bxor")]


class TestUnreachablePartialRules(RunOpMixin, TestCase):
    def test_fewer_strategies_and_the_same_selection(self):
        # x[:, 1] of [S(1), R, P(product)]: Shard(1) cannot stay, the product
        # rule can only serve the last mesh dim
        t = torch.empty(8, 8)
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        out = torch.empty(8)
        out_meta = TensorMeta(out.shape, out.stride(), out.dtype)
        placements = (Shard(1), Replicate(), Partial("product"))
        spec = DTensorSpec(self.mesh, placements, meta)
        info = RuntimeSchemaInfo(1)
        strategy_schema = OpSchema(
            aten.select.int, (OpStrategy([OpSpec(spec)]), 1, 1), {}, info
        )
        op_schema = OpSchema(aten.select.int, (spec, 1, 1), {}, info)
        rules = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[
            aten.select.int
        ]
        strategies = {}
        for leave_out in (False, True):
            expanded = _expand_single_dim_strategy_to_mesh(
                self.mesh,
                strategy_schema,
                rules,
                out_meta,
                leave_out_unreachable_partials=leave_out,
            )
            strategies[leave_out] = expanded(
                aten.select.int, strategy_schema.args_meta, {}
            )
        self.assertLess(
            len(strategies[True].strategies), len(strategies[False].strategies)
        )
        left_out = [
            s
            for s in strategies[False].strategies
            if s not in strategies[True].strategies
        ]
        for s in left_out:
            self.assertEqual(
                sum(c for costs in s.redistribute_cost for c in costs), float("inf")
            )
        chosen = [
            _select_min_cost_strategy(strategies[k], op_schema) for k in (False, True)
        ]
        self.assertEqual(chosen[0].output_spec, chosen[1].output_spec)
        self.assertEqual(chosen[0].input_specs, chosen[1].input_specs)
        self.assertEqual(chosen[0].redistribute_cost, chosen[1].redistribute_cost)

    def test_in_place_ops_keep_the_full_expansion(self):
        # copy_ into a product/bxor Partial from a source that cannot become it:
        # the same error as with every rule
        S, R = Shard(0), Replicate()
        for dst, src in [
            ([Partial("bxor"), S, S], [S, S, S]),
            ([S, Partial("product"), Partial("product")], [Shard(1), R, R]),
        ]:
            left_out = self.run_op(
                lambda x, y: x.copy_(y), self.mesh, [dst, src], torch.int64
            )
            with mock.patch.object(
                sharding_prop, "_expand_single_dim_strategy_to_mesh", _all_rules
            ):
                every_rule = self.run_op(
                    lambda x, y: x.copy_(y), self.mesh, [dst, src], torch.int64
                )
            self.assertEqual(left_out, every_rule, msg=f"{dst} <- {src}")

    def test_a_rank_outside_the_mesh_selects_the_same(self):
        # rank 0 is not in this mesh: redistribute_cost is 0 for every source
        # there, so the strategies left out do not cost infinity; the
        # selection is the same because the first strategy, all-Replicate on
        # every mesh dim, is never left out (asserted below wherever more than
        # one strategy is expanded)
        mesh = DeviceMesh("cpu", torch.arange(4, 8).view(2, 2))
        selected = []
        sizes = []
        first_is_replicate = []

        def all_replicate(op_spec):
            specs = op_spec.output_specs
            specs = [specs] if isinstance(specs, DTensorSpec) else list(specs)
            specs += list(op_spec.input_specs or ())
            return all(
                s is None or all(p.is_replicate() for p in s.placements) for s in specs
            )

        def recording_select(strategy, op_schema=None):
            op_spec = _select_min_cost_strategy(strategy, op_schema)
            selected.append((op_spec.input_specs, op_spec.output_specs))
            sizes[-1].append(len(strategy.strategies))
            # one strategy: the inputs as they are (the keep-inputs shortcut)
            if len(strategy.strategies) > 1:
                first_is_replicate.append(all_replicate(strategy.strategies[0]))
            return op_spec

        def dtensor(placements, dtype=torch.float32):
            return DTensor.from_local(
                torch.empty(0, dtype=dtype),
                mesh,
                placements,
                run_check=False,
                shape=torch.Size((8, 8)),
                stride=(8, 1),
            )

        S, P, R = Shard, Partial, Replicate()
        cases = {
            "select": lambda: dtensor([S(1), P("product")])[:, 1],
            "select_other_order": lambda: dtensor([P("product"), S(1)])[:, 1],
            "slice": lambda: dtensor([S(1), P("product")])[:, 2:],
            "cat": lambda: torch.cat(
                [dtensor([S(1), P("product")]), dtensor([S(1), P("product")])], 1
            ),
            "t": lambda: dtensor([P("product"), S(0)]).t(),
            "clone_bxor": lambda: dtensor([S(1), P("bxor")], torch.int32).clone(),
            "add": lambda: dtensor([P("product"), R]) + dtensor([R, S(0)]),
        }
        self.assertFalse(mesh._is_current_rank_part_of_mesh())
        left_out = 0
        for name, fn in cases.items():
            picks = []
            for expand in (_expand_single_dim_strategy_to_mesh, _all_rules):
                selected.clear()
                sizes.append([])
                _clear_sharding_prop_cache()
                with (
                    mock.patch.object(
                        sharding_prop, "_expand_single_dim_strategy_to_mesh", expand
                    ),
                    mock.patch.object(
                        sharding_prop, "_select_min_cost_strategy", recording_select
                    ),
                ):
                    try:
                        out = fn()
                        picks.append((list(selected), out.placements))
                    except Exception as e:
                        picks.append((type(e).__name__, str(e)))
            self.assertEqual(picks[0], picks[1], msg=name)
            self.assertTrue(all(first_is_replicate), msg=name)
            first_is_replicate.clear()
            self.assertNotIsInstance(picks[0][0], str, msg=name)
            left_out += sum(sizes[-2]) < sum(sizes[-1])
        # rules were left out in most cases
        self.assertGreater(left_out, len(cases) // 2)

    def test_same_placements_values_and_collectives_as_every_rule(self):
        for (name, (n_inputs, fn)), mesh in itertools.product(
            OPS.items(), [self.mesh, self.mesh["b", "c"]]
        ):
            dtype = torch.int64
            for combo in list(itertools.product(PLACEMENTS, repeat=mesh.ndim))[::2]:
                if len({p for p in combo if isinstance(p, Partial)}) > 1:
                    continue
                if not any(isinstance(p, Partial) for p in combo):
                    continue
                inputs = [list(combo)] * n_inputs
                left_out = self.run_op(fn, mesh, inputs, dtype)
                with mock.patch.object(
                    sharding_prop, "_expand_single_dim_strategy_to_mesh", _all_rules
                ):
                    every_rule = self.run_op(fn, mesh, inputs, dtype)
                self.assertEqual(left_out, every_rule, msg=f"{name} {inputs}")


if __name__ == "__main__":
    run_tests()
