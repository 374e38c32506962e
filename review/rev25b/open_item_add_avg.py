"""Open item: full-mode ground truth for aten.add: is add(P(max), P(min)) -> P(avg)
valid? Checks each add OpInfo sample (sizes as the validator's CLI sets) with the
validator's mitigated path, for the two rules, and shows the per-rank arithmetic."""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, "/work/wt-rev25b")
import torch.distributed.tensor._ops.strategy_validation as sv  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.placement_types import Partial  # noqa: E402

from tools import mutations as M  # noqa: E402

WS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
M._setup_sizes()
dist.init_process_group("fake", rank=0, world_size=WS)
side = "overlay" if "torch-overlay" in sv.__file__ else "stock"
for s_id, func, args, kwargs, result in M.opinfo_samples("add", "float32", max_samples=20):
    tensors = sv.extract_tensors_from_args(args, kwargs)
    if len(tensors) != 2 or tensors[0][1].shape != tensors[1][1].shape:
        continue
    gt = sv._to_ground_truth(result)
    mit = sv._prepare_aten_mitigations(func, args, kwargs)
    for ins in ((Partial("max"), Partial("min")), (Partial("min"), Partial("max"))):
            with LocalTensorMode(frozenset(range(WS))):
                mesh = init_device_mesh("cpu", (WS,))
                v = sv._validate_aten_with_mitigations(func, args, kwargs, ins, (Partial("avg"),), gt, WS, mesh, mit)
            w = M.witness(func, args, kwargs, ((str(ins[0]), str(ins[1])), ("P(avg)",)), torch.float32, WS)
            print(f"[{side}] W={WS} sample {s_id} shapes {[list(t.shape) for _, t in tensors]} kwargs {kwargs} "
                  f"{ins[0]},{ins[1]} -> P(avg): {'VALID' if v else v}; oracle: {w[:90] or 'no witness'}")
dist.destroy_process_group()
