"""Second batch: cancellation in a sum (PR text: 'a wrong placement is off by a multiple
of the values'), bf16 P(sum) operand setting a float32 output's band, fp16."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import run_cases  # noqa: E402

aten = torch.ops.aten


def cancelling(n, scale, total, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g, dtype=torch.float64) * scale
    v = v - v.mean() + total / n
    return v.float()


cases = []
for n, scale, total in ((64, 10, 1e-3), (256, 5, 1e-3), (64, 3, 4e-4), (256, 2, 6e-4)):
    v = cancelling(n, scale, total, 1)
    tag = f"n{n}-s{scale}-t{total}"
    cases += [
        (f"F2-sum-cancel-{tag}", aten.sum.default, (v,), {}, (("P(sum)",), ("P(avg)",))),
        (f"F2-sum-cancel-{tag}-right", aten.sum.default, (v,), {}, (("P(sum)",), ("P(sum)",))),
    ]
g = torch.Generator().manual_seed(2)
xb = torch.randn(4, 4, generator=g).to(torch.bfloat16)
yf = torch.randn(4, 4, generator=g) * 0.05
cases += [
    ("F5-add-bf16Psum-f32R", aten.add.Tensor, (xb, yf), {}, (("P(sum)", "R"), ("P(sum)",))),
    ("F5-add-bf16Psum-f32R-right", aten.add.Tensor, (xb, yf), {}, (("P(sum)", "P(sum)"), ("P(sum)",))),
]
# fp16 version of F1 (median floor)
xh = (torch.full((4, 4), 1000.0) + torch.randn(4, 4, generator=g)).half()
xh[1, 2] = 0.01
yh = (torch.rand(4, 4, generator=g) * 0.5 + 0.5).half()
cases += [
    ("F1h-add-median-floor-fp16", aten.add.Tensor, (xh, yh), {}, (("P(sum)", "R"), ("P(sum)",))),
    ("F1h-add-median-floor-fp16-right", aten.add.Tensor, (xh, yh), {}, (("P(sum)", "P(sum)"), ("P(sum)",))),
]

if __name__ == "__main__":
    run_cases(cases)
