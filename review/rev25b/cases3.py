"""Third batch: bool P(avg) outputs, _NormPartial inputs holding inf/nan, bf16 P(sum)
operand with a float32 R operand."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import run_cases  # noqa: E402

aten = torch.ops.aten
g = torch.Generator().manual_seed(3)
flags = torch.rand(6, 6, generator=g) > 0.5
n = torch.rand(12, generator=g) + 0.5
n_inf = n.clone()
n_inf[3] = float("inf")
xb = (torch.rand(4, 4, generator=g) + 2).to(torch.bfloat16)
yf = torch.full((4, 4), 0.05)

cases = [
    ("F6-bool-clone-sum-avg", aten.clone.default, (flags,), {}, (("P(sum)",), ("P(avg)",))),
    ("F6-bool-amax-max-avg", aten.amax.default, (flags, [1]), {}, (("P(max)",), ("P(avg)",))),
    ("F6-bool-eq0-min-avg", aten.eq.Scalar, (flags, 0), {}, (("P(min)",), ("P(avg)",))),
    ("F3b-mul-normp2-inf", aten.mul.Tensor, (n_inf, n_inf), {}, (("_NormP(2)", "R"), ("_NormP(2)",))),
    ("F3b-add-normp2-inf", aten.add.Tensor, (n_inf, n), {}, (("_NormP(2)", "R"), ("_NormP(2)",))),
    ("F3c-add-normp2-int", aten.add.Tensor, (torch.arange(1, 13), torch.arange(1, 13)), {},
     (("_NormP(2)", "R"), ("_NormP(2)",))),
    ("F5b-add-bf16Psum-f32R", aten.add.Tensor, (xb, yf), {}, (("P(sum)", "R"), ("P(sum)",))),
    ("F5b-add-bf16Psum-f32R-right", aten.add.Tensor, (xb, yf), {}, (("P(sum)", "P(sum)"), ("P(sum)",))),
]

if __name__ == "__main__":
    run_cases(cases)
