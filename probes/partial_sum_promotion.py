"""Probe: ops whose sharding rule passes an integer or bool Partial("sum") through.

c10d sums an integer Partial("sum") in its own dtype (wrapping) and a bool one
saturating (logical or). An op that computes in another dtype (int8 ``sum()`` in
int64, ``x * 0.5`` in float32, true division) gives the value of the op on the
reduced tensor only if it reduces first. For every op x dtype x world size this
compares the DTensor result with the op on the reduced plain tensor.

Ranks are simulated with LocalTensorMode over the fake process group.

    python probes/partial_sum_promotion.py [--world-size N] [--json]
        stock torch
    python -m tools.cli run -- python probes/partial_sum_promotion.py
        with the overlay

Prints one line per case: op, dtype, verdict (ok / WRONG / ERROR / n/a: the op
raises on the plain tensor too), collectives, output placement.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import DTensor, Partial, Replicate, init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float32,
]

# Per-rank 2x2 values that wrap (or saturate) when summed in the dtype.
BIG = {
    torch.int8: (100, 70),
    torch.uint8: (200, 100),
    torch.int16: (30000, 20000),
    torch.int32: (2**31 - 1, 2**30 + 3),
    torch.int64: (2**62, 2**24 + 1),
    torch.float32: (1.5, -2.25),  # control: nothing wraps
}


def rank_values(dtype, rank):
    if dtype == torch.bool:
        return torch.tensor([[True, rank == 0], [rank == 1, rank % 2 == 0]])
    a, b = BIG[dtype]
    return torch.tensor([[a, b], [rank + 1, 3 - rank]], dtype=dtype)


def other_values(dtype):
    if dtype == torch.bool:
        return torch.tensor([[True, False], [True, True]])
    if dtype.is_floating_point:
        return torch.tensor([[1.5, 2.0], [0.25, 3.0]], dtype=dtype)
    return torch.tensor([[1, 2], [3, 1]], dtype=dtype)


def _powsum(t):
    return torch.ops.aten.linalg__powsum.default(t, 1.0)


# name -> (fn(x, env), uses) where env gives R (Replicate) and P (another Partial)
OPS = {
    "sum": lambda x, e: x.sum(),
    "sum.dim": lambda x, e: x.sum(1),
    "sum(dtype=i32)": lambda x, e: x.sum(dtype=torch.int32),
    "sum(dtype=f32)": lambda x, e: x.sum(dtype=torch.float32),
    "sum.dim(dtype=f64)": lambda x, e: x.sum(1, dtype=torch.float64),
    "prims.sum": lambda x, e: torch.ops.prims.sum.default(x, [0]),
    "cumsum": lambda x, e: x.cumsum(0),
    "cumsum(dtype=f32)": lambda x, e: x.cumsum(0, dtype=torch.float32),
    "mean(dtype=f32)": lambda x, e: x.mean(dtype=torch.float32),
    "mul(2)": lambda x, e: x * 2,
    "mul(True)": lambda x, e: x * True,
    "mul(0.5)": lambda x, e: x * 0.5,
    "mul(R same)": lambda x, e: x * e["R_same"],
    "mul(R i32)": lambda x, e: x * e["R_i32"],
    "mul(R f32)": lambda x, e: x * e["R_f32"],
    "mul(R f32 0-dim)": lambda x, e: x * e["R_f32_0d"],
    "mul_(2)": lambda x, e: x.clone().mul_(2),
    "div(2)": lambda x, e: x / 2,
    "div(R f32)": lambda x, e: x / e["R_f32"],
    "add(P same)": lambda x, e: x + e["P_same"],
    "add(P i32)": lambda x, e: x + e["P_i32"],
    "add(P f32)": lambda x, e: x + e["P_f32"],
    "sub(P i32)": lambda x, e: x - e["P_i32"],
    "neg": lambda x, e: -x,
    "xlog1py(R f32)": lambda x, e: torch.special.xlog1py(x, e["R_f32"]),
    "_foreach_mul(2)": lambda x, e: torch._foreach_mul([x], 2)[0],
    "_foreach_mul(0.5)": lambda x, e: torch._foreach_mul([x], 0.5)[0],
    "_foreach_mul([0.5])": lambda x, e: torch._foreach_mul([x], [0.5])[0],
    "_foreach_mul(R f32 list)": lambda x, e: torch._foreach_mul([x], [e["R_f32"]])[0],
    "_foreach_mul(R f32 0-dim)": lambda x, e: torch._foreach_mul([x], e["R_f32_0d"])[0],
    "_foreach_div(2)": lambda x, e: torch._foreach_div([x], 2)[0],
    "_foreach_add(P i32 list)": lambda x, e: torch._foreach_add([x], [e["P_i32"]])[0],
    "mm(R same)": lambda x, e: x @ e["R_same"],
    "einsum(R same)": lambda x, e: torch.einsum("ij,jk->ik", x, e["R_same"]),
    "trace": lambda x, e: torch.trace(x),
    "vector_norm(1, dtype=f32)": lambda x, e: torch.linalg.vector_norm(x, 1, dtype=torch.float32),
    "_powsum": lambda x, e: _powsum(x),
}


def p_i32(rank):
    return torch.tensor([[2**31 - 5, rank], [1, 2]], dtype=torch.int32)


def p_f32(rank):
    return torch.tensor([[0.5, rank], [1.0, 2.0]])


def reduced(dtype, world_size):
    # c10d's sum: in the dtype (wrapping), saturating for bool (operator.add is or)
    return functools.reduce(operator.add, [rank_values(dtype, r) for r in range(world_size)])


def same_value(a, b, exact):
    """Exact for integer and bool inputs (a wrong value there is a different
    number); floating inputs may round differently when summed in another order."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if exact:
        return torch.equal(a, b) or (
            a.dtype.is_floating_point
            and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a[~a.isnan()], b[~b.isnan()])
        )
    return torch.allclose(a, b, rtol=1e-6, equal_nan=True)


def probe(world_size):
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    mode = LocalTensorMode(frozenset(range(world_size)))
    ranks = range(world_size)

    def dt_of(per_rank, placement):
        local = LocalTensor({r: per_rank(r) for r in ranks})
        with mode:
            return DTensor.from_local(local, mesh, [placement], run_check=False)

    rows = []
    for dtype in DTYPES:
        x_plain = reduced(dtype, world_size)
        plain_env = {
            "R_same": other_values(dtype),
            "R_i32": other_values(torch.int32),
            "R_f32": other_values(torch.float32),
            "R_f32_0d": torch.tensor(0.5),
            "P_same": reduced(dtype, world_size).flip(0),
            "P_i32": functools.reduce(operator.add, [p_i32(r) for r in ranks]),
            "P_f32": functools.reduce(operator.add, [p_f32(r) for r in ranks]),
        }
        for name, fn in OPS.items():
            try:
                truth = fn(x_plain.clone(), plain_env)
            except Exception as exc:  # the op does not take this dtype
                rows.append((name, dtype, "n/a", None, type(exc).__name__))
                continue
            env = {
                "R_same": dt_of(lambda r, d=dtype: other_values(d), Replicate()),
                "R_i32": dt_of(lambda r: other_values(torch.int32), Replicate()),
                "R_f32": dt_of(lambda r: other_values(torch.float32), Replicate()),
                "R_f32_0d": dt_of(lambda r: torch.tensor(0.5), Replicate()),
                "P_same": dt_of(lambda r, d=dtype: rank_values(d, r).flip(0), Partial("sum")),
                "P_i32": dt_of(p_i32, Partial("sum")),
                "P_f32": dt_of(p_f32, Partial("sum")),
            }
            x = dt_of(lambda r, d=dtype: rank_values(d, r), Partial("sum"))
            comm = CommDebugMode()
            try:
                with mode:
                    with comm:
                        out = fn(x, env)
                    placement = str(out.placements[0])
                    full = out.full_tensor()
                value = full.reconcile()
            except Exception as exc:
                rows.append((name, dtype, "ERROR", None, f"{type(exc).__name__}: {exc}"[:80]))
                continue
            verdict = "ok" if same_value(value, truth, not dtype.is_floating_point) else "WRONG"
            detail = "" if verdict == "ok" else f"{value.tolist()} vs {truth.tolist()}"
            rows.append((name, dtype, verdict, comm.get_total_counts(), placement + " " + detail))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = probe(args.world_size)
    if args.json:
        print(json.dumps([[n, str(d).split(".")[-1], v, c] for n, d, v, c, _ in rows]))
        return
    for name, dtype, verdict, comms, detail in rows:
        print(f"{name:28s} {str(dtype).split('.')[-1]:6s} {verdict:5s} {comms!s:4s} {detail}")


if __name__ == "__main__":
    main()
