"""Probe: a Python scalar and a plain 0-d tensor share one native sharding-cache entry.

`x + 3` reaches DTensor as a wrapped-number 0-d tensor. The native (C++) sharding
cache keys it like a plain 0-d tensor (`torch.tensor(3)`): a Replicate spec of its
shape and dtype. The Python side, which computes and applies the plan, receives it
as the Python scalar 3. So after `x + torch.tensor(3)` on a Partial(sum) `x` (plan:
split the 0-d tensor into a Partial(sum), no collective), `x + 3` hits that entry and
adds 3 on every rank (reads x + 6 on 2 ranks); the other order, the Python scalar's
plan applied to the tensor, raises AttributeError ('int' object has no attribute
'mesh'). Each row clears the caches, runs the first form then the second, and
compares each result with the op on the reduced plain tensor.

Ranks are simulated with LocalTensorMode over the fake process group.

    python probes/sharding_cache_scalar_representation.py [--world-size N]
        stock torch
    python -m tools.cli run -- python probes/sharding_cache_scalar_representation.py
        with the overlay

Prints one line per case and order: the verdict (ok / WRONG / ERROR) and the
collective count of each call; then a count line.

Stock: 4 WRONG, 7 ERROR, 17 ok. With the overlay ("[DTensor] A scalar and a 0-d tensor
share a native sharding entry only if their plans agree", the wheel stopgap of the C++
"[DTensor] Tell a Python scalar from a 0-d tensor in the native sharding cache key"):
0 WRONG, 4 ERROR, 24 ok. The 4 ERROR rows are the scalar calls of `add_` (P(sum)) and
of `mul(P(avg), s, out=P(sum))`, in both orders; each raises on empty caches too, on
stock and with the overlay, so they are not the cache's: `x.add_(3)` on a Partial(sum)
is an in-place op whose only strategy changes x's placement (RuntimeError, refused by
design; the 0-d tensor form keeps it by splitting the tensor), and the out= call's plan
redistributes x from P(avg) to P(sum), which redistribute_local_tensor does not support
(AssertionError; the 0-d tensor form reduces x instead). Both are loud, not values.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import DTensor, Partial, init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode, _clear_sharding_prop_cache
from torch.testing._internal.distributed.fake_pg import FakeStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    ws = parser.parse_args().world_size
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ws)
    mode = LocalTensorMode(ws)
    with mode:
        mesh = init_device_mesh("cpu", (ws,))
    locals_ = {r: torch.tensor([1.5 * (r + 1), -2.0 * (r + 1)]) for r in range(ws)}

    def make(placement, zeros=False):
        values = {r: torch.zeros(2) if zeros else t.clone() for r, t in locals_.items()}
        with mode:
            return DTensor.from_local(
                LocalTensor(values),
                mesh,
                [placement],
                run_check=False,
            )

    def full(d):
        with mode:
            f = d.full_tensor()
        return f._local_tensors[0] if isinstance(f, LocalTensor) else f

    cases = {
        "add": (Partial("sum"), lambda x, s, o: x + s),
        "sub": (Partial("sum"), lambda x, s, o: x - s),
        "add_": (Partial("sum"), lambda x, s, o: x.add_(s)),
        "mul": (Partial("sum"), lambda x, s, o: x * s),
        "add P(max)": (Partial("max"), lambda x, s, o: x + s),
        "mul P(max)": (Partial("max"), lambda x, s, o: x * s),
        "mul(P(avg), s, out=P(sum))": (
            Partial("avg"),
            lambda x, s, o: torch.mul(x, s, out=o) if o is not None else x * s,
        ),
    }
    counts: dict[str, int] = {}
    for name, (placement, fn) in cases.items():
        for order in (("tensor", "scalar"), ("scalar", "tensor")):
            _clear_sharding_prop_cache()
            verdicts = []
            for kind in order:
                x = make(placement)
                plain = fn(full(x).clone(), 3, None)
                out = make(Partial("sum"), zeros=True)
                s = torch.tensor(3) if kind == "tensor" else 3
                comm = CommDebugMode()
                try:
                    with mode, comm:
                        result = fn(x, s, out)
                    got = full(result)
                    verdict = (
                        "ok"
                        if torch.allclose(got, plain)
                        else f"WRONG {got.tolist()} vs {plain.tolist()}"
                    )
                except Exception as e:  # noqa: BLE001
                    verdict = f"ERROR {type(e).__name__}"
                counts[verdict.split()[0]] = counts.get(verdict.split()[0], 0) + 1
                verdicts.append(f"{kind}: {verdict} ({comm.get_total_counts()})")
            print(f"{name:28s} {' then '.join(verdicts)}")
    print(" ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
