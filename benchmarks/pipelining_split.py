"""The dX/dW split backward of pipelining vs a fused backward: stock torch vs the overlay.

    python benchmarks/pipelining_split.py [--reps N] [--depths 1,4,16,64,256]

Runs itself twice as a worker (stock, then with the overlay's active patches). For a stage
of N x (Linear(256, 256) + ReLU), "plain" (N separate layers), "shared" (one layer applied
N times, ALBERT-style) and "shared-w" (one weight, N biases), it prints:
- time: (stage_backward_input + stage_backward_weight) / fused backward, median of --reps
- flops: FLOPs of I + W / FLOPs of the fused backward (torch.utils.flop_counter)
- held MB: tensors autograd keeps between I and W (saved tensors still alive plus the
  gradients saved for W, and the weight gradients I computed for W to accumulate), after
  the caller drops its outputs as a pipeline stage does; never the parameters nor the stage
  input, which the stage holds until W either way (a saved alias of them is alive on stock
  and not after the overlay moved a group, so counting it would favour the move)
- peak MB in W: the most tensor bytes live at once inside stage_backward_weight (W), with
  every .grad None before W (as after zero_grad()), so W allocates the weight gradients
- groups ms: construct_reverse_graph + get_param_groups (+ the overlay's choice of the
  groups whose weight gradients I computes), the split's bookkeeping
- grads: whether the split's weight gradients equal the fused backward's
and overlay/stock; 'per layer' is how the overlay's bookkeeping per layer grows from N/4 to
N (1.0 is linear; the target is at most 2). Rows whose peak in W is above stock's are then
split by kind (saved activations, saved gradients, allocated in W): overlay
minus stock, each at its own peak.

Two more tables. Micro-batches in flight (IN_FLIGHT): k input backwards, then their k weight
backwards (the order zero-bubble schedules use; the overlay is told k, as a schedule tells
its stages), for Linear(H, H) applied N times to
micro-batches of T rows (large weights and small micro-batches included) and for a weight
penalty in the loss: bytes held after the k I's, the FLOP ratio (k I's + k W's) / k fused
backwards, and where the overlay computed the weight gradients: "I" (in the input
backward), "W mm" (in the weight backward, from each use's saved gradient and matmul
operands, without the chain between the uses) or "no" (as stock). Weights shared in
mirror (MIRROR: weight i used by layers i and 2M - 1 - i, 4x4 weights): CPU ms of
stage_backward_input, which is where the overlay chooses the groups to compute in I.

Memory is counted per storage (its whole nbytes, once however many tensors view it), on
one micro-batch. Saved tensors are found with a pack hook that saves a detached alias, as
autograd saves a node's own output (the tensor itself would hold its grad_fn, which would
hold it: a cycle that keeps it alive). The peak starts from the held tensors, each until it
is freed, and adds every storage an op allocates during W (an output storage that no input
of the op has), until it is freed: a TorchDispatchMode sees each op, backward ones included
(autograd runs them under the caller's mode), and a weakref.finalize on each storage sees
its free. The cyclic collector is off during W, so garbage in cycles counts as live.
Not counted: tensors alive before W that autograd does not hold (the caller's input
gradient, unsaved parameters), scratch a kernel allocates without returning it, the
allocator's caching and fragmentation, graph nodes and other non-tensor memory. A check
runs in each worker: on 4 bias-free Linear layers the tracker's start and peak equal bytes
worked out by hand, and its peak over start equals what the CPU allocator itself reports
(profiler, profile_memory) for the same W run without the tracker.

The worker prints JSON: {"rows": {"<kind> <N>": {"correct", "time", "flops", "held_mb",
"peak_w_mb", "peak_w_parts_mb", "groups_ms"} or {"error"}}, "tracker_check": {...},
"in_flight": {"<label> <H> <T> <N> <k> <penalty>": {"held_mb", "flops", "correct",
"moved", "direct"}}, "mirror_ms": {"<M>": ms}}.
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


def in_flight_kwargs(k: int) -> dict:
    """``in_flight=k`` for the overlay's stage_backward_input (the most micro-batches
    between their I and W at one time, which a schedule passes); stock has no such
    argument."""
    import inspect

    from torch.distributed.pipelining._backward import stage_backward_input

    params = inspect.signature(stage_backward_input).parameters
    return {"in_flight": k} if "in_flight" in params else {}


def live_bytes_mode(held):
    """A TorchDispatchMode that counts the live bytes of the storages of ``held`` ((tensor,
    label) pairs that exist when it is made) and of every storage an op run under it
    allocates (label "allocated in W"), each storage once, until that storage is freed.
    ``start`` and ``peak`` (the maximum, reached after some allocation) are in bytes;
    ``peak_parts`` splits the peak by label.

    A storage counts as allocated by an op if an output of the op uses it and no input does
    (views and in-place results are not new). Frees are seen through a ``weakref.finalize`` on
    the storage's Python object, which PyTorch keeps alive exactly as long as the C++ storage.
    """
    import collections

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.parts: collections.Counter[str] = collections.Counter()
            self.peak_parts: dict[str, int] = {}
            self.tracked: set[int] = set()

        def track(self, storage, label: str) -> None:
            key, nbytes = storage._cdata, storage.nbytes()
            if key in self.tracked:
                return
            self.tracked.add(key)
            self.live += nbytes
            self.parts[label] += nbytes
            if self.live >= self.peak:
                self.peak, self.peak_parts = self.live, dict(self.parts)
            weakref.finalize(storage, self.free, key, nbytes, label).atexit = False

        def free(self, key: int, nbytes: int, label: str) -> None:
            self.tracked.discard(key)
            self.live -= nbytes
            self.parts[label] -= nbytes

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = {
                t.untyped_storage()._cdata
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
            }
            out = func(*args, **kwargs)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in inputs:
                    self.track(t.untyped_storage(), "allocated in W")
            return out

    mode = LiveBytes()
    for t, label in held:
        mode.track(t.untyped_storage(), label)
    mode.start = mode.live
    return mode


def weight_step_memory(forward, params, x, grad) -> dict:
    """One micro-batch through forward, I and W as a pipeline stage runs it (the caller drops
    its outputs after I; ``.grad`` is None before W, as after ``zero_grad()``). Returns the
    bytes autograd holds between I and W ("held") and the peak live bytes inside W ("peak",
    split by kind in "peak_parts")."""
    import torch
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    for p in params:
        p.grad = None
    # neither the weights nor the stage input: the stage holds them until W either way
    weights = {p.untyped_storage()._cdata for p in params}
    stage_input = x.untyped_storage()._cdata
    alive = []

    def pack(t):
        # Save a detached alias, as autograd itself saves an output of its node: the tensor
        # would hold its grad_fn, which would hold it, a cycle that nothing frees.
        t = t.detach()
        alive.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x)
    _, groups = stage_backward_input([out], [grad], [x], iter(params), **in_flight_kwargs(1))
    del out  # a stage drops its outputs after I
    gc.collect()

    def held():  # saved tensors still alive, and the gradients saved for W
        for ref in alive:
            if (t := ref()) is not None:
                key = t.untyped_storage()._cdata
                if key not in weights and key != stage_input:
                    yield t, "saved activations"
        for group in groups:
            for saved in group["grads"]:
                yield from ((g, "saved gradients") for g in saved or () if g is not None)
            # weight gradients that I computed for W to accumulate (overlay, reused weights)
            for g in group.get("param_grads") or ():
                if g is not None:
                    yield g, "weight gradients from I"

    mode = live_bytes_mode(held())
    gc.disable()  # frees by reference counting only: garbage in cycles stays live, as it does
    try:  # until a collection, which would otherwise run at arbitrary points
        with mode:
            stage_backward_weight(iter(params), groups)
    finally:
        gc.enable()
    return {"held": mode.start, "peak": mode.peak, "peak_parts": mode.peak_parts}


def allocator_peak_in_w(forward, params, x, grad) -> int:
    """The micro-batch of ``weight_step_memory`` without the tracker, under the profiler with
    ``profile_memory``: the CPU allocator then reports each allocation and each free of a
    block allocated since the profiler started. Returns the largest running sum of those
    reports inside W: W's peak over its start, as the allocator saw it (with nothing freed in
    W allocated before the profiler started: here the weights, x and grad)."""
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )
    from torch.profiler import ProfilerActivity, profile, record_function

    for p in params:
        p.grad = None
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = forward(x)
        _, groups = stage_backward_input([out], [grad], [x], iter(params), **in_flight_kwargs(1))
        del out
        gc.collect()
        gc.disable()
        try:
            with record_function("weight step"):
                stage_backward_weight(iter(params), groups)
        finally:
            gc.enable()
        del groups
    events = prof.profiler.kineto_results.events()
    (w,) = [e for e in events if e.name() == "weight step"]
    start, end = w.start_ns(), w.start_ns() + w.duration_ns()
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in ((t, n) for t, n in memory if start <= t <= end):
        live += nbytes
        peak = max(peak, live)
    return peak


TRACKER_CHECK_DEPTH = 4


def check_tracker(depth: int = TRACKER_CHECK_DEPTH) -> dict:
    """The peak inside W on a stack of ``depth`` bias-free Linear(WIDTH, WIDTH), no ReLU,
    against the bytes worked out by hand (fp32, D = WIDTH, B = BATCH, N = depth).

    Held at W's start: x_1 .. x_{N-1} ((N - 1) B D; each matmul's input but the stage input
    x_0) and the N gradients saved for the N groups, one per layer (N B D; the last is the
    caller's output gradient). The N weights the matmuls saved and x_0 are not counted: the
    stage holds them until W either way. W allocates each layer's D x D gradient (N D^2 in
    all). A W that frees each group's graph and saved gradient after its run has freed
    x_1 .. x_{N-2} and g_1 .. g_{N-1} before the last allocation: peak = start + N D^2 -
    (2N - 3) B D. One that frees each group's saved gradient but keeps the graph (the
    overlay, which retains it for later groups) peaks at start + N D^2 - (N - 1) B D. A W
    that keeps both until it returns peaks at start + N D^2.

    Also the same W's peak over its start as the CPU allocator reports it, without the tracker
    (``allocator_peak_in_w``): the tracker misses no allocation and does not change W.
    """
    import torch

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(WIDTH, WIDTH)) for _ in range(depth)]

    def forward(x):
        for w in weights:
            x = torch.nn.functional.linear(x, w)
        return x

    def micro_batch():
        return torch.randn(BATCH, WIDTH, requires_grad=True), torch.randn(BATCH, WIDTH)

    memory = weight_step_memory(forward, weights, *micro_batch())
    allocator = allocator_peak_in_w(forward, weights, *micro_batch())
    square, row = 4 * WIDTH * WIDTH, 4 * BATCH * WIDTH
    hand_start = (2 * depth - 1) * row
    return {
        "depth": depth,
        "start": memory["held"],
        "peak": memory["peak"],
        "hand_start": hand_start,
        "hand_peak_frees": hand_start + depth * square - (2 * depth - 3) * row,
        "hand_peak_frees_grads": hand_start + depth * square - (depth - 1) * row,
        "hand_peak_keeps": hand_start + depth * square,
        "allocator_peak_over_start": allocator,
    }


def measure(depth: int, kind: str, reps: int) -> dict:
    import torch
    from torch.distributed.pipelining._backward import (
        _get_grad_fn_or_grad_acc,
        construct_reverse_graph,
        get_param_groups,
        reverse_closure,
        stage_backward_input,
        stage_backward_weight,
    )
    from torch.utils.flop_counter import FlopCounterMode

    # the overlay's choice of the groups whose weight gradients I computes (not on stock)
    choose_groups_for_i = getattr(
        torch.distributed.pipelining._backward, "_groups_to_compute_in_input_backward", None
    )
    forward, params = stage(depth, kind)
    grad = torch.randn(BATCH, WIDTH)
    one = in_flight_kwargs(1)  # one micro-batch: its I, then its W

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
            _, groups = stage_backward_input([out], [grad], [x], iter(params), **one)
            stage_backward_weight(iter(params), groups)
        return time.perf_counter() - start

    def flops(run):
        counter = FlopCounterMode(display=False)
        run(counter)
        return counter.get_total_flops()

    def bookkeeping():
        x = fresh_input()
        out = forward(x)
        weights = [_get_grad_fn_or_grad_acc(p) for p in params]
        start = time.perf_counter()
        inputs, reverse = [_get_grad_fn_or_grad_acc(x)], construct_reverse_graph([out.grad_fn])
        if choose_groups_for_i is None:
            get_param_groups(inputs, weights, reverse)
        else:  # the overlay computes the inputs' closure once for both
            closure, _ = reverse_closure(inputs, set(), reverse)
            groups = get_param_groups(inputs, weights, reverse, inputs_closure=closure)
            choose_groups_for_i(groups, closure, (), 1)
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
        _, groups = stage_backward_input([forward(x)], [grad], [x], iter(params), **one)
        stage_backward_weight(iter(params), groups)
        return all(
            torch.allclose(p.grad, g, rtol=1e-4, atol=1e-5)
            for p, g in zip(params, fused_grads, strict=True)
        )

    correct = matches_fused()
    memory = weight_step_memory(forward, params, fresh_input(), grad)
    return {
        "correct": correct,
        "time": median(split) / median(fused),
        "flops": flops(split) / flops(fused),
        "held_mb": memory["held"] / 2**20,
        "peak_w_mb": memory["peak"] / 2**20,
        "peak_w_parts_mb": {k: v / 2**20 for k, v in memory["peak_parts"].items()},
        "groups_ms": 1e3 * median(bookkeeping),
    }


# (label, width H, rows per micro-batch T, uses N, micro-batches in flight k, weight penalty)
IN_FLIGHT = [
    ("reused", 1024, 16, 2, 1, False),
    ("reused", 1024, 16, 2, 4, False),
    ("reused", 2048, 8, 4, 1, False),
    ("reused", 2048, 8, 4, 4, False),
    ("reused", 256, 32, 4, 1, False),
    ("reused", 256, 32, 4, 4, False),
    ("reused", 256, 40, 4, 1, False),
    ("reused", 256, 40, 4, 4, False),
    ("reused", 256, 32, 16, 1, False),
    ("reused", 256, 32, 16, 4, False),
    ("reused", 1024, 512, 4, 1, False),
    ("reused", 1024, 512, 4, 4, False),
    ("penalty", 1024, 16, 1, 4, True),
]
MIRROR = [50, 200, 400]


def in_flight(width: int, rows: int, uses: int, k: int, penalty: bool) -> dict:
    """k micro-batches through I, then their k W's (the zero-bubble order), one
    Linear(width, width) applied ``uses`` times (or once, with an L2 penalty on its
    weight in the loss), fp32. Returns the bytes held after the k I's (saved tensors
    still alive, gradients saved for W, weight gradients I computed; per storage), the
    FLOP ratio (k I's + k W's) / k fused backwards, whether the gradients equal the
    fused ones, and whether the group's weight gradients were computed in I."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(width, width) / width**0.5)
    b = torch.nn.Parameter(torch.zeros(width))
    params = [w, b]
    alive = []

    def pack(t):
        t = t.detach()
        alive.append(weakref.ref(t))
        return t

    def forward(x):
        h = x
        for _ in range(uses):
            h = torch.relu(F.linear(h, w, b))
        return [(h**2).mean() + 1e-3 * (w**2).sum()] if penalty else [h]

    xs = [torch.randn(rows, width) for _ in range(k)]
    grads = [None if penalty else [torch.randn(rows, width)] for _ in range(k)]
    fused_flops = 0
    for x, g in zip(xs, grads, strict=True):
        out = forward(x.requires_grad_())
        with FlopCounterMode(display=False) as counter:
            torch.autograd.backward(out, g)
        fused_flops += counter.get_total_flops()
    fused_grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    split_flops, pending = 0, []
    for x, g in zip(xs, grads, strict=True):
        x = x.detach().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward(x)
        with FlopCounterMode(display=False) as counter:
            _, groups = stage_backward_input(out, g, [x], iter(params), **in_flight_kwargs(k))
        split_flops += counter.get_total_flops()
        del out  # a stage drops its outputs after I
        pending.append(groups)
    gc.collect()
    # neither the weights nor the stage inputs: the stage holds them until W either way
    seen, nbytes = set(), 0
    weights = {t.untyped_storage()._cdata for t in [*params, *xs]}
    tensors = [t for ref in alive if (t := ref()) is not None]
    for groups in pending:
        for group in groups:
            for saved in group.get("grads") or ():
                tensors += [t for t in saved or () if t is not None]
            extra = (group.get("root_grads") or []) + (group.get("param_grads") or [])
            tensors += [t for t in extra if t is not None]
    for t in tensors:
        key = t.untyped_storage()._cdata
        if key not in seen and key not in weights:
            seen.add(key)
            nbytes += t.untyped_storage().nbytes()
    moved = any("param_grads" in g for g in pending[0])
    direct = any("direct" in g for g in pending[0])  # the overlay's matmul plan for W
    del tensors
    for groups in pending:
        with FlopCounterMode(display=False) as counter:
            stage_backward_weight(iter(params), groups)
        split_flops += counter.get_total_flops()
    correct = all(
        torch.allclose(p.grad, g, rtol=1e-4, atol=1e-5)
        for p, g in zip(params, fused_grads, strict=True)
    )
    return {"held_mb": nbytes / 2**20, "flops": split_flops / fused_flops,
            "correct": correct, "moved": moved, "direct": direct}  # fmt: skip


def mirror_input_backward_ms(m: int, reps: int) -> float:
    """CPU ms of stage_backward_input (graph walk, grouping, the overlay's choice and the
    backward itself) on weights shared in mirror: weight i used by layer i and by layer
    2m - 1 - i (a tied encoder-decoder), 4x4 weights so that the time is the bookkeeping;
    best of ``reps``."""
    import torch
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(4, 4) / 2) for _ in range(m)]
    best = float("inf")
    for _ in range(reps):
        x = torch.randn(8, 4, requires_grad=True)
        h = x
        for p in ps + ps[::-1]:
            h = torch.tanh(h @ p)
        start = time.process_time()
        _, groups = stage_backward_input([h], [torch.ones_like(h)], [x], iter(ps))
        best = min(best, time.process_time() - start)
        del h
        with contextlib.suppress(RuntimeError):  # stock's W fails here; I is timed
            stage_backward_weight(iter(ps), groups)
    return 1e3 * best


def worker(reps: int, depths: list[int]) -> None:
    import torch

    torch.set_num_threads(1)  # steadier ratios on a shared machine
    rows = {}
    for kind in KINDS:
        for depth in depths:
            try:
                rows[f"{kind} {depth}"] = measure(depth, kind, reps)
            except RuntimeError as error:
                rows[f"{kind} {depth}"] = {"error": str(error).strip().splitlines()[0][:50]}
    flight = {" ".join(map(str, row)): in_flight(*row[1:]) for row in IN_FLIGHT}
    mirror = {str(m): mirror_input_backward_ms(m, reps) for m in MIRROR}
    print(json.dumps({"rows": rows, "tracker_check": check_tracker(), "in_flight": flight,
                      "mirror_ms": mirror}))  # fmt: skip


def tracker_check_verdict(check: dict) -> str:
    """Whether the tracker's bytes on the toy stack equal the ones worked out by hand."""
    kib = {k: v / 2**10 for k, v in check.items()}
    if check["start"] != check["hand_start"]:
        return f"MISMATCH: start {kib['start']:.0f} KiB, by hand {kib['hand_start']:.0f} KiB"
    allocator = check["allocator_peak_over_start"]
    if allocator != check["peak"] - check["start"]:
        return (f"MISMATCH: peak - start {kib['peak'] - kib['start']:.0f} KiB, the allocator's "
                f"{kib['allocator_peak_over_start']:.0f} KiB")  # fmt: skip
    for key, how in (("hand_peak_frees", "frees each group as it goes"),
                     ("hand_peak_frees_grads", "frees each group's gradients, keeps the graph"),
                     ("hand_peak_keeps", "keeps the groups' graph and gradients to the end")):  # fmt: skip
        if check["peak"] == check[key]:
            return (f"start {kib['start']:.0f} KiB, peak {kib['peak']:.0f} KiB = by hand for "
                    f"a W that {how}; peak - start = the allocator's")  # fmt: skip
    return (f"MISMATCH: peak {kib['peak']:.0f} KiB, by hand {kib['hand_peak_frees']:.0f}, "
            f"{kib['hand_peak_frees_grads']:.0f} or {kib['hand_peak_keeps']:.0f} KiB")  # fmt: skip


def where(result: dict) -> str:
    """Where the overlay computed an in-flight row's weight gradients."""
    if result["moved"]:
        return "I"
    return "W mm" if result.get("direct") else "no"


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
    parser.add_argument("--depths", default="1,4,16,64,256")
    args = parser.parse_args()
    if args.worker:
        worker(args.reps, [int(d) for d in args.depths.split(",")])
        return
    sys.path.insert(0, str(REPO))
    from tools.active import run_stock_and_overlay

    worker_command = [sys.executable, __file__, "--worker", "--reps", str(args.reps)]
    worker_command += ["--depths", str(args.depths)]
    plan, stock_out, overlay_out = run_stock_and_overlay(REPO, worker_command)
    stock_json, overlay_json = (
        json.loads(out.strip().splitlines()[-1]) for out in (stock_out, overlay_out)
    )
    stock, overlay = stock_json["rows"], overlay_json["rows"]
    for kind, description in KINDS.items():
        print(f"{kind}: {description}")
    print(f"overlay: {plan.summary()}; Linear({WIDTH}, {WIDTH}) + ReLU, batch {BATCH}, "
          f"1 thread, median of {args.reps}")  # fmt: skip
    print("columns: stock | overlay | overlay/stock")
    header = (f"{'stage':12} {'(I+W)/fused time':>26} {'FLOP ratio':>16} {'held MB I->W':>20} "
              f"{'peak MB in W':>28} {'groups ms':>27} {'per layer':>10} {'grads':>14}")  # fmt: skip
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
                 "peak_w_mb": float("nan"), "groups_ms": float("nan"),
                 "correct": s["error"]}  # fmt: skip
        depth = int(name.split()[1])
        per_layer = o["groups_ms"] / depth
        growth = f"{per_layer / previous[kind]:10.2f}" if kind in previous else f"{'':10}"
        previous[kind] = per_layer
        print(f"{name:12} {s['time']:7.2f} | {o['time']:5.2f} | {o['time'] / s['time']:5.2f}x "
              f"{s['flops']:6.2f} | {o['flops']:5.2f} {s['held_mb']:8.2f} | {o['held_mb']:7.2f} "
              f"{s['peak_w_mb']:9.2f} | {o['peak_w_mb']:7.2f} | {o['peak_w_mb'] / s['peak_w_mb']:5.2f}x "
              f"{s['groups_ms']:8.2f} | {o['groups_ms']:6.2f} | {o['groups_ms'] / s['groups_ms']:5.2f}x "
              f"{growth} {verdict(s):>6} | {verdict(o)}")  # fmt: skip
    errors = {s["error"] for s in stock.values() if "error" in s}
    for error in sorted(errors):
        print(f"stock error: {error}")
    above = [name for name in stock if "error" not in stock[name] | overlay[name]
             and overlay[name]["peak_w_mb"] > stock[name]["peak_w_mb"]]  # fmt: skip
    if above:
        print("peak MB in W above stock, overlay - stock at each one's peak, by kind:")
    for name in above:
        s, o = stock[name]["peak_w_parts_mb"], overlay[name]["peak_w_parts_mb"]
        parts = {k: o.get(k, 0.0) - s.get(k, 0.0) for k in {*s, *o}}
        print(f"  {name:12} " + ", ".join(f"{k} {v:+.2f}" for k, v in sorted(parts.items()) if v))
    print("micro-batches in flight: k I's, then k W's (zero-bubble order), Linear(H, H) "
          "applied N times to micro-batches of T rows, fp32; held MB after the k I's, "
          "FLOP ratio (I+W)/fused; dW: where the overlay computed the weight gradients "
          "(I, W mm = in W without the chain, no = as stock)")  # fmt: skip
    print(f"{'case':26} {'held MB':>18} {'FLOP ratio':>15} {'dW':>6} {'grads':>10}")
    for name in stock_json["in_flight"]:
        s, o = stock_json["in_flight"][name], overlay_json["in_flight"][name]
        label, h, t, n, k, _ = name.split()
        case = f"{label} H={h} T={t} N={n} k={k}"
        print(f"{case:26} {s['held_mb']:7.2f} | {o['held_mb']:7.2f} {s['flops']:6.2f} | "
              f"{o['flops']:5.2f} {where(o):>6} "
              f"{verdict(s):>4} | {verdict(o)}")  # fmt: skip
    print("weights shared in mirror (weight i in layers i and 2M-1-i), 4x4: "
          "stage_backward_input CPU ms, best of --reps, stock | overlay")  # fmt: skip
    for m in stock_json["mirror_ms"]:
        s, o = stock_json["mirror_ms"][m], overlay_json["mirror_ms"][m]
        print(f"  M={m:>4} ({2 * int(m)} layers): {s:7.1f} | {o:7.1f} | {o / s:5.2f}x")
    print(f"peak tracker check on {TRACKER_CHECK_DEPTH} x bias-free Linear({WIDTH}, {WIDTH}), "
          f"batch {BATCH}, against bytes worked out by hand (see check_tracker):")  # fmt: skip
    for label, check in (("stock", stock_json["tracker_check"]),
                         ("overlay", overlay_json["tracker_check"])):  # fmt: skip
        print(f"  {label}: {tracker_check_verdict(check)}")


if __name__ == "__main__":
    main()
