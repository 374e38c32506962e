"""A zero-bubble schedule's step() after a step that raised part-way through.

One gloo rank holding every stage ((dp, pp) = (1, 1)), float64 blocks, 4
micro-batches, no DDP. Step 0 raises at an injected point: the loss function
(its k-th call), the forward of the last stage (its k-th call) or a tensor hook
on stage 0's weight during a backward (its k-th call). The caller catches the
error, clears every .grad (as an optimizer's zero_grad(set_to_none=True) does),
and runs step 1 on new data with the same schedule. Printed per case: whether
step 1 raised, and the largest difference of the gradients from a
single-process reference of step 1 alone.

    python probes/pp_step_after_failed_step.py                       # torch 2.15.0
    python -m tools.cli run -- python probes/pp_step_after_failed_step.py
    python probes/pp_step_after_failed_step.py --clear-losses   # root cause check

Measured 2026-11-27 (helper pp26b), torch 2.15.0 and the series:
- ScheduleZBVZeroBubble and ScheduleInterleavedZeroBubble: step 0 raising in the
  loss of micro-batch 3 or in the last stage's forward after micro-batch 0 leaves
  1-3 losses in the schedule's ``_internal_losses`` (cleared only by
  ``_update_losses`` at the end of a successful step); step 1 then runs without an
  error and its backwards use those stale losses: torch 2.15.0 leaves stage 1's
  grads None and stage 0's zero (max diff inf), the series gives stage 1 grads
  off by up to 0.16 and stage 0's zero (max diff 0.28). Silently wrong in both;
  the series changes the symptom, not the defect.
- ScheduleDualPipeV and ScheduleInterleaved1F1B in the same cases: step 1 raises
  "Failed to run stage backward ... Output gradient: None" (loud), both builds.
- A raising backward hook: step 1 raises the stock "Receive buffer ... still owned
  by an incomplete pipeline step" (ZBV, IZB) or the error above, both builds.
- With --clear-losses, every loss/forward case of ZBV, IZB and Interleaved1F1B is
  right in step 1 (max diff 0), torch 2.15.0 and the series alike; DualPipeV then
  raises the "Receive buffer ... still owned" guard. The fix would be to clear
  ``_internal_losses`` when a step starts (a pipelining PR of its own; not made).
- 2026-11-27 (helper pp26c), the series with "[pipelining] A step after a failed
  step does not reuse its losses" (0030), which does that in both step() methods:
  every loss/forward case of ZBV, IZB and Interleaved1F1B 0; DualPipeV's backward
  hook cases 0, its loss/forward cases the "still owned" guard (kept on purpose, see
  that PR); the hook cases of ZBV, IZB and Interleaved1F1B the same guard as before.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

DIM, BATCH, N_MB = 4, 8, 4
# --clear-losses: empty the schedule's private _internal_losses before step 1
CLEAR_LOSSES = "--clear-losses" in sys.argv
SCHEDULES = {
    ScheduleZBVZeroBubble: 2,
    ScheduleInterleavedZeroBubble: 2,
    ScheduleDualPipeV: 2,
    ScheduleInterleaved1F1B: 2,  # fused backward: the control
}


class Injected(RuntimeError):
    pass


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64) * 0.1)
        self.fail_at = None  # raise at this forward call
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_at:
            raise Injected(f"forward call {self.calls}")
        return torch.tanh(x @ self.w + self.b)


def data(step):
    g = torch.Generator().manual_seed(100 * step)
    return (
        torch.randn(BATCH, DIM, dtype=torch.float64, generator=g),
        torch.randn(BATCH, DIM, dtype=torch.float64, generator=g),
    )


def loss_fn(out, target):
    return ((out - target) ** 2).mean()


def build(n):
    torch.manual_seed(0)
    return [Block() for _ in range(n)]


def reference(n, step):
    modules = build(n)
    x, y = data(step)
    for xm, ym in zip(x.chunk(N_MB), y.chunk(N_MB), strict=True):
        out = xm
        for m in modules:
            out = m(out)
        (loss_fn(out, ym) / N_MB).backward()
    return modules


def run_case(schedule_cls, where, k):
    n = SCHEDULES[schedule_cls]
    modules = build(n)
    stages = [PipelineStage(m, i, n, torch.device("cpu")) for i, m in enumerate(modules)]
    loss_calls = [0]
    hook_calls = [0]
    armed = [True]

    def loss(out, target):
        loss_calls[0] += 1
        if armed[0] and where == "loss" and loss_calls[0] == k:
            raise Injected(f"loss call {k}")
        return loss_fn(out, target)

    def hook(g):
        hook_calls[0] += 1
        if armed[0] and where == "bwd" and hook_calls[0] == k:
            raise Injected(f"stage 0 w hook call {k}")
        return g

    modules[0].w.register_hook(hook)
    if where == "fwd":
        # the last stage's k-th forward (the metadata-inference forward
        # of step 0 counts as its first)
        modules[-1].fail_at = k
    schedule = schedule_cls(stages, n_microbatches=N_MB, loss_fn=loss)
    x, y = data(0)
    try:
        schedule.step(x, target=y)
        first = "no error"
    except Exception as e:  # noqa: BLE001
        cause = e if isinstance(e, Injected) else e.__cause__
        if not isinstance(cause, Injected):
            raise
        first = f"raised ({cause})"
    armed[0] = False
    modules[-1].fail_at = None
    for m in modules:
        for p in m.parameters():
            p.grad = None
    stale = len(schedule._internal_losses)
    if CLEAR_LOSSES:
        # the suspected root cause: the losses of step 0's finished micro-batches
        # stay in the schedule and are used by step 1's backwards
        schedule._internal_losses.clear()
    first += f", {stale} stale losses"
    x, y = data(1)
    try:
        schedule.step(x, target=y)
    except Exception as e:  # noqa: BLE001
        return first, f"step 1 raised {type(e).__name__}: {' '.join(str(e).split())[:120]}"
    ref = reference(n, 1)
    diff = max(
        (p.grad - r.grad).abs().max().item() if p.grad is not None else float("inf")
        for m, rm in zip(modules, ref, strict=True)
        for p, r in zip(m.parameters(), rm.parameters(), strict=True)
    )
    return first, f"step 1 max|grad - ref| {diff:.3g}"


def main():
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group(
            "gloo", store=dist.FileStore(os.path.join(d, "s"), 1), rank=0, world_size=1
        )
        for schedule_cls in SCHEDULES:
            for where, ks in (("loss", (1, 2, 4)), ("fwd", (2, 3, 5)), ("bwd", (1, 3, 5))):
                for k in ks:
                    first, second = run_case(schedule_cls, where, k)
                    print(f"{schedule_cls.__name__:30s} {where} k={k}: step 0 {first}; {second}")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
