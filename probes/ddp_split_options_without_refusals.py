"""2 gloo replicas, 2 steps, float64 reference: static_graph (but under
ScheduleZBVZeroBubble), find_unused_parameters and a dw_builder DDP stage under
ScheduleZBVZeroBubble, ScheduleDualPipeV and ScheduleInterleavedZeroBubble, each
case's outcome printed per rank (ok, or the first line of the error) instead of
raised. Written to show what these setups do without "[pipelining] Refuse DDP
options that a split weight backward cannot reduce at the first step"; with it,
each split case is that PR's refusal.

    python -m tools.cli run -- python probes/ddp_split_options_without_refusals.py
"""

import os
import sys

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "test", "distributed", "pipelining"
    ),
)
import torch.distributed as dist
from test_schedule_ddp import DP, DDPStagesRunner, DDPUsageRunner
from test_schedule_ddp_manual_scale_grads import TwoRankGlooTestCase
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.testing._internal.common_utils import run_tests


class Probe(DDPStagesRunner, DDPUsageRunner, TwoRankGlooTestCase):
    def test_probe(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        rows = []
        for cfg in ("static_graph", "find_unused_parameters", "dw_builder"):
            for s in (ScheduleZBVZeroBubble, ScheduleDualPipeV, ScheduleInterleavedZeroBubble):
                if (cfg, s) == ("static_graph", ScheduleZBVZeroBubble):
                    continue
                try:
                    if cfg == "dw_builder":
                        modules, ddps, comms, make = self._usage_setup(
                            s, *groups, stage_kwargs={"dw_builder": lambda: lambda: None}
                        )
                        self._usage_steps("dw", make(), modules, ddps, comms)
                    else:
                        self._run_schedule(
                            s,
                            {cfg: True},
                            *groups,
                            name=cfg,
                            with_unused=cfg == "find_unused_parameters",
                        )
                    rows.append((cfg, s.__name__, "ok"))
                except BaseException as e:
                    rows.append(
                        (cfg, s.__name__, f"{type(e).__name__}: {str(e).splitlines()[0][:150]}")
                    )
                    print(f"PROBE rank{self.rank} {rows[-1]}", flush=True)
                dist.barrier()
        for r in rows:
            print(f"PROBE rank{self.rank} {r}", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
