"""(dp, pp) = (2, 2), 4 gloo ranks: every (DDP option, schedule) case of
test_schedule_ddp.py's test_ddp_stages_dp2_pp2 and
test_schedule_ddp_unsupported_options.py's test_ddp_options_dp2_pp2 run one by
one, each on fresh process groups with a short timeout, its outcome recorded instead of raised, so
that one failing case does not hide the others (the test stops at the first).
Also static_graph under the fused schedules, which the test leaves out.

    python probes/ddp_pp2_options.py                     # torch 2.15.0
    python -m tools.cli run -- python probes/ddp_pp2_options.py   # the series

Prints one line per case and rank: ok, or the first line of the error."""

import os
import sys
import tempfile
import time
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test", "distributed", "pipelining"))

CASE_TIMEOUT = timedelta(seconds=10)


def worker(rank, store_path, out_dir):
    import test_schedule_ddp as t
    import test_schedule_ddp_unsupported_options as u

    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, 4),
        rank=rank,
        world_size=4,
        timeout=timedelta(seconds=120),
    )
    case = t.ScheduleDDPFourRankTest("test_ddp_stages_dp2_pp2")
    case.rank = rank
    lines = []
    # DDP option -> the schedules that refuse it (the refusals' own test file).
    configs = {"default": set(), "gradient_as_bucket_view": set(), **u.PP2_REFUSED}
    for config, refused in configs.items():
        for schedule_cls in t.PP2_SCHEDULES:
            dp_groups = [dist.new_group([r, r + 2], timeout=CASE_TIMEOUT) for r in (0, 1)]
            pp_groups = [dist.new_group([r, r + 1], timeout=CASE_TIMEOUT) for r in (0, 2)]
            groups = dp_groups[rank % 2], pp_groups[rank // 2]
            start = time.monotonic()
            try:
                case._run_dp2_pp2(schedule_cls, config, *groups, refused=schedule_cls in refused)
                result = "ok"
            except Exception as error:  # noqa: BLE001
                text = " ".join(str(error).split())
                result = f"{type(error).__name__}: {text[:300]}"
            lines.append(
                f"{config:24s} {schedule_cls.__name__:30s} rank {rank} "
                f"({time.monotonic() - start:4.1f} s) {result}"
            )
            dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out_dir:
        store = os.path.join(out_dir, "store")
        mp.spawn(worker, args=(store, out_dir), nprocs=4)
        rows = []
        for rank in range(4):
            with open(os.path.join(out_dir, f"rank{rank}.txt")) as f:
                rows += f.read().splitlines()
    # group by case, ranks in order
    for row in sorted(rows, key=lambda r: (r[:56], r[56:64])):
        print(row)
