# Owner(s): ["oncall: distributed"]
"""A sharding-propagation cache miss does not enumerate rules for a Partial no input carries.

Single-dim rules are expanded over every mesh dim (rules ** mesh.ndim combinations), so each
rule a miss keeps costs more on an N-D mesh. A rule that needs an input Partial which no
input carries (a product or bitwise Partial, which nothing converts into; any Partial for a
one-input op, where the all-Replicate rule is never worse) is never selected: dropping it
keeps every placement, value and collective, and shrinks the cross product.
"""

from unittest import mock

import torch
import torch.distributed.tensor._ops.utils as op_utils
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode, _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)


class DistUnsuppliedPartialRulesTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 8

    def _rules_used(self, fn, *args):
        """Run fn on a cleared sharding cache; return the single-dim rules expanded."""
        rules = []
        expand = op_utils.expand_to_full_mesh_op_strategy

        def recording(mesh, op_schema, single_mesh_dim_strategies, **kwargs):
            rules.extend(single_mesh_dim_strategies)
            return expand(mesh, op_schema, single_mesh_dim_strategies, **kwargs)

        _clear_sharding_prop_cache()
        with mock.patch.object(op_utils, "expand_to_full_mesh_op_strategy", recording):
            out = fn(*args)
        return out, rules

    def _dtensor(self, mesh, last):
        local = map_local_for_rank(
            self.rank, lambda r: torch.arange(8.0).reshape(2, 4) + r
        )
        placements = [Shard(0), Replicate(), last]
        return DTensor.from_local(local, mesh, placements, run_check=False)

    @with_comms
    def test_inplace_rules_drop_partials_self_lacks(self):
        from torch.distributed.tensor import init_device_mesh

        mesh = init_device_mesh(self.device_type, (2, 2, 2))
        x, y = self._dtensor(mesh, Partial("sum")), self._dtensor(mesh, Partial("sum"))
        expected = x.to_local() + y.to_local()
        comm_mode = CommDebugMode()
        with comm_mode:
            out, rules = self._rules_used(lambda a, b: a.add_(b), x, y)
        self_partials = {rule[1] for rule in rules if isinstance(rule[1], Partial)}
        self.assertEqual(self_partials, {Partial("sum")})
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.placements, (Shard(0), Replicate(), Partial("sum")))
        self.assertEqual(out.to_local(), expected)

    @with_comms
    def test_unary_rules_drop_partials_the_input_lacks(self):
        from torch.distributed.tensor import init_device_mesh

        mesh = init_device_mesh(self.device_type, (2, 2, 2))
        for name, fn in {
            "clone": lambda x: x.clone(),
            "t": lambda x: x.t(),
            "select": lambda x: x[:, 1],
            "to(float64)": lambda x: x.to(torch.float64),
            "zeros_like": torch.zeros_like,
        }.items():
            x = self._dtensor(mesh, Partial("sum"))
            comm_mode = CommDebugMode()
            with comm_mode:
                out, rules = self._rules_used(fn, x)
            partials = {p for rule in rules for p in rule[1:] if isinstance(p, Partial)}
            self.assertEqual(partials - {Partial("sum")}, set(), name)
            # the selected plan is unchanged: same placement, no collective, same value
            self.assertEqual(comm_mode.get_total_counts(), 0, name)
            expected = fn(x.to_local()) if name != "zeros_like" else None
            if expected is not None:
                self.assertEqual(out.to_local(), expected, name)

    @with_comms
    def test_multi_input_rules_drop_partials_no_input_carries(self):
        from torch.distributed.tensor import init_device_mesh

        mesh = init_device_mesh(self.device_type, (2, 2, 2))
        x, y = self._dtensor(mesh, Partial("sum")), self._dtensor(mesh, Partial("sum"))
        comm_mode = CommDebugMode()
        with comm_mode:
            out, rules = self._rules_used(lambda a, b: torch.cat([a, b], dim=1), x, y)
        reduce_ops = {
            p.reduce_op for rule in rules for p in rule[1:] if isinstance(p, Partial)
        }
        # only the carried Partial(sum): the others would need both inputs converted,
        # which is never cheaper than the all-Replicate rule
        self.assertEqual(reduce_ops, {"sum"})
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(out.placements, (Shard(0), Replicate(), Partial("sum")))
        self.assertEqual(out.to_local(), torch.cat([x.to_local(), y.to_local()], dim=1))


DistUnsuppliedPartialRulesTestWithLocalTensor = create_local_tensor_test_class(
    DistUnsuppliedPartialRulesTest
)


if __name__ == "__main__":
    run_tests()
