"""Open item, overlay only: which of the validator's checks rejects add(P(max), P(min))
-> P(avg) on add's scalar sample 0/0 (the one stock's ground truth calls valid)."""
import sys

import torch.distributed as dist

sys.path.insert(0, "/work/wt-rev25b")
import torch.distributed.tensor._ops.strategy_validation as sv  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.placement_types import Partial  # noqa: E402

from tools import mutations as M  # noqa: E402

WS = 2
M._setup_sizes()
dist.init_process_group("fake", rank=0, world_size=WS)
s_id, func, args, kwargs, result = M.opinfo_samples("add", "float32", max_samples=1)[0]
gt = sv._to_ground_truth(result)
print("sample", s_id, [a for a in args], kwargs, "ground truth", gt)
mit = sv._prepare_aten_mitigations(func, args, kwargs)
for ins in ((Partial("max"), Partial("min")), (Partial("min"), Partial("max"))):
    combo = (ins, (Partial("avg"),))
    with LocalTensorMode(frozenset(range(WS))):
        mesh = init_device_mesh("cpu", (WS,))
        checks = [("main split, mask 0", dict()), ("main split, mask 1", dict(mask_shift=1))]
        for name, kw in checks:
            print(f"  {ins} -> P(avg) {name}:", sv.validate_aten_combination(func, args, kwargs, gt, combo, WS, mesh, **kw))
        print(f"  {ins} -> P(avg) negated:", sv.validate_aten_combination(func, mit.negated_args, mit.negated_kwargs, mit.negated_ground_truth, combo, WS, mesh))
        for shift in (0, 1):
            print(f"  {ins} -> P(avg) in-range min/max bumps (0035), mask {shift}:",
                  sv.validate_aten_combination(func, args, kwargs, gt, combo, WS, mesh, mask_shift=shift, in_range_min_max=True))
dist.destroy_process_group()
