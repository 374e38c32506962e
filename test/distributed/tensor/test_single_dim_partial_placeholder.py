# Owner(s): ["oncall: distributed"]
"""_PartialPlaceholder in single-dim rules: a rule that needs a Partial is expanded only for
inputs that carry it, so other inputs see exactly the rules written with Partial."""

from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
    _PartialPlaceholder,
    _ShardingPlaceholder,
    _SingleDimStrategyInfo,
)
from torch.distributed.tensor._ops.strategy_validation import query_single_dim_strategy
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten


def _view_like_rules(extra):
    def rules(op, args_schema, kwargs_schema):
        meta = args_schema[0]
        strategies = [
            [_ShardingPlaceholder(d), _ShardingPlaceholder(d)]
            for d in range(len(meta.shape))
        ]
        strategies.append([Partial("sum"), Partial("sum")])
        strategies.extend([p, p] for p in extra)
        return strategies

    return rules


WITH_PLACEHOLDERS = _view_like_rules(
    [_PartialPlaceholder("product"), _PartialPlaceholder("bxor")]
)
WITHOUT = _view_like_rules([])
WITH_PRODUCT = _view_like_rules([Partial("product")])


class FakeMeshMixin:
    """For the single-process tests of single-dim rules in this directory (they
    import it from here): rank 0 of 8 on the fake process group, ``self.mesh``
    a (2, 2, 2) mesh with dims "a", "b", "c"."""

    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        self.mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def expand_rules(
        self, placements, rules, mesh=None, op=aten.clone.default, **kwargs
    ):
        """The spec of an (8, 8) input with ``placements`` and the strategies of
        a one-input op (clone by default) for it, expanded from ``rules`` (a
        _SingleDimStrategyInfo; keyword arguments go to the expansion)."""
        mesh = self.mesh if mesh is None else mesh
        t = torch.empty(8, 8)
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        spec = DTensorSpec(mesh, tuple(placements), meta)
        op_schema = OpSchema(op, (OpStrategy([OpSpec(spec)]),), {})
        expanded = _expand_single_dim_strategy_to_mesh(
            mesh, op_schema, rules, meta, **kwargs
        )
        strategy = expanded(op, op_schema.args_meta, {})
        self.assertIsInstance(strategy, OpStrategy)
        return spec, strategy


class TestPartialPlaceholder(FakeMeshMixin, TestCase):
    def _expand(self, mesh, placements, rules):
        return self.expand_rules(placements, _SingleDimStrategyInfo(rules), mesh)

    def _placements(self, strategy):
        return [
            (s.input_specs[0].placements, s.output_spec.placements)
            for s in strategy.strategies
        ]

    def test_left_out_for_inputs_without_the_partial(self):
        for mesh, placements in [
            (self.mesh, [Shard(0), Replicate(), Partial()]),
            (self.mesh, [Shard(0), Shard(1), Replicate()]),
            (self.mesh, [Partial("max"), Replicate(), Replicate()]),
        ]:
            _, with_placeholders = self._expand(mesh, placements, WITH_PLACEHOLDERS)
            _, without = self._expand(mesh, placements, WITHOUT)
            self.assertEqual(
                self._placements(with_placeholders), self._placements(without)
            )

    def test_expanded_for_an_input_that_carries_it(self):
        placements = [Shard(0), Replicate(), Partial("product")]
        spec, with_placeholders = self._expand(self.mesh, placements, WITH_PLACEHOLDERS)
        _, explicit = self._expand(self.mesh, placements, WITH_PRODUCT)
        # bxor is carried by no input: only the product rule is expanded
        self.assertEqual(
            self._placements(with_placeholders), self._placements(explicit)
        )
        self.assertGreater(
            len(with_placeholders.strategies),
            len(self._expand(self.mesh, placements, WITHOUT)[1].strategies),
        )
        matched = [
            s
            for s in with_placeholders.strategies
            if s.input_specs[0].placements == spec.placements
        ]
        self.assertEqual(len(matched), 1)
        self.assertEqual(matched[0].output_spec.placements, spec.placements)
        self.assertEqual(matched[0].redistribute_cost, [[0.0]])

    def _clone_rule_with_placeholders(self):
        return mock.patch.dict(
            DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs,
            {aten.clone.default: _SingleDimStrategyInfo(WITH_PLACEHOLDERS)},
        )

    def test_kept_out_of_a_dtensor_op_without_the_partial(self):
        # end to end: an op whose rule holds a placeholder runs as before
        try:
            with self._clone_rule_with_placeholders():
                _clear_sharding_prop_cache()
                for placement in [Partial("product"), Partial(), Shard(0)]:
                    x = DTensor.from_local(
                        torch.ones(8, 8),
                        self.mesh,
                        [Replicate(), Replicate(), placement],
                    )
                    with CommDebugMode() as comm_mode:
                        y = x.clone()
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(y.placements, x.placements)
                    self.assertEqual(y.to_local(), x.to_local())
        finally:
            _clear_sharding_prop_cache()

    def test_validator_query_sees_the_partial(self):
        with self._clone_rule_with_placeholders():
            rules = query_single_dim_strategy(
                aten.clone.default, (torch.ones(4, 4),), {}
            )
        self.assertIn([Partial("product"), Partial("product")], rules)
        self.assertIn([Partial("bxor"), Partial("bxor")], rules)


if __name__ == "__main__":
    run_tests()
