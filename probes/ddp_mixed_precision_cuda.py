"""Probe: DDP mixed precision with several forwards before a backward, on a real GPU.

The CPU probe ``ddp_mixed_precision_forwards.py`` needs stand-ins for the stream and
event calls of DDP's mixed-precision path. This one runs that path as it is, on one
CUDA device with one NCCL rank, and needs no overlay (it exercises DDP alone, so any
torch with ``_MixedPrecision`` will do). For k = 1, 2, 3, 4:

* "sum": k forwards, then one backward of the summed outputs;
* "no_sync": k - 1 forwards and backwards under ``no_sync()``, then one more (the
  gradient-accumulation pattern, one backward per forward);
* "fwd-then-bwd": k forwards (the first k - 1 under ``no_sync()``), then k backwards,
  the last one outside ``no_sync()`` (what a pipeline schedule does with micro-batches).

Prints per case whether DDP raised, and the largest gradient error against the
float64 sum of the per-forward gradients.

    python probes/ddp_mixed_precision_cuda.py

Seen on one H100 (torch 2.11.0+cu130, the only torch that machine had): every pattern
raises "Expected to mark a variable ready only once" from k = 2 on, as the CPU probe
predicted, so micro-batched pipelining cannot use DDP mixed precision without a DDP
change. With k = 1 DDP did not raise, but the fp32 gradients were far off the reference
(max error 4.49; on the CPU with the stand-ins they hold uninitialised-looking values):
not investigated further, DDP's own (private) mixed-precision path.
"""

import contextlib
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.parallel.distributed import _MixedPrecision


def reference_grad(inputs):
    torch.manual_seed(0)
    module = torch.nn.Linear(8, 8).double().cuda()
    sum(module(x.double()).sum() for x in inputs).backward()
    return [p.grad for p in module.parameters()]


def run(pattern, k):
    torch.manual_seed(0)
    module = torch.nn.Linear(8, 8).cuda()
    ddp = DDP(module, mixed_precision=_MixedPrecision(param_dtype=torch.bfloat16))
    inputs = [torch.randn(4, 8, device="cuda") for _ in range(k)]
    if pattern == "sum":
        sum(ddp(x).float().sum() for x in inputs).backward()
    elif pattern == "no_sync":
        for i, x in enumerate(inputs):
            ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
            with ctx:
                ddp(x).float().sum().backward()
    else:
        outs = []
        for i, x in enumerate(inputs):
            ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
            with ctx:
                outs.append(ddp(x).float().sum())
        for i, out in enumerate(outs):
            ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
            with ctx:
                out.backward()
    torch.cuda.synchronize()
    ref = reference_grad(inputs)
    return max(
        (p.grad.double() - r).abs().max().item()
        for p, r in zip(module.parameters(), ref, strict=True)
    )


def main():
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        torch.cuda.set_device(0)
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
        for pattern in ("sum", "no_sync", "fwd-then-bwd"):
            for k in (1, 2, 3, 4):
                try:
                    result = f"max grad error {run(pattern, k):.2e} (bf16 params)"
                except RuntimeError as e:
                    result = "RAISED " + str(e).split(".")[0]
                print(f"{pattern}, {k} forward(s): {result}")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
