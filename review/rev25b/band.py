"""Overlay only: the error of the wrong rule and the band (_tolerances) at the worst
element, for F1 (addfloor) and F2 (sumcancel), W = 2, mask 0."""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, "/work/wt-rev25b")
from tools import mutations as M  # noqa: E402
import torch.distributed.tensor._ops.strategy_validation as sv  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate  # noqa: E402

WS = 2
dist.init_process_group("fake", rank=0, world_size=WS)
for builder in ("review3-addfloor-sum-sum", "review3-sumcancel-sum-avg"):
    func, args, kwargs = M._constructed(builder)
    rule = next(r for b, _, _, r, _ in M.REVIEW3 if b == builder)
    ins = tuple(sv.parse_placement(p) for p in rule[0])
    out = sv.parse_placement(rule[1][0])
    gt = func(*args, **kwargs)
    tensors = sv.extract_tensors_from_args(args, kwargs)
    with LocalTensorMode(frozenset(range(WS))):
        mesh = init_device_mesh("cpu", (WS,))
        local = sv._shard_tensors(tensors, ins, WS, mesh)
        it = iter(local)
        largs = tuple(next(it) if isinstance(a, torch.Tensor) else a for a in args)
        lout = func(*largs, **kwargs)
        full = DTensor.from_local(lout, mesh, (out,), shape=gt.shape, stride=gt.stride()).redistribute(mesh, (Replicate(),)).to_local()
        full = full._local_tensors[0]
        mag = sv._per_element_magnitude(lout, out, gt, mesh, WS)
        bound = sv._magnitude_output(func, largs, kwargs)
        if bound is not None:
            b = sv._per_element_magnitude(bound, out, gt, mesh, WS)
            mag = torch.maximum(mag, b)
        atol, rtol = sv._tolerances(gt, mag, (tensors[0][1].dtype,))
    err = (gt.double() - full.double()).abs()
    i = int((err - 1e-5 * (1 + gt.double().abs())).flatten().argmax())  # worst against stock's band
    a = atol.flatten()[i].item() if isinstance(atol, torch.Tensor) else atol
    print(f"{builder} W={WS}: element worst against stock's band {i}: truth {gt.flatten()[i].item():.6g}, rule gives "
          f"{full.flatten()[i].item():.6g}, error {err.flatten()[i].item():.3g}; band atol {a:.3g} + rtol {rtol:.3g} * |truth|; "
          f"stock's band {1e-5 + 1e-5 * abs(gt.flatten()[i].item()):.3g}")
dist.destroy_process_group()
