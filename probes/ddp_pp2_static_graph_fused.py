"""(dp, pp) = (2, 2), 4 gloo ranks, every stage DDP(static_graph=True) under the
fused schedules Schedule1F1B and ScheduleInterleaved1F1B (the static_graph refusal
of the zero-bubble schedules names Schedule1F1B as an alternative): for two steps,
per rank and stage, the largest difference of each gradient from the float64
reference averaged over the replicas, and the bucket indices handed to the comm
hook. Errors are recorded, not raised.

    python probes/ddp_pp2_static_graph_fused.py                     # torch 2.15.0
    python -m tools.cli run -- python probes/ddp_pp2_static_graph_fused.py
"""

import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test", "distributed", "pipelining"))


def worker(rank, store_path, out_dir):
    import test_schedule_ddp as t
    from torch.distributed.pipelining import PipelineStage

    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, 4),
        rank=rank,
        world_size=4,
        timeout=timedelta(seconds=60),
    )
    lines = []
    dp_rank, pp_rank = divmod(rank, 2)
    for schedule_cls in (t.Schedule1F1B, t.ScheduleInterleaved1F1B):
        dp_groups = [dist.new_group([r, r + 2], timeout=timedelta(seconds=10)) for r in (0, 1)]
        pp_groups = [dist.new_group([r, r + 1], timeout=timedelta(seconds=10)) for r in (0, 2)]
        dp_group, pp_group = dp_groups[rank % 2], pp_groups[rank // 2]
        per_rank = t.PP2_SCHEDULES[schedule_cls][0]
        n_stages = 2 * per_rank
        layout = list(range(pp_rank, n_stages, 2))
        modules = t.build(n_stages)
        calls = {i: [] for i in layout}
        stages = [
            PipelineStage(
                t.recording_ddp(modules[i], dp_group, calls[i], (), static_graph=True),
                i,
                n_stages,
                torch.device("cpu"),
                group=pp_group,
            )
            for i in layout
        ]
        schedule = schedule_cls(
            stages if per_rank > 1 else stages[0],
            n_microbatches=t.N_MICROBATCHES,
            loss_fn=t.loss_fn,
        )
        name = schedule_cls.__name__
        try:
            for step in range(t.N_STEPS):
                for c in calls.values():
                    c.clear()
                x, y = t.data(step, dp_rank)
                args = (x,) if 0 in layout else ()
                kwargs = {"target": y} if n_stages - 1 in layout else {}
                schedule.step(*args, **kwargs)
                ref = t.reference_grads(t.build(n_stages), step, 2)
                for i in layout:
                    diffs = {
                        n: f"{(p.grad - r.grad).abs().max().item():.3g}"
                        for (n, p), r in zip(
                            modules[i].named_parameters(), ref[i].parameters(), strict=True
                        )
                    }
                    for p in modules[i].parameters():
                        p.grad = None
                    hand = [b for b, _ in calls[i]]
                    lines.append(
                        f"{name:24s} rank {rank} step {step} stage {i}: "
                        f"max|grad - ref| {diffs} buckets handed {hand}"
                    )
        except Exception as error:  # noqa: BLE001
            lines.append(
                f"{name:24s} rank {rank}: {type(error).__name__}: "
                f"{' '.join(str(error).split())[:200]}"
            )
        dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(os.path.join(out_dir, "store"), out_dir), nprocs=4)
        rows = []
        for rank in range(4):
            with open(os.path.join(out_dir, f"rank{rank}.txt")) as f:
                rows += f.read().splitlines()
    for row in sorted(rows):
        print(row)
