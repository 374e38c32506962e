"""Where the cost of compiled ``w.to_local().t()`` goes, overlay only (patch 0039).

    python -m tools.cli run -- python benchmarks/aot_subclass_alias_floor.py [--reps N]

Compiles ``lambda w: w.to_local().t()`` with inductor on a Shard(0) DTensor (rank 0 of 2 on
the fake process group), for a training graph (a Parameter) and an inference graph (no
output requires grad). Then, in the same process, swaps the dense function that the
subclass wrapper calls and times the call with each in turn, interleaved:

- ``unwrapped``: inductor's dense function alone (what stock torch runs: its
  ``reinterpret_tensor`` alias of the local tensor is returned as is);
- ``overlay``: the patch's wrapper (replays the view on the local tensor);
- ``checks only``: the same identity/_base checks, returning inductor's alias;
- ``+ non-view tensor``: the checks, returning ``out.detach()`` (a second tensor, no view);
- ``+ Tensor.t() view``: the checks, returning ``base.t()`` (the cheapest autograd view).

Prints the median CPU us per call and the median per-repetition ratio to ``unwrapped``.
"""

from __future__ import annotations

import argparse
import gc
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--calls", type=int, default=2000)
    opts = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    seen: set[int] = set()
    for graph in ("training", "inference"):
        torch._dynamo.reset()
        weight = DTensor.from_local(torch.rand(4, 8), mesh, [Shard(0)], run_check=False)
        if graph == "training":
            weight = torch.nn.Parameter(weight)
        compiled = torch.compile(lambda w: w.to_local().t(), backend="inductor")
        for _ in range(5):
            compiled(weight)
        # the subclass wrapper's generated code calls the global compiled_fn: the
        # patch's wrapper, a closure over inductor's dense function
        gc.collect()
        (inner,) = [
            f
            for f in gc.get_objects()
            if type(f).__name__ == "function"
            and f.__code__.co_name == "inner_fn"
            and "_single" in getattr(f.__globals__.get("compiled_fn"), "__qualname__", "")
            and id(f) not in seen
        ]
        seen.add(id(inner))
        env = inner.__globals__
        wrapper = env["compiled_fn"]
        cells = dict(
            zip(
                wrapper.__code__.co_freevars,
                (c.cell_contents for c in wrapper.__closure__),
                strict=True,
            )
        )
        dense, out_idx, base_idx = cells["compiled_fn"], cells["out_idx"], cells["base_idx"]

        def checked(make, dense=dense, out_idx=out_idx, base_idx=base_idx):
            def call(args):
                base = args[base_idx]
                outs = dense(args)
                out = outs[out_idx]
                root = base._base
                if root is None:
                    root = base
                if out is base or out._base is not root:
                    outs = list(outs)
                    outs[out_idx] = make(base, out)
                return outs

            return call

        variants = {
            "unwrapped (stock behaviour)": dense,
            "overlay": wrapper,
            "checks only": checked(lambda base, out: out),
            "+ non-view tensor": checked(lambda base, out: out.detach()),
            "+ Tensor.t() view": checked(lambda base, out: base.t()),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(opts.reps):
            for name, fn in variants.items():
                env["compiled_fn"] = fn
                for _ in range(200):
                    compiled(weight)
                start = time.process_time()
                for _ in range(opts.calls):
                    compiled(weight)
                times[name].append((time.process_time() - start) / opts.calls * 1e6)
        env["compiled_fn"] = wrapper
        ref = times["unwrapped (stock behaviour)"]
        for name, values in times.items():
            ratios = sorted(a / b for a, b in zip(values, ref, strict=True))
            med = sorted(values)[len(values) // 2]
            print(f"{graph:9s} {name:30s} {med:6.2f} us  {ratios[len(ratios) // 2]:.3f}x")


if __name__ == "__main__":
    main()
