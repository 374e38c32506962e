"""Review rev25b findings, one line per (finding, world size): the wrong rule and, where
there is one, the right rule of the same sample (does stock see the difference?).

  .venv/bin/python review/rev25b/findings.py                          # stock
  .venv/bin/python -m tools.cli run -- .venv/bin/python review/rev25b/findings.py   # overlay

Samples are the corpus builders (tools/mutations.py, review3-*)."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, "/work/wt-rev25b")
from harness import run_cases  # noqa: E402

from tools import mutations as M  # noqa: E402

RIGHT = {  # a right rule on the same sample, as a control of stock's signal
    "review3-addfloor-sum-sum": (("P(sum)", "P(sum)"), ("P(sum)",)),
    "review3-sumcancel-sum-avg": (("P(sum)",), ("P(sum)",)),
    "review3-signnorm-n2-r": (("S(0)",), ("S(0)",)),
    "review3-gt0norm-n2-r": (("S(0)",), ("S(0)",)),
    "review3-negnorminf-ninf-ninf": (("S(0)",), ("S(0)",)),
    "review3-addnorminfvalue-n2-n2": (("S(0)", "S(0)"), ("S(0)",)),
    "review3-gcd17-product-product": (("S(0)", "S(0)"), ("S(0)",)),
    "review3-boolclone-sum-avg": (("P(sum)",), ("P(sum)",)),
    "review3-boolamax-max-avg": (("P(max)",), ("P(max)",)),
    "review3-booleq0-min-avg": (("P(min)",), ("P(sum)",)),
    "review3-bf16f32add-sum-sum": (("P(sum)", "P(sum)"), ("P(sum)",)),
    "review3-u8sign-sum-r": (("S(0)",), ("S(0)",)),
}
only = sys.argv[1:]
cases = []
for builder, _family, _dtype, rule, _source in M.REVIEW3:
    if only and builder not in only:
        continue
    func, args, kwargs = M._constructed(builder)
    cases.append((builder + " [wrong]", func, args, kwargs, rule))
    if builder in RIGHT:
        cases.append((builder + " [right]", func, args, kwargs, RIGHT[builder]))

if __name__ == "__main__":
    run_cases(cases)
