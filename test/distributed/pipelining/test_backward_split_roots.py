# Owner(s): ["oncall: distributed"]
"""The dX/dW split behind the zero-bubble schedules (stage_backward_input, then
stage_backward_weight) gives every parameter the weight gradient of a fused
backward also where the gradient reaches an output without passing an
input-dependent node: a parameter-only output, a parameter both on the input path
and in an output, and a stage whose inputs do not require grad (integer ids)."""

import torch
import torch.nn.functional as F
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


class StageBackwardSplitRootsTests(TestCase):
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

    def test_parameter_only_output(self):
        self.check_matches_fused(lambda x, p: [torch.tanh(x @ p[0]), p[1] * 1.0], 2)

    def test_parameter_on_input_path_and_output(self):
        self.check_matches_fused(
            lambda x, p: [torch.tanh(x @ p[0] + p[1]), p[1] * 1.0], 2
        )

    def test_inputs_without_grad(self):
        """A stage fed integer ids (an embedding in a non-first stage)."""
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, DIM, dtype=torch.float64)
        lin = torch.nn.Linear(DIM, DIM, dtype=torch.float64)
        params = [*emb.parameters(), *lin.parameters()]
        ref_params = clone_params(params)
        ids = torch.tensor([1, 2, 2, 7])
        grad = torch.randn(4, DIM, dtype=torch.float64)
        ref_out = F.linear(
            F.embedding(ids, ref_params[0]), ref_params[1], ref_params[2]
        )
        ref_out.backward(grad)
        dinputs, _ = split_backward([lin(emb(ids))], [grad], [ids], params)
        self.assertEqual(dinputs, (None,))
        for param, ref in zip(params, ref_params, strict=True):
            torch.testing.assert_close(param.grad, ref.grad)


if __name__ == "__main__":
    run_tests()
