"""The dX/dW split backward of pipelining vs a fused backward: stock torch vs the overlay.

    python benchmarks/pipelining_split.py [--reps N] [--depths 4,16,64,256]

Runs itself twice as a worker (stock, then with the overlay's active patches). For a stage
of N x (Linear(256, 256) + ReLU), "plain" (N separate layers), "shared" (one layer applied
N times, ALBERT-style) and "shared-w" (one weight, N biases), it prints:
- time: (stage_backward_input + stage_backward_weight) / fused backward, median of --reps
- flops: FLOPs of I + W / FLOPs of the fused backward (torch.utils.flop_counter)
- held MB: tensors autograd keeps between I and W (saved tensors still alive plus the
  gradients saved for W), after the caller drops its outputs as a pipeline stage does
- groups ms: construct_reverse_graph + get_param_groups, the split's bookkeeping
- grads: whether the split's weight gradients equal the fused backward's
and overlay/stock; 'per layer' is how the overlay's bookkeeping per layer grows from N/4 to
N (1.0 is linear; the target is at most 2).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTH, BATCH = 256, 32


KINDS = {
    "plain": "N separate layers",
    "shared": "one layer applied N times (ALBERT-style)",
    "shared-w": "one weight, N biases (module order: the biases, then the weight)",
}


def stage(depth: int, kind: str):
    import torch
    import torch.nn.functional as F

    def weight():
        return torch.nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)

    def bias():
        return torch.nn.Parameter(torch.randn(WIDTH) * 0.1)

    torch.manual_seed(0)
    if kind == "plain":
        layers = [(weight(), bias()) for _ in range(depth)]
        params = [p for layer in layers for p in layer]
    elif kind == "shared":
        layers = [(weight(), bias())] * depth
        params = list(layers[0])
    else:
        w = weight()
        layers = [(w, bias()) for _ in range(depth)]
        params = [b for _, b in layers] + [w]

    def forward(x):
        for w, b in layers:
            x = torch.relu(F.linear(x, w, b))
        return x

    return forward, params


def measure(depth: int, kind: str, reps: int) -> dict:
    import torch
    from torch.distributed.pipelining._backward import (
        _get_grad_fn_or_grad_acc,
        construct_reverse_graph,
        get_param_groups,
        stage_backward_input,
        stage_backward_weight,
    )
    from torch.utils.flop_counter import FlopCounterMode

    forward, params = stage(depth, kind)
    grad = torch.randn(BATCH, WIDTH)

    def fresh_input():
        return torch.randn(BATCH, WIDTH, requires_grad=True)

    def fused(counter=None):
        out = forward(fresh_input())
        start = time.perf_counter()
        with counter or contextlib.nullcontext():
            torch.autograd.backward(out, grad)
        return time.perf_counter() - start

    def split(counter=None):
        x = fresh_input()
        out = forward(x)
        start = time.perf_counter()
        with counter or contextlib.nullcontext():
            _, groups = stage_backward_input([out], [grad], [x], iter(params))
            stage_backward_weight(iter(params), groups)
        return time.perf_counter() - start

    def flops(run):
        counter = FlopCounterMode(display=False)
        run(counter)
        return counter.get_total_flops()

    def held_between_i_and_w():
        alive = []

        def pack(t):
            alive.append(weakref.ref(t))
            return t

        x = fresh_input()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward(x)
        _, groups = stage_backward_input([out], [grad], [x], iter(params))
        del out  # a stage drops its outputs after I
        gc.collect()
        tensors = [t for ref in alive if (t := ref()) is not None]
        tensors += [
            g
            for group in groups
            for saved in group["grads"]
            if saved
            for g in saved
            if g is not None
        ]
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        stage_backward_weight(iter(params), groups)
        return sum(held.values()) / 2**20

    def bookkeeping():
        x = fresh_input()
        out = forward(x)
        weights = [_get_grad_fn_or_grad_acc(p) for p in params]
        start = time.perf_counter()
        get_param_groups(
            [_get_grad_fn_or_grad_acc(x)], weights, construct_reverse_graph([out.grad_fn])
        )
        return time.perf_counter() - start

    def median(run):
        run()  # warm up
        return statistics.median(run() for _ in range(reps))

    def matches_fused():
        for p in params:
            p.grad = None
        x = fresh_input()
        torch.autograd.backward(forward(x), grad)
        fused_grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        x = x.detach().requires_grad_()
        _, groups = stage_backward_input([forward(x)], [grad], [x], iter(params))
        stage_backward_weight(iter(params), groups)
        return all(
            torch.allclose(p.grad, g, rtol=1e-4, atol=1e-5)
            for p, g in zip(params, fused_grads, strict=True)
        )

    correct = matches_fused()
    return {
        "correct": correct,
        "time": median(split) / median(fused),
        "flops": flops(split) / flops(fused),
        "held_mb": held_between_i_and_w(),
        "groups_ms": 1e3 * median(bookkeeping),
    }


def worker(reps: int, depths: list[int]) -> None:
    import torch

    torch.set_num_threads(1)  # steadier ratios on a shared machine
    results = {}
    for kind in KINDS:
        for depth in depths:
            try:
                results[f"{kind} {depth}"] = measure(depth, kind, reps)
            except RuntimeError as error:
                results[f"{kind} {depth}"] = {"error": str(error).strip().splitlines()[0][:50]}
    print(json.dumps(results))


def verdict(result: dict) -> str:
    if isinstance(result["correct"], str):
        return "error"  # the worker's message is printed below the table
    return "ok" if result["correct"] else "WRONG"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--depths", default="4,16,64,256")
    args = parser.parse_args()
    if args.worker:
        worker(args.reps, [int(d) for d in args.depths.split(",")])
        return
    sys.path.insert(0, str(REPO))
    from tools.active import run_stock_and_overlay

    worker_command = [sys.executable, __file__, "--worker", "--reps", str(args.reps)]
    worker_command += ["--depths", str(args.depths)]
    plan, stock_out, overlay_out = run_stock_and_overlay(REPO, worker_command)
    stock, overlay = (json.loads(out.strip().splitlines()[-1]) for out in (stock_out, overlay_out))
    for kind, description in KINDS.items():
        print(f"{kind}: {description}")
    print(f"overlay: {plan.summary()}; Linear({WIDTH}, {WIDTH}) + ReLU, batch {BATCH}, "
          f"1 thread, median of {args.reps}")  # fmt: skip
    print("columns: stock | overlay | overlay/stock")
    header = (f"{'stage':12} {'(I+W)/fused time':>26} {'FLOP ratio':>16} {'held MB I->W':>20} "
              f"{'groups ms':>27} {'per layer':>10} {'grads':>14}")  # fmt: skip
    print(header)
    print("-" * len(header))
    previous = {}  # kind -> the overlay's bookkeeping time per layer at the previous depth
    for name in stock:
        s, o = stock[name], overlay[name]
        kind = name.split()[0]
        if "error" in o:
            print(f"{name:12} overlay: {o['error']}")
            previous.pop(kind, None)
            continue
        if "error" in s:  # the overlay's numbers alone
            s = {"time": float("nan"), "flops": float("nan"), "held_mb": float("nan"),
                 "groups_ms": float("nan"), "correct": s["error"]}  # fmt: skip
        depth = int(name.split()[1])
        per_layer = o["groups_ms"] / depth
        growth = f"{per_layer / previous[kind]:10.2f}" if kind in previous else f"{'':10}"
        previous[kind] = per_layer
        print(f"{name:12} {s['time']:7.2f} | {o['time']:5.2f} | {o['time'] / s['time']:5.2f}x "
              f"{s['flops']:6.2f} | {o['flops']:5.2f} {s['held_mb']:8.1f} | {o['held_mb']:7.1f} "
              f"{s['groups_ms']:8.2f} | {o['groups_ms']:6.2f} | {o['groups_ms'] / s['groups_ms']:5.2f}x "
              f"{growth} {verdict(s):>6} | {verdict(o)}")  # fmt: skip
    errors = {s["error"] for s in stock.values() if "error" in s}
    for error in sorted(errors):
        print(f"stock error: {error}")


if __name__ == "__main__":
    main()
