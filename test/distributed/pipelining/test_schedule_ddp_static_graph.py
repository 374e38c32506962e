# Owner(s): ["oncall: distributed"]
"""DistributedDataParallel(static_graph=True) on the stages of a pipeline of more than
one stage is refused when the schedule initializes its stages for a backward, at
every step, with the same error on every rank and before anything is computed or
exchanged; a pipeline of one stage keeps it, and so does a DDP over a one-rank group.

Two ranks (world size 2, gloo), float64, two steps: (dp, pp) = (2, 1) under
ScheduleInterleaved1F1B (four stages per rank, fused backwards) is refused; (2, 1)
under Schedule1F1B with one stage, and (1, 2) under Schedule1F1B, ScheduleGPipe (one
stage per rank) and ScheduleInterleaved1F1B (two stages per rank) give gradients equal
to a single-process reference averaged over the replicas. The data- and
pipeline-parallel groups time out after 30 s, so a rank left waiting fails instead of
hanging."""

import torch
import torch.distributed as dist
from test_schedule_ddp import build, DP, PG_TIMEOUT
from test_schedule_ddp_manual_scale_grads import (
    data,
    loss_fn,
    N_MICROBATCHES,
    TwoRankGlooTestCase,
)
from test_schedule_ddp_metadata import N_STEPS, reference_grads
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_utils import run_tests


class ScheduleDDPStaticGraphTest(TwoRankGlooTestCase):
    def test_ddp_static_graph_several_stages(self):
        # Without the refusal, ScheduleInterleaved1F1B's stages 1-3 get wrong
        # gradients without an error.
        self.init_gloo()
        singles = [dist.new_group([r], timeout=PG_TIMEOUT) for r in range(DP)]
        pair = dist.new_group(list(range(DP)), timeout=PG_TIMEOUT)
        refused = (
            r"static_graph=True.* a pipeline of more than one stage \(stages "
            r"\[{}\] of {} on this rank\)"
        )
        for schedule_cls, n_stages, (dp, pp), dp_group, pp_group, mine in (
            (
                ScheduleInterleaved1F1B,
                4,
                (DP, 1),
                pair,
                singles[self.rank],
                [0, 1, 2, 3],
            ),
            # a one-rank DDP group: kept (its all-reduces change no value)
            (Schedule1F1B, 2, (1, DP), singles[self.rank], pair, [self.rank]),
            (ScheduleGPipe, 2, (1, DP), singles[self.rank], pair, [self.rank]),
            (
                ScheduleInterleaved1F1B,
                4,
                (1, DP),
                singles[self.rank],
                pair,
                [self.rank, self.rank + DP],
            ),
            (Schedule1F1B, 1, (DP, 1), pair, singles[self.rank], [0]),
        ):
            msg = f"{schedule_cls.__name__}, (dp, pp) = {(dp, pp)}"
            with self.subTest(msg):
                modules = build(n_stages)
                stages = [
                    PipelineStage(
                        DDP(modules[i], process_group=dp_group, static_graph=True),
                        i,
                        n_stages,
                        torch.device("cpu"),
                        group=pp_group,
                    )
                    for i in mine
                ]
                schedule = schedule_cls(
                    stages if len(stages) > 1 else stages[0],
                    n_microbatches=N_MICROBATCHES,
                    loss_fn=loss_fn,
                )
                for step in range(N_STEPS):
                    x, y = data(step, self.rank if dp > 1 else 0)
                    args = (x,) if 0 in mine else ()
                    kwargs = {"target": y} if n_stages - 1 in mine else {}
                    if n_stages > 1 and dp > 1:
                        pattern = refused.format(", ".join(map(str, mine)), n_stages)
                        with self.assertRaisesRegex(RuntimeError, pattern):
                            schedule.step(*args, **kwargs)
                        for i in mine:
                            for p in modules[i].parameters():
                                self.assertIsNone(p.grad, msg=msg)
                        continue
                    schedule.step(*args, **kwargs)
                    reference = reference_grads(build(n_stages), step, dp)
                    for i in mine:
                        for p, ref in zip(
                            modules[i].parameters(),
                            reference[i].parameters(),
                            strict=True,
                        ):
                            torch.testing.assert_close(
                                p.grad, ref.grad, msg=f"{msg}, stage {i}, step {step}"
                            )
                            p.grad = None
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
