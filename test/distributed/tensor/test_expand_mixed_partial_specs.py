# Owner(s): ["oncall: distributed"]
"""expand_to_full_mesh_op_strategy drops a combination of rules that mixes Partial
types before building its specs: on a multi-dim mesh most combinations of Partial rules
mix them, and building their specs was most of the expansion's cost."""

from unittest import mock

import torch
import torch.distributed.tensor._ops.utils as ops_utils
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
)
from torch.testing._internal.common_utils import run_tests, TestCase

from test_single_dim_partial_placeholder import (  # the test file of the placeholder PR
    FakeMeshMixin,
)


aten = torch.ops.aten


class TestMixedPartialSpecs(FakeMeshMixin, TestCase):
    def test_no_specs_built_for_mixed_partial_combinations(self):
        built = [0]

        class CountingSpec(DTensorSpec):
            def __post_init__(self):
                built[0] += 1
                super().__post_init__()

        t = torch.empty(8, 8)
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        spec = DTensorSpec(self.mesh, (Shard(0), Replicate(), Partial()), meta)
        op_schema = OpSchema(aten.clone.default, (OpStrategy([OpSpec(spec)]),), {})
        rules = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[
            aten.clone.default
        ]
        expanded = _expand_single_dim_strategy_to_mesh(
            self.mesh, op_schema, rules, meta
        )
        with mock.patch.object(ops_utils, "DTensorSpec", CountingSpec):
            strategy = expanded(aten.clone.default, op_schema.args_meta, {})
        # 7 rules ** 3 mesh dims = 343 combinations, 199 without mixed Partials
        # (sum and avg mix), one output and one input spec each
        self.assertEqual(len(strategy.strategies), 199)
        self.assertEqual(built[0], 2 * 199)
        for op_spec in strategy.strategies:
            for s in (op_spec.output_spec, *op_spec.input_specs):
                kinds = {p.reduce_op for p in s.placements if isinstance(p, Partial)}
                self.assertTrue(len(kinds) <= 1 or kinds == {"sum", "avg"})


if __name__ == "__main__":
    run_tests()
