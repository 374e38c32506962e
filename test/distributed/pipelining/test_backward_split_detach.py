# Owner(s): ["oncall: distributed"]
"""The input backward of the dX/dW split (stage_backward_input) does not detach
user tensors in place: outputs that are views, outputs the stage also uses, and
stage inputs or parameters returned as outputs keep working, and the weight
backward still matches a fused backward."""

import torch
from torch.distributed.pipelining._backward import (
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


class StageBackwardSplitDetachTests(TestCase):
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

    # 4. outputs that are views, used inside the stage, or stage inputs
    def test_view_outputs(self):
        self.check_matches_fused(lambda x, p: [torch.tanh(x @ p[0]).view(-1)], 1)
        self.check_matches_fused(
            lambda x, p: list(torch.tanh(x @ p[0]).chunk(2, dim=1)), 1
        )
        self.check_matches_fused(
            lambda x, p: [(x @ p[0]).sum().reshape(())], 1, loss=True
        )

    def test_output_used_inside_stage(self):
        def stage(x, p):
            h1 = torch.tanh(x @ p[0])
            return [h1, h1 @ p[1]]

        _, outputs = self.check_matches_fused(stage, 2)
        self.assertTrue(outputs[0].requires_grad)

    def test_input_returned_as_output(self):
        x = torch.randn(DIM, DIM, dtype=torch.float64, requires_grad=True)
        (w,) = make_params(1)
        grads = [torch.randn(DIM, DIM, dtype=torch.float64) for _ in range(2)]
        dinputs, _ = split_backward([x, x @ w], grads, [x], [w])
        torch.testing.assert_close(dinputs[0], grads[0] + grads[1] @ w.detach().t())
        self.assertTrue(x.requires_grad)

    def test_parameter_returned_as_output(self):
        self.check_matches_fused(lambda x, p: [torch.tanh(x @ p[0]), p[1]], 2)


if __name__ == "__main__":
    run_tests()
