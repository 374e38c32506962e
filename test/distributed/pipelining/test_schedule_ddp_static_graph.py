# Owner(s): ["oncall: distributed"]
"""DistributedDataParallel(static_graph=True) on a stage past the first of a pipeline
is refused when the schedule initializes its stages for a backward, at every step,
with the same error on every rank (also on the ranks whose own stages do not have
the option) and before anything is computed or exchanged; the first stage keeps it,
and so does a DDP over a one-rank group unless its user finalizes the backward. The pipeline ranks agree in the all-reduce
that the schedule already runs when it initializes its stages: no other collective,
and none in later steps.

Four ranks (world size 4, gloo), float64, two steps: at (dp, pp) = (2, 2) under
Schedule1F1B, the option on stage 0 only gives gradients equal to a single-process
reference averaged over the replicas, with one all-reduce over the pipeline group
in the first step and none in the second; the option on stage 1 only, or on both
stages, is refused on all four ranks. (4, 1) under ScheduleInterleaved1F1B (four
stages per rank) is refused; (4, 1) under Schedule1F1B with one stage, and (1, 4)
under Schedule1F1B, ScheduleGPipe (one stage per rank) and ScheduleInterleaved1F1B
(two stages per rank) give the reference gradients; (1, 4) under Schedule1F1B with
the user's manual finalization is refused on all four ranks. The data- and pipeline-parallel
groups time out after 30 s, so a rank left waiting fails instead of hanging."""

from datetime import timedelta
from unittest import mock

import torch
import torch.distributed as dist
from test_schedule_ddp_manual_scale_grads import (
    data,
    loss_fn,
    N_MICROBATCHES,
    TwoRankGlooTestCase,
)
from test_schedule_ddp_metadata import build, N_STEPS, run_and_compare
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_utils import run_tests

PG_TIMEOUT = timedelta(seconds=30)
WORLD = 4


class ScheduleDDPStaticGraphTest(TwoRankGlooTestCase):
    @property
    def world_size(self) -> int:
        return WORLD

    def groups(self, dp, pp):
        """This rank's data- and pipeline-parallel groups for (dp, pp), rank =
        dp_rank * pp + pp_rank; every rank creates every group, in one order."""
        dp_groups = [
            dist.new_group(list(range(r, WORLD, pp)), timeout=PG_TIMEOUT)
            for r in range(pp)
        ]
        pp_groups = [
            dist.new_group(list(range(r * pp, (r + 1) * pp)), timeout=PG_TIMEOUT)
            for r in range(dp)
        ]
        return dp_groups[self.rank % pp], pp_groups[self.rank // pp]

    def test_ddp_static_graph(self):
        # Without the refusal, the stages past the first get wrong gradients
        # without an error; refused on the ranks that have the option only, the
        # others would wait in the schedule's first exchange.
        self.init_gloo()
        refused = (
            r"static_graph=True\) is not supported on the stages of a pipeline "
            r"past the first: stages \[{}\] of {} have it"
        )
        all_reduce = dist.all_reduce
        for schedule_cls, per_rank, (dp, pp), static, rejected, manual in (
            (Schedule1F1B, 1, (2, 2), {0}, None, False),
            (Schedule1F1B, 1, (2, 2), {1}, [1], False),
            (Schedule1F1B, 1, (2, 2), {0, 1}, [1], False),
            (ScheduleInterleaved1F1B, 4, (4, 1), {0, 1, 2, 3}, [1, 2, 3], False),
            (Schedule1F1B, 1, (4, 1), {0}, None, False),
            # a one-rank DDP group: kept (its all-reduces change no value)
            (Schedule1F1B, 1, (1, 4), {0, 1, 2, 3}, None, False),
            (ScheduleGPipe, 1, (1, 4), {0, 1, 2, 3}, None, False),
            (ScheduleInterleaved1F1B, 2, (1, 4), set(range(8)), None, False),
            # ... unless its user finalizes the backward: DDP then fails on the
            # ranks of the stages past the first while the others wait
            (Schedule1F1B, 1, (1, 4), {0, 1, 2, 3}, [1, 2, 3], True),
        ):
            name = (
                f"{schedule_cls.__name__}, (dp, pp) = {(dp, pp)}, static {static}"
                f"{', manual finalization' if manual else ''}"
            )
            with self.subTest(name):
                dp_group, pp_group = self.groups(dp, pp)
                dp_rank, pp_rank = self.rank // pp, self.rank % pp
                n_stages = per_rank * pp
                layout = list(range(pp_rank, n_stages, pp))  # looped
                modules = build(n_stages)
                stages = [
                    PipelineStage(
                        DDP(
                            modules[i], process_group=dp_group, static_graph=i in static
                        ),
                        i,
                        n_stages,
                        torch.device("cpu"),
                        group=pp_group,
                    )
                    for i in layout
                ]
                for stage in stages:
                    stage.submod.require_manual_backward_finalization = manual
                schedule = schedule_cls(
                    stages if per_rank > 1 else stages[0],
                    n_microbatches=N_MICROBATCHES,
                    loss_fn=loss_fn,
                    # manual finalization refuses scale_grads=True (its own check)
                    scale_grads=not manual,
                )
                if rejected is not None:
                    pattern = refused.format(", ".join(map(str, rejected)), n_stages)
                    for step in range(N_STEPS):
                        x, y = data(step, dp_rank)
                        with self.assertRaisesRegex(RuntimeError, pattern):
                            schedule.step(
                                *((x,) if 0 in layout else ()),
                                **({"target": y} if n_stages - 1 in layout else {}),
                            )
                        for i in layout:
                            for p in modules[i].parameters():
                                self.assertIsNone(p.grad, msg=name)
                else:
                    pp_reduces = []

                    def counting(tensor, *args, group=None, **kwargs):
                        if group is pp_group:
                            pp_reduces.append(tensor.numel())
                        return all_reduce(tensor, *args, group=group, **kwargs)

                    counts = []
                    with mock.patch.object(dist, "all_reduce", counting):
                        run_and_compare(
                            self,
                            schedule,
                            modules,
                            layout,
                            dp_rank,
                            dp,
                            name,
                            on_step=lambda step: counts.append(len(pp_reduces)),
                        )
                    if pp > 1:
                        # The flags travel in the schedule's metadata-mode vote
                        # (one int per stage after the mode's; a later PR adds
                        # one more per stage): one all-reduce, in the first
                        # step only, and none in the second.
                        votes = [k for k in pp_reduces if k > 1]
                        self.assertEqual(len(votes), 1, msg=name)
                        self.assertGreaterEqual(votes[0], 1 + n_stages, msg=name)
                        self.assertEqual(counts[1], counts[0], msg=name)
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
