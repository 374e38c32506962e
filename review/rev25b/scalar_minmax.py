"""0-d tensors with a P(min)/P(max) input: right rules on add's scalar sample and on
plain 0-d / 1-element samples, through the CLI's per-sample path."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import run_cases  # noqa: E402

aten = torch.ops.aten
a, b = torch.tensor(-8.4784), torch.tensor(-1.7658)
cases = [
    ("scalar-add-max-R-max (right)", aten.add.Tensor, (a, b), {}, (("P(max)", "R"), ("P(max)",))),
    ("scalar-add-R-min-min (right)", aten.add.Tensor, (a, b), {}, (("R", "P(min)"), ("P(min)",))),
    ("scalar-neg-max-min (right)", aten.neg.default, (a,), {}, (("P(max)",), ("P(min)",))),
    ("scalar-clone-max-max (right)", aten.clone.default, (a,), {}, (("P(max)",), ("P(max)",))),
    ("1elem-clone-max-max (right)", aten.clone.default, (a.reshape(1),), {}, (("P(max)",), ("P(max)",))),
    ("int-scalar-clone-max-max (right)", aten.clone.default, (torch.tensor(5),), {}, (("P(max)",), ("P(max)",))),
    ("scalar-add-max-min-avg (wrong)", aten.add.Tensor, (a, b), {}, (("P(max)", "P(min)"), ("P(avg)",))),
]
if __name__ == "__main__":
    run_cases(cases)
