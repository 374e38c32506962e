"""CPU time of the single-dim rules that the integer/bool Partial check touches.

Calls each strategy function directly (no dispatch, no caches), 15 rounds of 500 calls,
and prints the minimum CPU microseconds per call, in this order: sum f32, sum i64,
sum i8, cumsum f32, mul f32*0.5, mul f32*R, mul i64*2, foreach mul i64. Compare the
overlay with and without the change in two runs (`git stash` in torch_overlay/):

    python -m tools.cli run -- python benchmarks/partial_sum_promotion_rule_cost.py

The whole-miss cost is in benchmarks/dtensor_propagation_miss.py (rows sum, cumsum, mean,
x * 0.5, x / 2, int64 x * 2, P + P, _foreach_mul); on a loaded 2-core machine its noise
(+-20 % at 1-D) is far larger than these differences.
"""

import time

import torch
import torch.distributed.tensor._ops._math_ops as mo
import torch.distributed.tensor._ops._pointwise_ops as pw
from torch.distributed.tensor._dtensor_spec import TensorMeta

aten = torch.ops.aten


def meta(dtype, shape=(8, 8)):
    return TensorMeta(torch.Size(shape), (shape[1], 1), dtype)


def main():
    factory = pw._common_pointwise_single_dim_strategy
    list_kw = {"list_op": True} if "list_op" in factory.__code__.co_varnames else {}
    mul_fn = factory(pw._UNARY_LINEAR_RULES + pw._MUL_RULES)
    foreach_fn = factory(pw._UNARY_LINEAR_RULES, **list_kw)
    f32, i64, i8 = torch.float32, torch.int64, torch.int8
    sum_rule, scan_rule = mo.linear_reduction_single_dim_strategy, mo.scan_single_dim_strategy
    cases = {
        "sum f32": lambda: sum_rule(aten.sum.default, (meta(f32),), {}),
        "sum i64": lambda: sum_rule(aten.sum.default, (meta(i64),), {}),
        "sum i8": lambda: sum_rule(aten.sum.default, (meta(i8),), {}),
        "cumsum f32": lambda: scan_rule(aten.cumsum.default, (meta(f32), 1), {}),
        "mul f32*0.5": lambda: mul_fn(aten.mul.Tensor, (meta(f32), 0.5), {}),
        "mul f32*R": lambda: mul_fn(aten.mul.Tensor, (meta(f32), meta(f32)), {}),
        "mul i64*2": lambda: mul_fn(aten.mul.Tensor, (meta(i64), 2), {}),
        "foreach mul i64": lambda: foreach_fn(aten.mul.Scalar, (meta(i64), 2), {}),
    }
    best = {name: float("inf") for name in cases}
    for _ in range(15):
        for name, fn in cases.items():
            for _ in range(50):
                fn()
            start = time.process_time()
            for _ in range(500):
                fn()
            best[name] = min(best[name], (time.process_time() - start) / 500 * 1e6)
    for name, us in best.items():
        print(f"{name:16s} {us:6.2f} us")


if __name__ == "__main__":
    main()
