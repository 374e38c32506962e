"""Probe: out= of another dtype, and multi-input ops that cast their inputs
(cat, stack, slice_scatter, index_fill), on Partial DTensors.

A pointwise op computes in the promoted dtype and casts into out's dtype; cat and
stack promote their inputs; slice_scatter and index_fill cast their src/value
into self's dtype. A pending reduction survives only where those casts commute
with it. For every op x dtype combination this compares the DTensor result with
the op on the reduced plain tensors.

Ranks are simulated with LocalTensorMode over the fake process group.

    python probes/partial_out_and_cat_promotion.py [--world-size N] [--only REGEX]
        stock torch
    python -m tools.cli run -- python probes/partial_out_and_cat_promotion.py
        with the overlay

Prints one line per case: case, verdict (ok / WRONG / ERROR; cases the plain op
rejects are skipped), collectives, output placement; then a count line.
"""

from __future__ import annotations

import argparse
import functools
import operator
import re

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
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def short(dtype):
    return {
        torch.int8: "i8",
        torch.uint8: "u8",
        torch.int16: "i16",
        torch.int32: "i32",
        torch.int64: "i64",
        torch.bool: "b",
        torch.float16: "f16",
        torch.bfloat16: "bf16",
        torch.float32: "f32",
        torch.float64: "f64",
    }[dtype]


def partial_values(dtype, rank, zero_dim=False, which=0):
    """Per-rank values whose sum wraps (integers) or saturates (bool); floating
    values are exact in every floating dtype (no rounding noise)."""
    if dtype == torch.bool:
        v = [True, rank == 0, rank == 1]
    elif dtype.is_floating_point:
        v = [[1.5, 2.0, -3.0], [0.25, -1.0, 2.0]][rank % 2]
    elif dtype == torch.uint8:
        v = [[200, 3, 1], [100, 1, 2]][rank % 2]
    else:
        top = torch.iinfo(dtype).max - 1 - which
        v = [top, 3 + rank, -rank]
    t = torch.tensor(v, dtype=dtype)
    return t[0] if zero_dim else t


def replicate_values(dtype, zero_dim=False):
    if dtype == torch.bool:
        v = [True, False, True]
    elif dtype.is_floating_point:
        v = [2.0, 0.5, -1.0]
    elif dtype == torch.uint8:
        v = [2, 250, 1]
    else:
        v = [2, 120, -1]
    t = torch.tensor(v, dtype=dtype)
    return t[0] if zero_dim else t


def reduce_plain(values, reduce_op):
    if reduce_op == "sum":
        return functools.reduce(operator.add, values)
    if reduce_op == "max":
        return functools.reduce(torch.maximum, values)
    raise ValueError(reduce_op)


def same_value(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    if a.is_floating_point():
        return torch.allclose(a.double(), b.double(), rtol=1e-6, atol=0, equal_nan=True)
    return False


def cases():
    """Yields (name, fn, operands); an operand is (kind, reduce_op, dtype, 0-dim)
    with kind "P" (Partial), "R" (Replicate), "E" (an empty Replicate) or "O" (a
    Partial out= buffer of zeros, whose last field is its length, 3 if False)."""
    others = [(d, False) for d in DTYPES] + [(torch.float32, True), (torch.int64, True)]
    for a in DTYPES:
        for b, b0 in others:
            bn = short(b) + ("-0d" if b0 else "")
            for o in DTYPES:
                yield (
                    f"add({short(a)} P, {bn} P, out={short(o)} P)",
                    lambda x, y, out: torch.add(x, y, out=out),
                    [("P", "sum", a, False), ("P", "sum", b, b0), ("O", "sum", o, False)],
                )
                yield (
                    f"mul({short(a)} P, {bn} R, out={short(o)} P)",
                    lambda x, y, out: torch.mul(x, y, out=out),
                    [("P", "sum", a, False), ("R", None, b, b0), ("O", "sum", o, False)],
                )
                yield (
                    f"maximum({short(a)} Pmax, {bn} R, out={short(o)} Pmax)",
                    lambda x, y, out: torch.maximum(x, y, out=out),
                    [("P", "max", a, False), ("R", None, b, b0), ("O", "max", o, False)],
                )
    for a in DTYPES:
        for b in DTYPES:
            pa, pb = ("P", "sum", a, False), ("P", "sum", b, False)
            yield (f"cat([{short(a)} P, {short(b)} P])", lambda *xs: torch.cat(xs), [pa, pb])
            yield (
                f"stack([{short(a)} P, {short(b)} P])",
                lambda *xs: torch.stack(xs),
                [pa, pb],
            )
            yield (
                f"cat([{short(a)} Pmax, {short(b)} Pmax])",
                lambda *xs: torch.cat(xs),
                [("P", "max", a, False), ("P", "max", b, False)],
            )
            yield (
                f"slice_scatter({short(a)} P, {short(b)} P)",
                lambda x, y: torch.slice_scatter(x, y[:2], 0, 0, 2),
                [pa, pb],
            )
            yield (
                f"index_fill({short(a)} P, {short(b)} 0-dim P)",
                lambda x, v: torch.index_fill(x, 0, torch.tensor([1]), v),
                [pa, ("P", "sum", b, True)],
            )
        for b in (torch.int8, torch.int32, torch.bool, torch.float16, torch.float32):
            for o in DTYPES:
                yield (
                    f"cat([{short(a)} P, {short(b)} P], out={short(o)} P)",
                    lambda x, y, out: torch.cat([x, y], out=out),
                    [("P", "sum", a, False), ("P", "sum", b, False), ("O", "sum", o, 6)],
                )
        yield (
            f"cat([{short(a)} P, f64 legacy-empty R])",
            lambda x, e: torch.cat([x, e]),
            [("P", "sum", a, False), ("E", None, torch.float64, False)],
        )


def probe(world_size, only=None):
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    mode = LocalTensorMode(frozenset(range(world_size)))
    ranks = range(world_size)

    def per_rank(operand, rank, which):
        kind, _, dtype, zero_dim = operand
        if kind == "P":
            return partial_values(dtype, rank, zero_dim, which)
        if kind == "R":
            return replicate_values(dtype, zero_dim)
        if kind == "E":
            return torch.empty(0, dtype=dtype)
        return torch.zeros(zero_dim or 3, dtype=dtype)  # an out= buffer

    def plain(operand, which):
        kind, reduce_op, _, _ = operand
        values = [per_rank(operand, r, which) for r in ranks]
        return reduce_plain(values, reduce_op) if kind == "P" else values[0]

    def dtensor(operand, which):
        kind, reduce_op, _, _ = operand
        local = LocalTensor({r: per_rank(operand, r, which) for r in ranks})
        placement = Partial(reduce_op) if kind in ("P", "O") else Replicate()
        with mode:
            return DTensor.from_local(local, mesh, [placement], run_check=False)

    counts = {"ok": 0, "WRONG": 0, "ERROR": 0}
    for name, fn, operands in cases():
        if only and not re.search(only, name):
            continue
        try:
            truth = fn(*[plain(o, i) for i, o in enumerate(operands)])
        except Exception:
            continue  # the plain op rejects these dtypes
        inputs = [dtensor(o, i) for i, o in enumerate(operands)]
        comm = CommDebugMode()
        try:
            with mode:
                with comm:
                    out = fn(*inputs)
                placement = "".join(str(p) for p in out.placements)
                value = out.full_tensor().reconcile()
        except Exception as exc:
            counts["ERROR"] += 1
            msg = str(exc).split("\n")[0][:70]
            print(f"{name:45s} ERROR -    {type(exc).__name__}: {msg}")
            continue
        verdict = "ok" if same_value(value, truth) else "WRONG"
        counts[verdict] += 1
        detail = "" if verdict == "ok" else f" {value.tolist()} vs {truth.tolist()}"
        print(f"{name:45s} {verdict:5s} {comm.get_total_counts()!s:4s} {placement}{detail}")
    print("counts:", counts)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--only", default=None, help="regex on the case name")
    args = parser.parse_args()
    probe(args.world_size, args.only)


if __name__ == "__main__":
    main()
