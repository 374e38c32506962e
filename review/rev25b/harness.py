"""Ask the strategy validator about one rule on one sample, the way
`torch-overlay sweep --mutations` does (tools/mutations.check_entry): DTensor's rule
query returns the rule alone, and the validator's per-sample path
(_validate_aten_op_for_sample, incorrect-only, every mitigation) runs; killed = reported.

Plain python = stock torch; under `python -m tools.cli run --` = the overlay."""
import os

import torch.distributed as dist


def _sv():
    import torch.distributed.tensor._ops.strategy_validation as sv
    return sv


def verdict(func, args, kwargs, rule, world_size):
    sv = _sv()
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    result = func(*args, **kwargs)
    gt = sv._to_ground_truth(result)
    key = (tuple(rule[0]), tuple(rule[1]))
    original = sv._query_dtensor_rules
    sv._query_dtensor_rules = lambda *a, **k: {key}
    try:
        stats = sv.ComparisonStats()
        sv._validate_aten_op_for_sample(func, args, kwargs, gt, world_size, True, False, 0, "", stats)
    finally:
        sv._query_dtensor_rules = original
    if stats.false_positives:
        return "killed", ""
    placements = [[sv.parse_placement(p) for p in side] for side in rule]
    if any(p is None for side in placements for p in side):
        return "accepted?", "unparsed"
    with LocalTensorMode(frozenset(range(world_size))):
        mesh = init_device_mesh("cpu", (world_size,))
        valid, why = sv.validate_aten_combination(
            func, args, kwargs, gt, (tuple(placements[0]), tuple(placements[1])), world_size, mesh)
    return ("untestable" if valid is None else "accepted"), why


def run_cases(cases, world_sizes=(2, 3)):
    """cases: list of (name, func, args, kwargs, rule). Prints one line per (case, W)."""
    side = "overlay" if "torch_overlay" in str(getattr(_sv(), "__file__", "")) or os.environ.get("TORCH_OVERLAY_ACTIVE") else "stock"
    out = {}
    for ws in world_sizes:
        dist.init_process_group("fake", rank=0, world_size=ws)
        try:
            for name, func, args, kwargs, rule in cases:
                try:
                    v, why = verdict(func, args, kwargs, rule, ws)
                except Exception as e:  # noqa: BLE001
                    v, why = "error", f"{type(e).__name__}: {e}"[:200]
                out[(name, ws)] = v
                print(f"[{side}] W={ws} {name}: {rule[0]} -> {rule[1]}: {v} {why[:100]}", flush=True)
        finally:
            dist.destroy_process_group()
    return out
