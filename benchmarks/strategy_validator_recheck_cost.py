"""CPU time of the strategy validator's float64 recheck (0040): compare_operator
(incorrect-only, the sweep's mode) on mm, bmm, addmm, add and sum, float32 and bfloat16,
2 samples each, 2 ranks, 2 rounds after a warm-up. Plain python gives stock; under the
overlay each round runs three variants in turn: "on" (the whole recheck), "no-exact" (the
exact contraction check stubbed) and "off" (the recheck stubbed).

    python benchmarks/strategy_validator_recheck_cost.py
    python -m tools.cli run -- python benchmarks/strategy_validator_recheck_cost.py

(From review rev25c's cost.py, with the "no-exact" variant added.)
"""

import time
import warnings

import torch
import torch.distributed.tensor._ops.strategy_validation as sv

warnings.filterwarnings("ignore")

OPS = ["mm", "bmm", "addmm", "add", "sum"]
DTYPES = [torch.float32, torch.bfloat16]
overlay = hasattr(sv, "_float64_mismatch")
real = getattr(sv, "_float64_mismatch", None)
real_key = getattr(sv, "_exact_contraction_key", None)
calls = {"n": 0}


def counting(*a, **k):
    calls["n"] += 1
    return real(*a, **k)


def run(variant):
    if overlay:
        sv._float64_mismatch = counting if variant != "off" else (lambda *a, **k: "")
        if real_key is not None:
            sv._exact_contraction_key = real_key if variant == "on" else (lambda op: None)
    t0 = time.process_time()
    n_incorrect = 0
    import contextlib
    import io

    for op in OPS:
        for dt in DTYPES:
            with contextlib.redirect_stdout(io.StringIO()):
                s = sv.compare_operator(
                    op, dtype=dt, world_size=2, max_samples=2, incorrect_only=True
                )
            n_incorrect += len(s.false_positives)
    return time.process_time() - t0, n_incorrect


import torch.distributed as dist  # noqa: E402

dist.init_process_group("fake", rank=0, world_size=2)

variants = ["on", "no-exact", "off"] if overlay else ["stock"]
totals = {v: [] for v in variants}
run(variants[0])  # warm-up (imports, OpInfo database)
for rnd in range(2):
    for v in variants:
        calls["n"] = 0
        t, n = run(v)
        totals[v].append(t)
        print(
            f"round {rnd} {v}: cpu {t:.1f} s, incorrect {n}, recheck calls {calls['n']}", flush=True
        )
for v, ts in totals.items():
    print(f"{v}: mean cpu {sum(ts) / len(ts):.1f} s")
