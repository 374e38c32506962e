# Owner(s): ["oncall: distributed"]
"""The dX/dW split behind the zero-bubble schedules (stage_backward_input, then
stage_backward_weight) groups the parameters so that every parameter lands in
exactly one group and its weight gradient equals a fused backward's: weights
reused across layers, and parameters whose use sites join two groups."""

import gc

import torch
import torch.nn.functional as F
from torch.autograd.graph import get_gradient_edge
from torch.distributed.pipelining._backward import (
    construct_reverse_graph,
    get_param_groups,
    stage_backward_input,
    stage_backward_weight,
)
from torch.testing._internal.common_utils import TestCase, run_tests

DIM = 4


def make_params(n, seed=0, shape=(DIM, DIM)):
    torch.manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(*shape, dtype=torch.float64) * 0.5)
        for _ in range(n)
    ]


def clone_params(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def split_backward(outputs, output_grads, inputs, params):
    dinputs, param_groups = stage_backward_input(
        outputs, output_grads, inputs, iter(params)
    )
    returned = stage_backward_weight(iter(params), param_groups)
    return dinputs, returned


class MatchesFusedMixin:
    """``check_matches_fused`` for the split-backward test files of this
    directory (they import it from here)."""

    def check_matches_fused(self, stage, n_params, n_microbatches=2, loss=False):
        """Run ``stage(x, params) -> outputs`` for several micro-batches through the
        split and through a fused backward; every gradient must match."""
        params = make_params(n_params)
        ref_params = clone_params(params)
        torch.manual_seed(1)
        for _ in range(n_microbatches):
            x = torch.randn(DIM, DIM, dtype=torch.float64, requires_grad=True)
            ref_x = x.detach().clone().requires_grad_()
            outputs = stage(x, params)
            ref_outputs = stage(ref_x, ref_params)
            grads = None if loss else [torch.randn_like(o) for o in ref_outputs]
            torch.autograd.backward(ref_outputs, grads)
            dinputs, _ = split_backward(outputs, grads, [x], params)
            torch.testing.assert_close(dinputs[0], ref_x.grad)
            for param, ref in zip(params, ref_params, strict=True):
                self.assertIs(param.grad is None, ref.grad is None)
                if ref.grad is not None:
                    torch.testing.assert_close(param.grad, ref.grad)
        return params, outputs


class StageBackwardSplitGroupingTests(MatchesFusedMixin, TestCase):
    # 1. a weight reused with another layer in between
    def test_weight_reused_after_another_layer(self):
        self.check_matches_fused(lambda x, p: [x @ p[0] @ p[1] @ p[0]], 2)

    def test_weight_reused_in_one_product(self):
        """The upstream double-count report, fixed in the base: a guard."""
        self.check_matches_fused(lambda x, p: [(x @ p[0] @ p[0]).sum()], 1, loss=True)

    # 2. parameters whose use sites touch two groups
    def test_bias_shared_by_two_linears(self):
        self.check_matches_fused(
            lambda x, p: [torch.tanh(x @ p[0] + p[2][0]) @ p[1] + p[2][0]], 3
        )

    def test_weight_penalty_in_loss(self):
        def stage(x, p):
            out = torch.tanh(x @ p[0]) @ p[1]
            return [
                (out**2).mean() + 1e-2 * (p[0] ** 2).sum() + 1e-2 * (p[1] ** 2).sum()
            ]

        self.check_matches_fused(stage, 2, loss=True)

    def test_layer_norm_weight_reused(self):
        """A guard: right on stock too."""
        self.check_matches_fused(
            lambda x, p: [F.layer_norm(x, (DIM,), p[0][0], p[1][0]) + p[0][0]], 2
        )

    # the groups themselves
    def test_param_groups_are_disjoint_and_deterministic(self):
        """Each parameter lands in exactly one group, and the groups depend only on
        the graph's structure: the same graph built at other addresses gives the
        same groups (on every rank)."""

        def groups_of_fresh_graph(churn):
            junk = [
                torch.empty(1).requires_grad_().view_as(torch.empty(1))
                for _ in range(churn)
            ]
            params = make_params(3)
            x = torch.randn(DIM, DIM, dtype=torch.float64, requires_grad=True)
            out = torch.tanh((x + (params[0] + params[2])) + (params[1] + params[2]))
            edge = get_gradient_edge(out)
            param_nodes = [get_gradient_edge(p).node for p in params]
            groups = get_param_groups(
                [get_gradient_edge(x).node],
                param_nodes,
                construct_reverse_graph([edge.node]),
            )
            del junk
            return [sorted(param_nodes.index(n) for n in g["params"]) for g in groups]

        first = groups_of_fresh_graph(0)
        self.assertEqual(sorted(i for g in first for i in g), [0, 1, 2])
        for churn in range(1, 20):
            self.assertEqual(groups_of_fresh_graph(churn), first)
            gc.collect()

    def test_weight_backward_frees_each_group_on_a_plain_stack(self):
        """Groups that share no node free what they ran, as a fused backward would:
        only a group that starts from more than one node (a reused weight) makes
        W keep the graph for the groups after it."""
        params = make_params(3)
        x = torch.randn(DIM, DIM, dtype=torch.float64, requires_grad=True)
        out = torch.tanh(torch.tanh(torch.tanh(x @ params[0]) @ params[1]) @ params[2])
        _, param_groups = stage_backward_input(
            [out], [torch.ones_like(out)], [x], iter(params)
        )
        self.assertEqual(len(param_groups), 3)
        intermediates = [g["intermediates"][0] for g in param_groups]
        stage_backward_weight(iter(params), param_groups)
        for node in intermediates:
            edge = torch.autograd.graph.GradientEdge(node, 0)
            grad = torch.ones(DIM, DIM, dtype=torch.float64)
            with self.assertRaisesRegex(RuntimeError, "a second time"):
                torch.autograd.grad(edge, params, grad, allow_unused=True)


if __name__ == "__main__":
    run_tests()
