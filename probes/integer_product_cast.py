"""Probe: does an integer cast commute with a wrapping integer product?

A Partial("product") of an integer dtype reduces by multiplying the ranks' values,
wrapping modulo 2**n like the plain tensor's product. Its pending reduction survives
a cast to dtype t only if (a * b).to(t) == a.to(t) * b.to(t) for every pair of values.
This checks every pair of int8/uint8 values and 2M random pairs of int16/int32 values,
for targets of fewer, as many and more bits (either signedness).

    python probes/integer_product_cast.py
"""

import itertools

import torch

SOURCES = [torch.int8, torch.uint8, torch.int16, torch.int32]
TARGETS = [torch.int8, torch.uint8, torch.int16]


def pairs(dtype):
    info = torch.iinfo(dtype)
    if info.bits == 8:
        values = torch.arange(info.min, info.max + 1, dtype=torch.int64).to(dtype)
        a, b = torch.meshgrid(values, values, indexing="ij")
        return a, b
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(info.min, info.max, (2_000_000,), generator=gen, dtype=torch.int64)
    b = torch.randint(info.min, info.max, (2_000_000,), generator=gen, dtype=torch.int64)
    return a.to(dtype), b.to(dtype)


def main():
    for src, target in itertools.product(SOURCES, TARGETS):
        if src == target:
            continue
        a, b = pairs(src)
        commutes = torch.equal((a * b).to(target), a.to(target) * b.to(target))
        bits = f"{torch.iinfo(src).bits} -> {torch.iinfo(target).bits} bits"
        print(f"{str(src):12s} -> {str(target):12s} {bits:14s} commutes={commutes}")


if __name__ == "__main__":
    main()
