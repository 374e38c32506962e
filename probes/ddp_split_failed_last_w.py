"""2 gloo replicas, ScheduleZBVZeroBubble, every stage DDP: a user
post-accumulate-grad hook raises in the last stage's last weight backward (after
the schedule armed DDP's reducer) at step 0; then a plain DDP forward/backward of
that stage's module. Prints, per rank: the option's value after the failure and
whether the plain backward raised, or else the bucket hand-offs and whether the
ranks' w.grad are equal.

    python -m tools.cli run -- python probes/ddp_split_failed_last_w.py

(the guard of "[pipelining] Reduce a DDP stage's gradients in its last weight
backward with finalize_backward()" makes the plain forward raise; with it removed
the ranks' w.grad differ without an error)."""

import os
import sys

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "test", "distributed", "pipelining"
    ),
)
import torch
import torch.distributed as dist
from test_schedule_ddp import DP, DDPUsageRunner
from test_schedule_ddp_manual_scale_grads import N_MICROBATCHES, TwoRankGlooTestCase, data
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble
from torch.testing._internal.common_utils import run_tests


class Probe(DDPUsageRunner, TwoRankGlooTestCase):
    def test_probe(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        modules, ddps, comms, make = self._usage_setup(ScheduleZBVZeroBubble, *groups)
        n = []

        def hook(p):
            n.append(1)
            if len(n) == N_MICROBATCHES:
                raise RuntimeError("user hook")

        h = modules[-1].w.register_post_accumulate_grad_hook(hook)
        x, y = data(0, self.rank)
        try:
            make().step(x, target=y)
        except RuntimeError as e:
            print(f"PROBE rank{self.rank} step0: {str(e)[:60]}", flush=True)
        h.remove()
        print(
            f"PROBE rank{self.rank} option {ddps[-1].require_manual_backward_finalization}",
            flush=True,
        )
        for p in modules[-1].parameters():
            p.grad = None
        comms.clear()
        try:
            ddps[-1](x).sum().backward()
            g = modules[-1].w.grad.clone()
            other = [torch.zeros_like(g) for _ in range(2)]
            dist.all_gather(other, g, group=groups[0])
            print(
                f"PROBE rank{self.rank} plain fwd/bwd: no error, comms {[c[:2] for c in comms]}, ranks' w.grad equal: {torch.equal(other[0], other[1])}",
                flush=True,
            )
        except RuntimeError as e:
            print(f"PROBE rank{self.rank} plain fwd/bwd raised: {str(e)[:120]}", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
