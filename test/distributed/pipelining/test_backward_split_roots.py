# Owner(s): ["oncall: distributed"]
"""The dX/dW split behind the zero-bubble schedules (stage_backward_input, then
stage_backward_weight) gives every parameter the weight gradient of a fused
backward also where the gradient reaches an output without passing an
input-dependent node: a parameter-only output, a parameter both on the input path
and in an output, and a stage whose inputs do not require grad (integer ids)."""

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

from test_backward_split_grouping import (  # the test file of the grouping PR
    DIM,
    clone_params,
    split_backward,
    MatchesFusedMixin,
)


class StageBackwardSplitRootsTests(MatchesFusedMixin, TestCase):
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
