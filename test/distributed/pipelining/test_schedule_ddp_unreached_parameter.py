# Owner(s): ["oncall: distributed"]
"""A parameter that DDP reduces but that a DDP stage's last weight backward (W) does
not reach is refused at that W, on every rank, before DDP's reducer is armed: the
DDP module is left as it was (require_manual_backward_finalization False, nothing
handed to the comm hook for that stage), so new stages and a new schedule around
the same DDP modules train on.

Two data-parallel replicas (world size 2, gloo), each holding every stage:
- a parameter no micro-batch uses (with and without a stale .grad from an earlier
  step, which is not taken as used): ScheduleZBVZeroBubble and
  ScheduleInterleavedZeroBubble raise at the last W; ScheduleDualPipeV and
  ScheduleInterleaved1F1B (fused last backwards) raise DDP's own error in the
  second step, as without pipelining;
- a step whose last stage leaves a parameter unused raises at that stage's W,
  and on new stages and a new schedule around the same DDP modules the next two
  steps' gradients equal a float64 single-process reference averaged over the
  replicas, each bucket handed to the comm hook once per step;
- a parameter frozen after DDP wrapped the module (and after the stages were
  built) is still one DDP reduces: refused at the last W with a hint to re-wrap;
- a parameter that only rank 1's last micro-batch leaves unused (the last W of
  rank 0 reaches it): the ranks agree before arming, so both raise at that W,
  rank 1 naming the parameter and rank 0 naming rank 1, nothing is handed to
  the comm hook for that stage, and new stages and a new schedule around the
  same DDP modules train on (the data-parallel group times out after 30 s, so a
  rank left waiting in DDP's all-reduces fails instead of hanging)."""

import torch
import torch.distributed as dist
from test_schedule_ddp import (
    DDPStagesRunner,
    DDPUsageRunner,
    DP,
    PG_TIMEOUT,
    SCHEDULES,
)
from test_schedule_ddp_manual_scale_grads import (
    data,
    N_MICROBATCHES,
    TwoRankGlooTestCase,
)
from test_schedule_ddp_metadata import N_STEPS
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining.schedules import (
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.testing._internal.common_utils import run_tests

# Schedules whose last stage ends its backward with a split W (the others end
# every stage with a fused backward).
LAST_W_SPLIT = (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble)


class ScheduleDDPUnreachedParameterTest(
    DDPStagesRunner, DDPUsageRunner, TwoRankGlooTestCase
):
    def test_ddp_unused_parameter(self):
        # A parameter no micro-batch uses, without find_unused_parameters: an
        # error, as with DDP alone (nothing is zero-filled), also when the
        # parameter holds a stale .grad from an earlier step.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for stale_grad in (False, True):
            for schedule_cls in SCHEDULES:
                with self.subTest(
                    stale_grad=stale_grad, schedule=schedule_cls.__name__
                ):
                    _, stages, schedule, _, _ = self._make_stages(
                        schedule_cls, {}, *groups, with_unused=True
                    )
                    if stale_grad:
                        for stage in stages:
                            stage.submod.module.unused.grad = torch.ones_like(
                                stage.submod.module.unused
                            )
                    # Where a stage's last backward is a W, it raises in that
                    # step; after a fused last backward (DualPipeV ends with
                    # one), DDP raises at the next forward, as without
                    # pipelining.
                    expected = (
                        (
                            0,
                            r"parameters \['unused'\] .* get no gradient in its "
                            "last backward",
                        )
                        if schedule_cls in LAST_W_SPLIT
                        else (
                            1,
                            "Expected to have finished reduction in the prior "
                            "iteration",
                        )
                    )
                    for step in range(N_STEPS):
                        x, y = data(step, self.rank)
                        try:
                            schedule.step(x, target=y)
                        except RuntimeError as error:
                            self.assertEqual(step, expected[0])
                            self.assertRegex(f"{error} {error.__cause__}", expected[1])
                            # A failed last W leaves the DDP modules as
                            # configured.
                            for stage in stages:
                                self.assertFalse(
                                    stage.submod.require_manual_backward_finalization
                                )
                            break
                    else:
                        self.fail(f"{schedule_cls.__name__}: no error")
                dist.barrier()
        dist.destroy_process_group()

    def _unused_then_used(self, schedule_cls, dp_group, pp_group):
        n_stages = SCHEDULES[schedule_cls]
        extra_stage = n_stages - 1
        modules, ddps, comms, make_schedule = self._usage_setup(
            schedule_cls, dp_group, pp_group, extra_stage=extra_stage
        )
        # The last stage's extra parameter gets no gradient: its last W
        # (split) raises before anything is armed or set, on both ranks.
        modules[-1].use_extra = False
        x, y = data(0, self.rank)
        with self.assertRaisesRegex(
            RuntimeError, r"parameters \['extra'\] .* get no gradient"
        ):
            make_schedule().step(x, target=y)
        self.assertEqual([c[:2] for c in comms if c[0] == n_stages - 1], [])
        for ddp in ddps:
            self.assertFalse(ddp.require_manual_backward_finalization)
        for module in modules:
            for p in module.parameters():
                p.grad = None
        modules[-1].use_extra = True
        # Pipelining needs new stages and a new schedule after a step that
        # raised; the DDP modules are reused as they are.
        self._usage_steps(
            "unused_then_used",
            make_schedule(),
            modules,
            ddps,
            comms,
            extra_stage=extra_stage,
            steps=range(1, N_STEPS + 1),
        )

    def _frozen_after_wrap(self, schedule_cls, dp_group, pp_group):
        # A parameter frozen after DDP wrapped the module (and after the stage
        # was built) is still one DDP reduces: the last stage's last W (split)
        # cannot reach it and raises before arming, on both ranks.
        n_stages = SCHEDULES[schedule_cls]
        modules, ddps, comms, make_schedule = self._usage_setup(
            schedule_cls, dp_group, pp_group
        )
        schedule = make_schedule()
        modules[-1].b.requires_grad_(False)
        x, y = data(0, self.rank)
        with self.assertRaisesRegex(
            RuntimeError,
            r"parameters \['b'\] .* get no gradient .*\['b'\] no longer require grad",
        ):
            schedule.step(x, target=y)
        self.assertEqual([c[:2] for c in comms if c[0] == n_stages - 1], [])
        for ddp in ddps:
            self.assertFalse(ddp.require_manual_backward_finalization)

    def test_ddp_stage_usage_unreached(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for case in ("unused_then_used", "frozen_after_wrap"):
            for schedule_cls in LAST_W_SPLIT:
                with self.subTest(case=case, schedule=schedule_cls.__name__):
                    getattr(self, f"_{case}")(schedule_cls, *groups)
                dist.barrier()
        dist.destroy_process_group()

    def _unreached_on_one_rank(self, schedule_cls, dp_group, pp_group):
        # The last stage's extra parameter is used in every micro-batch, except
        # in rank 1's last micro-batch of step 1: rank 1's last W (split) does
        # not reach it, rank 0's does.
        n_stages = SCHEDULES[schedule_cls]
        extra_stage = n_stages - 1
        modules, ddps, comms, make_schedule = self._usage_setup(
            schedule_cls, dp_group, pp_group, extra_stage=extra_stage
        )
        forwards = []
        drop = [False]

        def count_forwards(module, args):
            if torch.is_grad_enabled():
                forwards.append(None)
            module.use_extra = not (
                drop[0] and self.rank == 1 and len(forwards) == N_MICROBATCHES
            )

        handle = modules[-1].register_forward_pre_hook(count_forwards)
        schedule = make_schedule()
        self._usage_steps(
            "unreached_on_one_rank",
            schedule,
            modules,
            ddps,
            comms,
            extra_stage=extra_stage,
            steps=range(1),
        )
        forwards.clear()
        drop[0] = True
        comms.clear()
        x, y = data(1, self.rank)
        with self.assertRaisesRegex(
            RuntimeError,
            r"parameters \['extra'\] .* get no gradient in its last backward"
            if self.rank == 1
            else r"data-parallel rank 1 .* refused to reduce the module before "
            "arming DDP's reducer",
        ):
            schedule.step(x, target=y)
        self.assertEqual(len(forwards), N_MICROBATCHES)
        self.assertEqual([c[:2] for c in comms if c[0] == extra_stage], [])
        for ddp in ddps:
            self.assertFalse(ddp.require_manual_backward_finalization)
        drop[0] = False
        for module in modules:
            for p in module.parameters():
                p.grad = None
        self._usage_steps(
            "unreached_on_one_rank",
            make_schedule(),
            modules,
            ddps,
            comms,
            extra_stage=extra_stage,
            steps=range(2, 3),
        )
        handle.remove()

    def test_ddp_unreached_on_one_rank(self):
        # Without the ranks agreeing, rank 1 raised and rank 0 armed its
        # reducer and waited in finalize_backward() until the data-parallel
        # group's timeout.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = dist.new_group([0, 1], timeout=PG_TIMEOUT), mesh.get_group("pp")
        for schedule_cls in LAST_W_SPLIT:
            with self.subTest(schedule=schedule_cls.__name__):
                self._unreached_on_one_rank(schedule_cls, *groups)
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
