"""First batch: float32 tolerance (median floor, cancellation), _NormPartial, int product."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import run_cases  # noqa: E402

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)

# F1: most elements large, one small: the P(sum) offsets' floor (median|x|/16) widens
# the small element's band.
x = torch.full((4, 4), 1e6) + torch.randn(4, 4, generator=g)
x[1, 2] = 0.01
y = torch.rand(4, 4, generator=g) * 0.04 + 0.01
# F1b: moderate magnitudes (1e3), error 1e-3-ish
x2 = torch.full((4, 4), 1e3) + torch.randn(4, 4, generator=g)
x2[0, 1] = 0.0
y2 = torch.full((4, 4), 2e-4)
# F2: a sum that cancels: 64 values ~10 summing to 2e-3
v = torch.randn(64, generator=g, dtype=torch.float64) * 10
v = v - v.mean() + 2e-3 / 64
v = v.float()
# F3: _NormPartial inputs
n = torch.rand(12, generator=g) + 0.5
# F4: int64 gcd with primes above 13
a = torch.tensor([[289, 323, 17 * 17 * 19, 361], [17, 19 * 19, 23 * 23, 29 * 29]])
b = torch.tensor([[17, 17, 17, 19], [17, 19, 23, 29]])

cases = [
    ("F1-add-median-floor-1e6", aten.add.Tensor, (x, y), {}, (("P(sum)", "R"), ("P(sum)",))),
    ("F1-add-median-floor-1e6-right", aten.add.Tensor, (x, y), {}, (("P(sum)", "P(sum)"), ("P(sum)",))),
    ("F1b-add-median-floor-1e3", aten.add.Tensor, (x2, y2), {}, (("P(sum)", "R"), ("P(sum)",))),
    ("F1b-add-median-floor-1e3-right", aten.add.Tensor, (x2, y2), {}, (("P(sum)", "P(sum)"), ("P(sum)",))),
    ("F2-sum-cancel-avg", aten.sum.default, (v,), {}, (("P(sum)",), ("P(avg)",))),
    ("F2-sum-cancel-right", aten.sum.default, (v,), {}, (("P(sum)",), ("P(sum)",))),
    ("F3-sign-normp2-R", aten.sign.default, (n,), {}, (("_NormP(2)",), ("R",))),
    ("F3-gt0-normp2-R", aten.gt.Scalar, (n, 0.0), {}, (("_NormP(2)",), ("R",))),
    ("F3-add-normpinf", aten.add.Tensor, (n, n), {}, (("_NormP(inf)", "R"), ("_NormP(inf)",))),
    ("F3-neg-normp1-normp1", aten.neg.default, (n,), {}, (("_NormP(1)",), ("_NormP(1)",))),
    ("F4-gcd-prime17", aten.gcd.default, (a, b), {}, (("P(product)", "R"), ("P(product)",))),
]

if __name__ == "__main__":
    run_cases(cases)
