# Owner(s): ["oncall: distributed"]
"""Sharding propagation of a single-dim rule takes the strategy that keeps every input
as it is, without expanding every combination of rules over the mesh dims, when the
inputs match a rule on every mesh dim: the minimum-cost selection picks that strategy
from the full expansion anyway."""

import itertools
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.single_dim_strategy as single_dim_strategy
import torch.distributed.tensor._sharding_prop as sharding_prop
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
    _ShardingPlaceholder,
    _SingleDimStrategyInfo,
)
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore

aten, prims = torch.ops.aten, torch.ops.prims


def _index_select(x):
    index = DTensor.from_local(
        torch.tensor([1, 0]),
        x.device_mesh,
        [Replicate()] * x.device_mesh.ndim,
        run_check=False,
    )
    return x.index_select(0, index)


OPS = {
    "clone": (1, lambda x: x.clone()),
    "t": (1, lambda x: x.t()),
    "select": (1, lambda x: x[:, 1]),
    "slice": (1, lambda x: x[:, 2:]),
    "split": (1, lambda x: x.split(4, 1)),
    "cat": (2, lambda x, y: torch.cat([x, y], 1)),
    "index_select": (1, _index_select),
    "add": (2, lambda x, y: x + y),
    "mul": (2, lambda x, y: x * y),
    "mul_scalar": (1, lambda x: x * 0.5),
    "sum": (1, lambda x: x.sum()),
    "sum_dim": (1, lambda x: x.sum(1)),
    "mm": (2, lambda x, y: x @ y),
    "relu": (1, lambda x: x.relu()),
    "to_bf16": (1, lambda x: x.to(torch.bfloat16)),
    "convert_element_type_f64": (
        1,
        lambda x: prims.convert_element_type(x, torch.float64),
    ),
    "new_zeros": (1, lambda x: x.new_zeros((8, 8))),
    "zero_": (1, lambda x: x.zero_()),
    "add_": (2, lambda x, y: x.add_(y)),
    "copy_": (2, lambda x, y: x.copy_(y)),
}
PLACEMENTS = [
    Replicate(),
    Shard(0),
    Shard(1),
    Partial(),
    Partial("max"),
    Partial("product"),
]


def _full_expansion_only(*args, **kwargs):
    kwargs["inputs_as_they_are_if_matched"] = False
    return _expand_single_dim_strategy_to_mesh(*args, **kwargs)


class TestKeepInputsIfMatched(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        self.mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def _dtensor(self, mesh, placements):
        shape = [8, 8]
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Shard):
                shape[p.dim] //= mesh.size(mesh_dim)
        return DTensor.from_local(
            torch.arange(64.0).reshape(8, 8)[: shape[0], : shape[1]] + 1,
            mesh,
            placements,
            run_check=False,
            shape=torch.Size((8, 8)),
            stride=(8, 1),
        )

    def _run(self, fn, mesh, input_placements):
        """Output placements, collectives, or the error of fn on fresh inputs."""
        _clear_sharding_prop_cache()
        xs = [self._dtensor(mesh, p) for p in input_placements]
        try:
            with CommDebugMode() as comm_mode:
                out = fn(*xs)
        except Exception as e:
            return type(e).__name__, str(e)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return (
            [(o.placements, o.shape, o.stride()) for o in outs],
            comm_mode.get_comm_counts(),
        )

    def _expand(self, placements, rules, keep_inputs):
        t = torch.empty(8, 8)
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        spec = DTensorSpec(self.mesh, tuple(placements), meta)
        op_schema = OpSchema(aten.clone.default, (OpStrategy([OpSpec(spec)]),), {})
        expanded = _expand_single_dim_strategy_to_mesh(
            self.mesh,
            op_schema,
            rules,
            meta,
            inputs_as_they_are_if_matched=keep_inputs,
        )
        return expanded(aten.clone.default, op_schema.args_meta, {}).strategies

    def test_one_strategy_when_the_inputs_match(self):
        clone_rules = (
            DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[
                aten.clone.default
            ]
        )
        placements = (Shard(0), Replicate(), Partial())
        full = self._expand(placements, clone_rules, keep_inputs=False)
        (kept,) = self._expand(placements, clone_rules, keep_inputs=True)
        self.assertEqual(len(full), 199)
        self.assertEqual(kept.input_specs[0].placements, placements)
        self.assertEqual(kept.output_spec.placements, placements)
        self.assertEqual(kept.redistribute_cost, [[0.0]])
        (same,) = [s for s in full if s.input_specs[0].placements == placements]
        self.assertEqual(kept.output_spec, same.output_spec)
        self.assertEqual(kept.input_specs, same.input_specs)
        self.assertEqual(kept.redistribute_cost, same.redistribute_cost)

    def test_full_expansion_when_the_inputs_match_no_rule(self):
        # a float cast that must reduce the Partial(sum) first
        rules = _SingleDimStrategyInfo(
            lambda op, args, kwargs: [
                [_ShardingPlaceholder(d), _ShardingPlaceholder(d)] for d in range(2)
            ]
        )
        placements = (Shard(0), Replicate(), Partial())
        full = self._expand(placements, rules, keep_inputs=False)
        kept = self._expand(placements, rules, keep_inputs=True)
        self.assertEqual(len(full), 27)
        self.assertEqual(kept, full)

    def test_full_expansion_when_rules_give_one_input_two_outputs(self):
        # Shard(0) -> Partial() or Shard(0): the full expansion's selection
        # decides between them, the shortcut leaves it to it
        rules = _SingleDimStrategyInfo(
            lambda op, args, kwargs: [
                [Partial(), Shard(0)],
                [Shard(0), Shard(0)],
            ]
        )
        placements = (Shard(0), Replicate(), Replicate())
        full = self._expand(placements, rules, keep_inputs=False)
        kept = self._expand(placements, rules, keep_inputs=True)
        self.assertGreater(len(full), 1)
        self.assertEqual(kept, full)

    def test_inputs_with_fewer_placements_than_mesh_dims(self):
        # from_local does not check that placements cover the mesh; such an
        # input takes the full expansion, as before
        x = self._dtensor(self.mesh, [Shard(0), Replicate(), Partial()])
        index = DTensor.from_local(
            torch.tensor([1, 0]), self.mesh, [Replicate()] * 2, run_check=False
        )
        value = DTensor.from_local(
            torch.tensor(2.0), self.mesh, [Replicate()] * 2, run_check=False
        )
        _clear_sharding_prop_cache()
        with CommDebugMode() as comm_mode:
            y = aten.index_fill.int_Tensor(x, 1, index, value)
        with mock.patch.object(
            sharding_prop, "_expand_single_dim_strategy_to_mesh", _full_expansion_only
        ):
            _clear_sharding_prop_cache()
            with CommDebugMode() as full_comm_mode:
                full = aten.index_fill.int_Tensor(x, 1, index, value)
        self.assertEqual(y.placements, full.placements)
        self.assertEqual(y.to_local(), full.to_local())
        self.assertEqual(comm_mode.get_comm_counts(), full_comm_mode.get_comm_counts())

    def test_same_placements_and_collectives_as_the_full_expansion(self):
        # every op above, pairs of placements on two mesh dims (third dim
        # Replicate) and placements on the 1-D submesh: the result of sharding
        # propagation with the shortcut (output placements, shape and
        # stride, collectives, or the error) equals that of the full expansion
        meshes = [self.mesh, self.mesh["b", "c"], self.mesh["c"]]
        original = single_dim_strategy._strategy_keeping_inputs
        taken_flag: list[int] = []

        def counting(*args, **kwargs):
            result = original(*args, **kwargs)
            if result is not None:
                taken_flag.append(1)
            return result

        taken = 0
        cases = 0
        for name, (n_inputs, fn) in OPS.items():
            for mesh in meshes:
                per_input = [
                    p
                    for p in itertools.product(PLACEMENTS, repeat=min(mesh.ndim, 2))
                    if len({q for q in p if isinstance(q, Partial)}) <= 1
                ]
                for combo in per_input[:: 5 if n_inputs == 2 else 2]:
                    placements = list(combo) + [Replicate()] * (mesh.ndim - len(combo))
                    # second input: Replicate on the first mesh dim, as the first
                    inputs = [placements] + [
                        [Replicate(), *placements[1:]] if mesh.ndim > 1 else placements
                    ] * (n_inputs - 1)
                    taken_flag.clear()
                    with mock.patch.object(
                        single_dim_strategy, "_strategy_keeping_inputs", counting
                    ):
                        with_shortcut = self._run(fn, mesh, inputs)
                    taken += bool(taken_flag)
                    with mock.patch.object(
                        sharding_prop,
                        "_expand_single_dim_strategy_to_mesh",
                        _full_expansion_only,
                    ):
                        full = self._run(fn, mesh, inputs)
                    cases += 1
                    self.assertEqual(
                        with_shortcut, full, msg=f"{name} {mesh.shape} {inputs}"
                    )
        # the shortcut was taken in a good share of the cases
        self.assertGreater(taken, cases // 4)


if __name__ == "__main__":
    run_tests()
