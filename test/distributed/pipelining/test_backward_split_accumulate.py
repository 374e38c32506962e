# Owner(s): ["oncall: distributed"]
"""The weight backward of the dX/dW split (stage_backward_weight) accumulates
gradients through the parameters' AccumulateGrad nodes, as a fused backward does:
``.grad`` never aliases another tensor or another parameter's gradient, follows
the layout contract, post-accumulate-grad hooks fire, and ``param_groups`` can be
used again after a call with ``retain_graph=True``."""

import torch
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)
from torch.testing._internal.common_utils import TestCase, run_tests

from test_backward_split_grouping import (  # the test file of the grouping PR
    DIM,
    make_params,
    clone_params,
    split_backward,
    MatchesFusedMixin,
)


class StageBackwardSplitAccumulateTests(MatchesFusedMixin, TestCase):
    # 5. .grad aliasing
    def test_param_joining_two_groups(self):
        """Needs the grouping of the previous change too: ``p[0]`` and ``p[1]``
        receive one gradient tensor from the same add."""
        self.check_matches_fused(
            lambda x, p: [torch.tanh((x + (p[0] + p[2])) + (p[1] + p[2]))], 3
        )

    def test_weights_summed_before_use(self):
        self.check_matches_fused(lambda x, p: [x @ (p[0] + p[1])], 2, n_microbatches=3)

    def test_gradients_are_not_aliased(self):
        params = make_params(1)
        kept = []
        for _ in range(2):
            x = torch.randn(DIM, DIM, dtype=torch.float64, requires_grad=True)
            grad = torch.randn(DIM, DIM, dtype=torch.float64)
            dinputs, _ = split_backward([x + params[0]], [grad], [x], params)
            kept += [(grad, grad.clone()), (dinputs[0], dinputs[0].clone())]
        for tensor, value in kept:
            self.assertEqual(tensor, value, atol=0, rtol=0)
        for tensor, _ in kept:
            self.assertNotEqual(tensor.data_ptr(), params[0].grad.data_ptr())

    def test_expanded_gradient(self):
        self.check_matches_fused(lambda x, p: [(x + p[0]).sum()], 1, loss=True)

    # 6. AccumulateGrad semantics
    def test_post_accumulate_grad_hook_and_layout(self):
        (w,) = make_params(1, shape=(DIM, 1))
        (ref,) = clone_params([w])
        calls = []
        w.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.clone()))
        x = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
        grad = torch.randn(3, DIM, dtype=torch.float64)
        (x.detach() @ ref.t()).backward(grad)
        _, returned = split_backward([x @ w.t()], [grad], [x], [w])
        self.assertEqual(len(calls), 1)
        torch.testing.assert_close(calls[0], ref.grad)
        self.assertEqual(w.grad.stride(), ref.grad.stride())
        self.assertIs(returned[0], w.grad)

    def test_param_groups_reusable_with_retain_graph(self):
        params = make_params(2)
        x = torch.randn(DIM, DIM, dtype=torch.float64, requires_grad=True)
        grad = torch.randn(DIM, DIM, dtype=torch.float64)
        _, groups = stage_backward_input(
            [x @ params[0] @ params[1]], [grad], [x], iter(params)
        )
        stage_backward_weight(iter(params), groups, retain_graph=True)
        once = [p.grad.clone() for p in params]
        stage_backward_weight(iter(params), groups, retain_graph=True)
        for param, grad_once in zip(params, once, strict=True):
            torch.testing.assert_close(param.grad, 2 * grad_once)
        stage_backward_weight(iter(params), groups)
        with self.assertRaisesRegex(RuntimeError, "retain_graph=True"):
            stage_backward_weight(iter(params), groups)


if __name__ == "__main__":
    run_tests()
