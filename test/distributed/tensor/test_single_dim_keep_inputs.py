# Owner(s): ["oncall: distributed"]
"""Sharding propagation of a single-dim rule takes the strategy that keeps every input
as it is, without expanding every combination of rules over the mesh dims, when the
inputs match a rule on every mesh dim: the minimum-cost selection picks that strategy
from the full expansion anyway."""

import dataclasses
import itertools
from unittest import mock

import torch
import torch.distributed.tensor._ops.single_dim_strategy as single_dim_strategy
import torch.distributed.tensor._sharding_prop as sharding_prop
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
    _ShardingPlaceholder,
    _SingleDimStrategyInfo,
)
from torch.distributed.tensor.debug import _clear_sharding_prop_cache, CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase

from test_single_dim_partial_placeholder import (  # the test file of the placeholder PR
    FakeMeshMixin,
)

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


def _clone_rules():
    return DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[
        aten.clone.default
    ]


def _full_expansion_only(*args, **kwargs):
    kwargs["inputs_as_they_are_if_matched"] = False
    return _expand_single_dim_strategy_to_mesh(*args, **kwargs)


def _full_expansion_everywhere(*args, **kwargs):
    # every shortcut keyword that sharding propagation passes, turned off
    for shortcut in ("inputs_as_they_are_if_matched", "leave_out_unreachable_partials"):
        if shortcut in kwargs:
            kwargs[shortcut] = False
    return _expand_single_dim_strategy_to_mesh(*args, **kwargs)


class RunOpMixin(FakeMeshMixin):
    """FakeMeshMixin with DTensor inputs and the outcome of an op on them, for
    the tests that compare sharding propagation with and without a shortcut
    (the test file of the unreachable-Partial PR imports it from here)."""

    def make_dtensor(self, mesh, placements, dtype=torch.float32, full=None):
        """Rank 0's shard of ``full`` (an (8, 8) arange + 1 by default)."""
        if full is None:
            full = torch.arange(64).reshape(8, 8) + 1
        local = full
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Shard):
                local = local.tensor_split(mesh.size(mesh_dim), p.dim)[0]
        return DTensor.from_local(
            local.to(dtype),
            mesh,
            placements,
            run_check=False,
            shape=full.shape,
            stride=full.stride(),
        )

    def run_op(
        self, fn, mesh, input_placements, dtype=torch.float32, full=None, values=True
    ):
        """Output placements, shapes, strides and local values (unless not
        ``values``: uninitialized outputs), and the collectives, or the error,
        of fn on fresh inputs from empty caches."""
        _clear_sharding_prop_cache()
        xs = [self.make_dtensor(mesh, p, dtype, full) for p in input_placements]
        try:
            with CommDebugMode() as comm_mode:
                out = fn(*xs)
        except Exception as e:
            return type(e).__name__, str(e)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return (
            [
                (o.placements, o.shape, o.stride(), o.to_local() if values else None)
                for o in outs
            ],
            comm_mode.get_comm_counts(),
        )


class TestKeepInputsIfMatched(RunOpMixin, TestCase):
    def _expand(self, placements, rules, keep_inputs, op=aten.clone.default):
        _, strategy = self.expand_rules(
            placements, rules, op=op, inputs_as_they_are_if_matched=keep_inputs
        )
        return strategy.strategies

    def _assert_full_expansion_taken(self, placements, rules, count):
        full = self._expand(placements, rules, keep_inputs=False)
        kept = self._expand(placements, rules, keep_inputs=True)
        self.assertEqual(len(full), count)
        self.assertEqual(kept, full)

    def test_one_strategy_when_the_inputs_match(self):
        placements = (Shard(0), Replicate(), Partial())
        full = self._expand(placements, _clone_rules(), keep_inputs=False)
        (kept,) = self._expand(placements, _clone_rules(), keep_inputs=True)
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
        self._assert_full_expansion_taken(placements, rules, 27)

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
        x = self.make_dtensor(self.mesh, [Shard(0), Replicate(), Partial()])
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

    def test_a_filtered_combination_takes_the_full_expansion(self):
        # the op's filter drops the combination that keeps the input: the
        # shortcut gets an empty expansion and leaves the pick to the full one
        placements = (Shard(0), Replicate(), Partial())

        def drop_the_inputs_as_they_are(mesh, op_schema, input_specs, output_specs):
            return input_specs[0].placements != placements

        rules = dataclasses.replace(
            _clone_rules(), full_mesh_strategy_filter=drop_the_inputs_as_they_are
        )
        self._assert_full_expansion_taken(placements, rules, 198)

    def test_an_in_place_op_whose_rule_changes_self_raises_as_before(self):
        # the rule that takes self gives another output: the in-place filter
        # drops it, the shortcut gets an empty expansion, and the full
        # expansion raises the in-place error
        rules = _SingleDimStrategyInfo(
            lambda op, args, kwargs: [[Replicate(), Shard(0)]]
        )
        placements = (Shard(0), Replicate(), Replicate())
        errors = []
        for keep_inputs in (False, True):
            with self.assertRaisesRegex(RuntimeError, "in-place operations") as cm:
                self._expand(placements, rules, keep_inputs, op=aten.zero_.default)
            errors.append(str(cm.exception))
        self.assertEqual(errors[0], errors[1])

    def test_an_error_of_the_matched_combination_is_not_caught(self):
        # an error in a rule's filter (or cost) is raised from the matched
        # combination, not hidden by running the full expansion after it
        calls = []

        def broken_filter(mesh, op_schema, input_specs, output_specs):
            calls.append(input_specs[0].placements)
            raise RuntimeError("broken filter")

        rules = dataclasses.replace(
            _clone_rules(), full_mesh_strategy_filter=broken_filter
        )
        placements = (Shard(0), Replicate(), Partial())
        with self.assertRaisesRegex(RuntimeError, "broken filter"):
            self._expand(placements, rules, keep_inputs=True)
        self.assertEqual(calls, [placements])

    def test_costs_of_ops_with_shape_args_are_never_negative(self):
        # The shortcut relies on _select_min_cost_strategy taking a zero-cost
        # strategy that keeps the inputs when no strategy costs less than 0;
        # its comment expects negative costs for the ops whose shape args
        # sharding propagation rewrites (op_to_shape_and_stride_idx). For each
        # of them with a single-dim rule: every strategy of the full expansion
        # costs >= 0, and the shortcut gives the same result.
        propagator = DTensor._op_dispatcher.sharding_propagator
        grad_1d = torch.arange(2 * 4 * 8.0).reshape(2, 4, 8)
        grad_2d = torch.arange(2 * 4 * 8 * 8.0).reshape(2, 4, 8, 8)
        grad_3d = torch.arange(2 * 4 * 4 * 4 * 4.0).reshape(2, 4, 4, 4, 4)
        sizes_1d, sizes_2d, sizes_3d = [2, 4, 4], [2, 4, 4, 4], [2, 4, 2, 2, 2]
        cases = {
            aten.new_empty.default: (None, lambda x: aten.new_empty(x, [8, 8])),
            aten.new_full.default: (None, lambda x: aten.new_full(x, [8, 8], 2.0)),
            aten.new_ones.default: (None, lambda x: aten.new_ones(x, [8, 8])),
            aten.new_zeros.default: (None, lambda x: aten.new_zeros(x, [8, 8])),
            aten.new_empty_strided.default: (
                None,
                lambda x: aten.new_empty_strided(x, [8, 8], [8, 1]),
            ),
            aten.select_backward.default: (
                torch.arange(8.0 * 4).reshape(8, 4),
                lambda g: aten.select_backward(g, [8, 8, 4], 1, 2),
            ),
            aten.slice_backward.default: (
                None,
                lambda g: aten.slice_backward(g, [8, 16], 1, 8, 16, 1),
            ),
            aten.upsample_nearest1d_backward.default: (
                grad_1d,
                lambda g: aten.upsample_nearest1d_backward(g, [8], sizes_1d),
            ),
            aten._upsample_nearest_exact1d_backward.default: (
                grad_1d,
                lambda g: aten._upsample_nearest_exact1d_backward(g, [8], sizes_1d),
            ),
            aten.upsample_linear1d_backward.default: (
                grad_1d,
                lambda g: aten.upsample_linear1d_backward(g, [8], sizes_1d, False),
            ),
            aten.upsample_nearest2d_backward.default: (
                grad_2d,
                lambda g: aten.upsample_nearest2d_backward(g, [8, 8], sizes_2d),
            ),
            aten._upsample_nearest_exact2d_backward.default: (
                grad_2d,
                lambda g: aten._upsample_nearest_exact2d_backward(g, [8, 8], sizes_2d),
            ),
            aten.upsample_bilinear2d_backward.default: (
                grad_2d,
                lambda g: aten.upsample_bilinear2d_backward(g, [8, 8], sizes_2d, False),
            ),
            aten.upsample_bicubic2d_backward.default: (
                grad_2d,
                lambda g: aten.upsample_bicubic2d_backward(g, [8, 8], sizes_2d, False),
            ),
            aten._upsample_bilinear2d_aa_backward.default: (
                grad_2d,
                lambda g: aten._upsample_bilinear2d_aa_backward(
                    g, [8, 8], sizes_2d, False
                ),
            ),
            aten._upsample_bicubic2d_aa_backward.default: (
                grad_2d,
                lambda g: aten._upsample_bicubic2d_aa_backward(
                    g, [8, 8], sizes_2d, False
                ),
            ),
            aten._upsample_lanczos2d_aa_backward.default: (
                grad_2d,
                lambda g: aten._upsample_lanczos2d_aa_backward(
                    g, [8, 8], sizes_2d, False
                ),
            ),
            aten.upsample_nearest3d_backward.default: (
                grad_3d,
                lambda g: aten.upsample_nearest3d_backward(g, [4, 4, 4], sizes_3d),
            ),
            aten._upsample_nearest_exact3d_backward.default: (
                grad_3d,
                lambda g: aten._upsample_nearest_exact3d_backward(
                    g, [4, 4, 4], sizes_3d
                ),
            ),
            aten.upsample_trilinear3d_backward.default: (
                grad_3d,
                lambda g: aten.upsample_trilinear3d_backward(
                    g, [4, 4, 4], sizes_3d, False
                ),
            ),
        }
        shape_ops = [
            op
            for op in propagator.op_to_shape_and_stride_idx
            if op in propagator.op_single_dim_strategy_funcs
        ]
        # every such op is covered above
        self.assertEqual(sorted(map(str, shape_ops)), sorted(map(str, cases)))
        costs = []
        original_select = sharding_prop._select_min_cost_strategy

        def recording_select(strategy, op_schema=None):
            for op_spec in strategy.strategies:
                costs.extend(c for cs in op_spec.redistribute_cost for c in cs)
            return original_select(strategy, op_schema)

        mesh = self.mesh["b", "c"]
        placements = [Replicate(), Shard(0), Shard(1), Partial(), Partial("max")]
        for op, (full, fn) in cases.items():
            for combo in itertools.product(placements, repeat=2):
                if len({p for p in combo if isinstance(p, Partial)}) > 1:
                    continue
                # (new_empty and new_empty_strided: no values to compare)
                values = "empty" not in str(op)
                with_shortcut = self.run_op(
                    fn, mesh, [list(combo)], full=full, values=values
                )
                costs.clear()
                with (
                    mock.patch.object(
                        sharding_prop,
                        "_expand_single_dim_strategy_to_mesh",
                        _full_expansion_only,
                    ),
                    mock.patch.object(
                        sharding_prop, "_select_min_cost_strategy", recording_select
                    ),
                ):
                    full_result = self.run_op(
                        fn, mesh, [list(combo)], full=full, values=values
                    )
                msg = f"{op} {combo}"
                self.assertGreater(len(costs), 0, msg=msg)
                self.assertGreaterEqual(min(costs), 0.0, msg=msg)
                self.assertEqual(with_shortcut, full_result, msg=msg)

    def test_foreach_ops_take_the_full_expansion(self):
        # each element of a foreach op is selected without the op schema, so
        # no shortcut may shorten its strategy list: every element sees as
        # many strategies as the full expansion of its per-element op
        p = [Shard(0), Replicate(), Partial()]
        r = [Shard(0), Replicate(), Replicate()]
        ops = {
            # name: foreach call, its per-element op, input placements
            "_foreach_add": (
                lambda x, y: torch._foreach_add([x, x], [y, y]),
                lambda x, y: x + y,
                [p, p],
            ),
            "_foreach_mul": (
                lambda x, y: torch._foreach_mul([x, x], [y, y]),
                lambda x, y: x * y,
                [p, r],
            ),
            "_foreach_neg": (lambda x: torch._foreach_neg([x, x]), torch.neg, [p]),
        }

        select = sharding_prop._select_min_cost_strategy

        def sizes_of(
            fn, placements, with_schema, expand=_expand_single_dim_strategy_to_mesh
        ):
            sizes = []

            def recording(strategy, op_schema=None):
                if (op_schema is not None) == with_schema:
                    sizes.append(len(strategy.strategies))
                return select(strategy, op_schema)

            with (
                mock.patch.object(
                    sharding_prop, "_expand_single_dim_strategy_to_mesh", expand
                ),
                mock.patch.object(
                    sharding_prop, "_select_min_cost_strategy", recording
                ),
            ):
                self.run_op(fn, self.mesh, placements)
            return sizes

        for name, (foreach_fn, element_fn, placements) in ops.items():
            with self.subTest(name):
                per_element = sizes_of(foreach_fn, placements, with_schema=False)
                (full,) = sizes_of(
                    element_fn, placements, True, _full_expansion_everywhere
                )
                (kept,) = sizes_of(element_fn, placements, True)
                self.assertEqual(per_element, [full, full])
                # the inputs match a rule: the op's own call takes the shortcut
                self.assertEqual(kept, 1)

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
                        with_shortcut = self.run_op(fn, mesh, inputs)
                    taken += bool(taken_flag)
                    with mock.patch.object(
                        sharding_prop,
                        "_expand_single_dim_strategy_to_mesh",
                        _full_expansion_only,
                    ):
                        full = self.run_op(fn, mesh, inputs)
                    cases += 1
                    self.assertEqual(
                        with_shortcut, full, msg=f"{name} {mesh.shape} {inputs}"
                    )
        # the shortcut was taken in a good share of the cases
        self.assertGreater(taken, cases // 4)


if __name__ == "__main__":
    run_tests()
