"""F2 grid: sum of a cancelling tensor, wrong P(sum) -> P(avg) vs right P(sum) -> P(sum)."""
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
for n in (64, 256, 1024):
    for scale in (1, 3):
        for total in (2e-4, 5e-4, 1e-3):
            v = cancelling(n, scale, total, 1)
            tag = f"n{n}-s{scale}-t{total}"
            cases += [
                (f"F2-{tag}", aten.sum.default, (v,), {}, (("P(sum)",), ("P(avg)",))),
                (f"F2-{tag}-right", aten.sum.default, (v,), {}, (("P(sum)",), ("P(sum)",))),
            ]

if __name__ == "__main__":
    run_cases(cases, world_sizes=(2,))
