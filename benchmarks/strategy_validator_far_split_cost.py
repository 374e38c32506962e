"""CPU time of the strategy validator's far-split confirmation (the Partial-input PR's
_far_partial_input check, judged in float64 by the comparison PR): compare_operator
(incorrect-only, the sweep's mode) on a dozen ops with Partial rules, float32, bfloat16
and int64, 2 samples each, 2 ranks, 2 rounds after a warm-up. Under the overlay each
round runs "on" (the whole validator) and "off" (the far check stubbed out) in turn;
plain python gives stock. It also lists the rules reported only with the far check (each
must be a wrong rule). ROUNDS=1 WARMUP=0 for a shorter run on a loaded machine.

    python benchmarks/strategy_validator_far_split_cost.py
    python -m tools.cli run -- python benchmarks/strategy_validator_far_split_cost.py
"""

import contextlib
import io
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv

warnings.filterwarnings("ignore")

OPS = [
    "add",
    "mul",
    "sum",
    "mm",
    "clone",
    "clamp",
    "fmod",
    "maximum",
    "amax",
    "prod",
    "cumsum",
    "neg",
]
DTYPES = [torch.float32, torch.bfloat16, torch.int64]
real = getattr(sv, "_far_split_inputs", None)
calls = {"n": 0}
found = {"on": set(), "off": set(), "stock": set()}


def counting(*a, **k):
    r = real(*a, **k)
    calls["n"] += bool(r)
    return r


def run(variant):
    if real is not None:
        sv._far_split_inputs = counting if variant == "on" else (lambda *a, **k: False)
    t0 = time.process_time()
    n_incorrect = 0
    for op in OPS:
        for dt in DTYPES:
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    s = sv.compare_operator(
                        op, dtype=dt, world_size=2, max_samples=2, incorrect_only=True
                    )
                except Exception:
                    continue
            n_incorrect += len(s.false_positives)
            for d in s.false_positives:
                found[variant].add(
                    (
                        op,
                        str(dt)[6:],
                        str(d.aten_op),
                        d.sample_idx,
                        d.input_placements,
                        d.output_placements,
                    )
                )
    return time.process_time() - t0, n_incorrect


dist.init_process_group("fake", rank=0, world_size=2)
variants = ["on", "off"] if real is not None else ["stock"]
if os.environ.get("WARMUP", "1") == "1":
    run(variants[0])  # warm-up
totals = {v: [] for v in variants}
for _ in range(int(os.environ.get("ROUNDS", "2"))):
    for v in variants:
        calls["n"] = 0
        t, n = run(v)
        totals[v].append(t)
        print(f"{v:6s} cpu {t:6.2f} s  incorrect {n}  far checks {calls['n']}", flush=True)
for v in variants:
    print(f"mean {v}: {sum(totals[v]) / len(totals[v]):.2f} s")
if real is not None:
    # Rules reported with the far check and not without it: each must be wrong.
    for row in sorted(found["on"] - found["off"], key=str):
        print("reported only with the far check:", row)
    print(f"reported with / without the far check: {len(found['on'])} / {len(found['off'])}")
