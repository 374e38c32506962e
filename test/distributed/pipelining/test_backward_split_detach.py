# Owner(s): ["oncall: distributed"]
"""The input backward of the dX/dW split (stage_backward_input) does not detach
user tensors in place: outputs that are views, outputs the stage also uses, and
stage inputs or parameters returned as outputs keep working, and the weight
backward still matches a fused backward."""

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from test_backward_split_grouping import (  # the test file of the grouping PR
    DIM,
    make_params,
    split_backward,
    MatchesFusedMixin,
)


class StageBackwardSplitDetachTests(MatchesFusedMixin, TestCase):
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
