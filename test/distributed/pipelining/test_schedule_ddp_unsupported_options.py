# Owner(s): ["oncall: distributed"]
"""DDP options that a split (dX/dW) last backward cannot support are refused at the
first step, with the same clear error on every rank, before anything is computed
or exchanged: find_unused_parameters where a stage's last backward is a separate
weight pass, static_graph on such a stage (stage 0's weight pass runs its whole
backward: it keeps both options), and a DDP stage with a dw_builder whose last
backward is a weight pass.

Two data-parallel replicas (world size 2, gloo), each holding every stage, two
steps: where a schedule ends every stage's backward fused (ScheduleInterleaved1F1B,
and ScheduleDualPipeV with every stage on one rank), find_unused_parameters is not
refused and every rank's gradients equal a float64 single-process reference
averaged over the replicas, with each bucket handed to the comm hook once per step.
The refusals also hold for a _PipelineScheduleRuntime that loads the schedule's
compute+comms CSV, and at (dp, pp) = (2, 2) on four ranks (every rank refuses,
then all meet at a barrier; find_unused_parameters works under the fused
ScheduleInterleaved1F1B and Schedule1F1B). A DDP over a one-rank group (dp, pp) =
(1, 2) is not refused: its all-reduces change no value, and the grads equal the
reference. Only DDP stages with the option are
refused: stage 0 alone with find_unused_parameters or static_graph (its W runs the
whole backward) works. NoDDPStageTest (one process): a schedule without a DDP stage does not look
at its actions for DDP at a step."""

from unittest import mock

import torch
import torch.distributed as dist
from test_schedule_ddp import (
    build,
    DDPFourRankRunner,
    DDPStagesRunner,
    DDPUsageRunner,
    DP,
    PP2_SCHEDULES,
    SCHEDULES,
    SPLIT,
)
from test_schedule_ddp_manual_scale_grads import (
    Block,
    data,
    DIM,
    loss_fn,
    N_MICROBATCHES,
    TwoRankGlooTestCase,
)
from test_schedule_ddp_metadata import N_STEPS, reference_grads
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_utils import run_tests, TestCase

# Options refused where a stage's last backward is split, by schedule; their error
# names the option. DualPipeV with every stage on one rank ends each stage with a
# fused backward (stage 0's W runs the whole backward), so find_unused_parameters
# works there; static_graph is refused on the stages past the first under every
# split schedule (here every stage has it; under ScheduleDualPipeV on one rank by
# the rule of test_schedule_ddp_static_graph.py, whose error also names it).
REFUSED = {
    "find_unused_parameters": {ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble},
    "static_graph": SPLIT,
}


class ScheduleDDPUnsupportedOptionsTest(
    DDPStagesRunner, DDPUsageRunner, TwoRankGlooTestCase
):
    def test_ddp_options_split_backward(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for config, refused in REFUSED.items():
            # find_unused_parameters with a parameter no micro-batch uses.
            kwargs = {"with_unused": config == "find_unused_parameters"}
            for schedule_cls in SCHEDULES:
                if config == "static_graph" and schedule_cls not in SPLIT:
                    # Fused backward with static_graph: refused on its own
                    # (test_schedule_ddp_static_graph.py).
                    continue
                with self.subTest(config=config, schedule=schedule_cls.__name__):
                    if schedule_cls in refused:
                        self._run_refused(
                            schedule_cls,
                            {config: True},
                            *groups,
                            f"{config}=True",
                            **kwargs,
                        )
                    else:
                        self._run_schedule(
                            schedule_cls, {config: True}, *groups, name=config, **kwargs
                        )
                dist.barrier()
        # The refusals hold for the actions a runtime executes: its compute+comms
        # order loaded from a CSV (without them, find_unused_parameters fails
        # mid-step with "Expected to mark a variable ready only once").
        for config, schedule_cls in (
            ("find_unused_parameters", ScheduleZBVZeroBubble),
            ("find_unused_parameters", ScheduleInterleavedZeroBubble),
            ("static_graph", ScheduleZBVZeroBubble),
        ):
            with self.subTest(config=config, schedule=schedule_cls.__name__, csv=True):
                self._run_refused(
                    schedule_cls,
                    {config: True},
                    *groups,
                    f"{config}=True",
                    with_unused=config == "find_unused_parameters",
                    csv=True,
                )
            dist.barrier()
        dist.destroy_process_group()

    def test_ddp_dw_builder_refused(self):
        # A DDP stage whose weight gradients a dw_builder computes (DDP does not
        # see them) is refused under the split schedules, before anything is
        # handed to the comm hook.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls in SCHEDULES:
            if schedule_cls not in SPLIT:
                continue
            with self.subTest(schedule=schedule_cls.__name__):
                _, _, comms, make_schedule = self._usage_setup(
                    schedule_cls,
                    *groups,
                    scale_grads=True,
                    stage_kwargs={"dw_builder": lambda: lambda: None},
                )
                x, y = data(0, self.rank)
                with self.assertRaisesRegex(RuntimeError, "dw_builder"):
                    make_schedule().step(x, target=y)
                self.assertEqual(comms, [])
            dist.barrier()
        dist.destroy_process_group()

    def test_ddp_one_rank_data_parallel_group_pp2(self):
        # (dp, pp) = (1, 2): DDP over a one-rank data-parallel group, whose
        # all-reduces change no value. Nothing is refused (the options are
        # refused only over a group of more than one rank), a stage's last W
        # does not drive DDP's reducer, and every stage's grads equal the
        # reference in both steps. V layout: rank 0 holds stages 0 and 3, rank 1
        # stages 1 and 2 (their last backwards are split W's). Cases:
        # (schedule, DDP options, stages that have them, with_unused); the other
        # stages are DDP without options.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (1, DP), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        mine = {0: [0, 3], 1: [1, 2]}[self.rank]
        for schedule_cls, options, option_stages, with_unused in (
            (ScheduleZBVZeroBubble, {}, set(), False),
            (ScheduleZBVZeroBubble, {"static_graph": True}, {0, 1, 2, 3}, False),
            (
                ScheduleZBVZeroBubble,
                {"find_unused_parameters": True},
                {0, 1, 2, 3},
                True,
            ),
            (ScheduleDualPipeV, {"static_graph": True}, {0}, False),
            (
                ScheduleDualPipeV,
                {"find_unused_parameters": True},
                {0, 1, 2, 3},
                True,
            ),
        ):
            msg = f"{schedule_cls.__name__}, {options}, stages {sorted(option_stages)}"
            with self.subTest(msg):
                modules = build(4, with_unused=with_unused)
                stages = [
                    PipelineStage(
                        DDP(
                            modules[i],
                            process_group=dp_group,
                            **(options if i in option_stages else {}),
                        ),
                        i,
                        4,
                        torch.device("cpu"),
                        group=pp_group,
                    )
                    for i in mine
                ]
                schedule = schedule_cls(
                    stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                )
                for step in range(N_STEPS):
                    if self.rank == 0:
                        x, y = data(step, 0)
                        schedule.step(x, target=y)
                    else:
                        schedule.step()
                    reference = reference_grads(
                        build(4, with_unused=with_unused), step, 1
                    )
                    for i in mine:
                        for (name, p), (_, ref_p) in zip(
                            modules[i].named_parameters(),
                            reference[i].named_parameters(),
                            strict=True,
                        ):
                            where = f"{msg}, step {step}, stage {i}, {name}"
                            if ref_p.grad is None:
                                self.assertIsNone(p.grad, msg=where)
                            else:
                                torch.testing.assert_close(
                                    p.grad, ref_p.grad, msg=where
                                )
                            p.grad = None
            dist.barrier()
        # A user who enabled DDP's manual finalization keeps a one-rank stage's
        # last W arming DDP (their finalize_backward() expects a reduction), so
        # static_graph there is refused on both ranks before anything runs, as
        # over more ranks (it failed mid-step in DDP, one rank waiting).
        with self.subTest("ScheduleZBVZeroBubble, manual finalization, static_graph"):
            modules = build(4)
            ddps = [
                DDP(modules[i], process_group=dp_group, static_graph=True) for i in mine
            ]
            for ddp in ddps:
                ddp.require_manual_backward_finalization = True
            schedule = ScheduleZBVZeroBubble(
                [
                    PipelineStage(ddp, i, 4, torch.device("cpu"), group=pp_group)
                    for ddp, i in zip(ddps, mine, strict=True)
                ],
                n_microbatches=N_MICROBATCHES,
                loss_fn=loss_fn,
                scale_grads=False,
            )
            x, y = data(0, 0)
            with self.assertRaisesRegex(RuntimeError, "static_graph=True"):
                if self.rank == 0:
                    schedule.step(x, target=y)
                else:
                    schedule.step()
        dist.barrier()
        dist.destroy_process_group()

    def test_ddp_static_graph_on_stage_0_only(self):
        # Only stage 0 (whose last backward, its W, runs the whole backward, as
        # under a fused schedule) is DDP(static_graph=True).
        self._check_option_on_stage_0_only(
            [cls for cls in SCHEDULES if cls in SPLIT], "static_graph"
        )

    def test_ddp_find_unused_on_stage_0_only(self):
        # Under ScheduleZBVZeroBubble and ScheduleInterleavedZeroBubble only
        # stage 0 (whose last backward, its W, runs the whole backward) is
        # DDP(find_unused_parameters=True), with an unused parameter.
        self._check_option_on_stage_0_only(
            [ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble],
            "find_unused_parameters",
            with_unused=True,
        )

    def _check_option_on_stage_0_only(self, schedules, option, with_unused=False):
        # (dp, pp) = (2, 1): stage 0 is DDP with `option` set; the other stages,
        # whose last backward is split, are plain modules (their grads
        # all-reduced by hand) or DDP with the default options. Nothing is
        # refused, and every stage's grads equal the float64 reference in both
        # steps (an unused parameter of stage 0 keeps no grad).
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls in schedules:
            for rest in ("plain", "ddp"):
                n_stages = SCHEDULES[schedule_cls]
                modules = build(n_stages)
                if with_unused:
                    modules[0].unused = torch.nn.Parameter(
                        torch.ones(DIM, dtype=torch.float64)
                    )
                wrapped = [
                    DDP(module, process_group=dp_group, **{option: i == 0})
                    if i == 0 or rest == "ddp"
                    else module
                    for i, module in enumerate(modules)
                ]
                stages = [
                    PipelineStage(m, i, n_stages, torch.device("cpu"), group=pp_group)
                    for i, m in enumerate(wrapped)
                ]
                schedule = schedule_cls(
                    stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                )
                for step in range(N_STEPS):
                    msg = f"{schedule_cls.__name__}, rest {rest}, step {step}"
                    x, y = data(step, self.rank)
                    schedule.step(x, target=y)
                    reference = reference_grads(build(n_stages), step, DP)
                    if with_unused:
                        self.assertIsNone(modules[0].unused.grad, msg=msg)
                    for i, (module, ref) in enumerate(
                        zip(modules, reference, strict=True)
                    ):
                        for p, ref_p in zip(
                            [module.w, module.b], ref.parameters(), strict=True
                        ):
                            if rest == "plain" and i > 0:
                                dist.all_reduce(p.grad, group=dp_group)
                                p.grad /= DP
                            torch.testing.assert_close(
                                p.grad, ref_p.grad, msg=f"{msg}, stage {i}"
                            )
                            p.grad = None
                dist.barrier()
        dist.destroy_process_group()


class NoDDPStageTest(TestCase):
    def test_no_ddp_stage_no_action_walk(self):
        # A step with a backward walks the executed actions to decide how DDP
        # stages reduce (about 0.45 us per action); without a DDP stage on the
        # rank it does not. The DDP control shows the walk is observed.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            for use_ddp in (False, True):
                with self.subTest(ddp=use_ddp):
                    torch.manual_seed(0)
                    modules = [Block() for _ in range(2)]
                    if use_ddp:
                        modules = [DDP(module) for module in modules]
                    stages = [
                        PipelineStage(module, i, 2, torch.device("cpu"))
                        for i, module in enumerate(modules)
                    ]
                    schedule = ScheduleZBVZeroBubble(
                        stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                    )
                    x, y = data(0, 0)
                    with mock.patch.object(
                        schedule, "_executed_order", wraps=schedule._executed_order
                    ) as walk:
                        schedule.step(x, target=y)
                    self.assertEqual(walk.call_count > 0, use_ddp)
        finally:
            dist.destroy_process_group()


# DDP options at (dp, pp) = (2, 2) -> the schedules that refuse them. With more
# than one pipeline rank every stage of ScheduleDualPipeV but stage 0 ends with a
# split W, so find_unused_parameters is refused there too (every rank refuses,
# also the one whose own stages end fused); it works under the fused schedules
# (with a parameter no micro-batch uses). static_graph under a fused schedule is
# refused on its own (test_schedule_ddp_static_graph.py) and is not run here.
PP2_REFUSED = {
    "find_unused_parameters": SPLIT,
    "static_graph": SPLIT,
}


class ScheduleDDPUnsupportedOptionsFourRankTest(DDPFourRankRunner, TwoRankGlooTestCase):
    def test_ddp_options_dp2_pp2(self):
        # (dp, pp) = (2, 2): a refused option raises on every rank at the first
        # step with nothing computed or handed to the hook, and the ranks then
        # meet at a barrier (none waits in the pipeline); find_unused_parameters
        # under the fused schedules: the gradient, once-per-bucket and overlap
        # checks of test_schedule_ddp.py's test_ddp_stages_dp2_pp2.
        self.init_gloo()
        groups = self._pp2_groups()
        for config, refused in PP2_REFUSED.items():
            for schedule_cls in PP2_SCHEDULES:
                if config == "static_graph" and schedule_cls not in refused:
                    continue
                with self.subTest(config=config, schedule=schedule_cls.__name__):
                    self._run_dp2_pp2(
                        schedule_cls, config, *groups, refused=schedule_cls in refused
                    )
                dist.barrier()
        # Options that differ between the pipeline ranks: every rank decides
        # from every stage's options (gathered in the first step's all-reduce
        # over the pipeline group), so all four ranks refuse alike or all run.
        # ScheduleDualPipeV's V puts stages 0 and 3 on pipeline rank 0 (last
        # backwards fused or stage 0's whole-backward W) and 1, 2 on rank 1.
        # static_graph on pipeline rank 0's split stage only (ZBV's V: stage 3;
        # IZB's loop: stage 2): all four ranks refuse, naming it.
        all_reduce = dist.all_reduce
        for schedule_cls, config, option_stages, pattern in (
            (ScheduleDualPipeV, "find_unused_parameters", {0, 3}, None),
            (
                ScheduleDualPipeV,
                "find_unused_parameters",
                {1, 2},
                r"stages \[1, 2\] .*find_unused_parameters=True",
            ),
            (
                ScheduleZBVZeroBubble,
                "static_graph",
                {3},
                r"stages \[3\] .*static_graph=True",
            ),
            (
                ScheduleInterleavedZeroBubble,
                "static_graph",
                {2},
                r"stages \[2\] .*static_graph=True",
            ),
        ):
            with self.subTest(
                config=config,
                schedule=schedule_cls.__name__,
                option_stages=sorted(option_stages),
            ):
                pp_reduces = []

                def counting(tensor, *args, group=None, **kwargs):
                    if group is groups[1]:
                        pp_reduces.append(tensor.numel())
                    return all_reduce(tensor, *args, group=group, **kwargs)

                with mock.patch.object(dist, "all_reduce", counting):
                    self._run_dp2_pp2(
                        schedule_cls,
                        config,
                        *groups,
                        refused=pattern is not None,
                        option_stages=option_stages,
                        pattern=pattern,
                    )
                # The options travel in the metadata-mode vote of the first
                # step (one int for the mode, then, for each of the 4 stages,
                # its static_graph flag and its options): the only all-reduce
                # over the pipeline group that carries more than one int, in
                # both steps.
                self.assertEqual(
                    [k for k in pp_reduces if k > 1], [1 + 2 * 4], msg=pp_reduces
                )
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
