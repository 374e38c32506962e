# Owner(s): ["oncall: distributed"]
"""Pipeline stages wrapped in DistributedDataParallel under the zero-bubble schedules
(split dX/dW backward) and Interleaved1F1B (fused backward, the control).

Two data-parallel replicas (world size 2, gloo), each holding every stage. For each
DDP configuration and schedule, over two steps: every rank's gradients equal a
float64 single-process reference averaged over the replicas, DDP hands every bucket
to its comm hook exactly once per step, and the first bucket is handed to it before
the stage's last gradient is accumulated (the all-reduce overlaps the rest of the
backward). The same for DDP's Python reducer (values only) and for a
_PipelineScheduleRuntime that loads the schedule's compute+comms CSV. A parameter
no micro-batch uses makes the step whose last weight backward cannot reach it raise,
on every rank.
DDP mixed precision (DistributedDataParallel(mixed_precision=...)) is refused,
not run: test_schedule_ddp_mixed_precision.py checks that under ZBV, DualPipeV,
InterleavedZeroBubble and Interleaved1F1B every rank raises the same error at the
first step, before any forward (parameters still float64, no gradient). DDP's
mixed precision registers its reducer hooks at every forward and removes them
at the end of the backward that reduces, so a backward after several forwards
(one per micro-batch, plus the metadata-inference forward) raises "Expected to
mark a variable ready only once" with DDP alone too; it also upcasts and drops
its hooks at the end of the autograd pass in which a bucket completes, which a
split weight backward runs as several passes. Gradients under it are not
covered (fully_shard() with MixedPrecisionPolicy is the supported route).

test_ddp_stages_dp2_pp2 runs four ranks as (dp, pp) = (2, 2), two pipeline ranks
per replica, every stage DDP, under the same schedules and Schedule1F1B: with the
default options and gradient_as_bucket_view the same gradient, once-per-bucket and
overlap checks (the data- and pipeline-parallel groups time out after 30 s, so a
rank left waiting fails instead of hanging).

test_ddp_stage_usage covers how a training loop drives DDP around the schedule:
gradient accumulation across steps under the user's no_sync() (the schedule
reduces in that step as it did before, the right sum after the next), manual
finalization by the user after step() (refused with scale_grads=True, right with
scale_grads=False), a user hook raising in the last weight backward after DDP was
armed (the DDP module then raises an error naming that failure at every further
use), and a backward through the module itself after a step (not reduced, as with
DDP alone).

"Each bucket once" is observed through the comm hook only: the bucket indices
handed to it are 0..n-1, each once, and their GradBucket.parameters() are every
parameter of the module, each once.

The runners here (DDPStagesRunner, DDPUsageRunner, DDPFourRankRunner) are also
used by the other DDP pipelining tests."""

import contextlib
import os
from datetime import timedelta

import torch
import torch._dynamo
import torch.distributed as dist
from test_schedule_ddp_manual_scale_grads import (
    Block,
    data,
    DIM,
    loss_fn,
    N_MICROBATCHES,
    recording_ddp,
    TwoRankGlooTestCase,
)
from test_schedule_ddp_metadata import (
    assert_each_bucket_once,
    N_STEPS,
    reference_grads,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    _PipelineScheduleRuntime,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.testing._internal.common_utils import run_tests

DP = 2
# schedule -> number of stages, all held by each replica (pipeline-parallel size 1)
SCHEDULES = {
    ScheduleZBVZeroBubble: 2,
    ScheduleDualPipeV: 2,
    ScheduleInterleavedZeroBubble: 4,
    ScheduleInterleaved1F1B: 4,  # no dX/dW split: the control
}
SPLIT = {ScheduleZBVZeroBubble, ScheduleDualPipeV, ScheduleInterleavedZeroBubble}
CONFIGS = {
    "default": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    # DDP's Python reducer (torch._dynamo.config.optimize_ddp), which refuses
    # manual finalization: W reduces with DDP's own finalization then.
    "python_reducer": {},
}


class FlexBlock(Block):
    """Block, optionally with a parameter it never uses and one it uses only
    while ``use_extra`` is True (created after ``w`` and ``b``)."""

    def __init__(self, with_unused: bool = False, with_extra: bool = False):
        super().__init__()
        if with_unused:
            self.unused = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64))
        self.use_extra = with_extra
        if with_extra:
            self.extra = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64))

    def forward(self, x):
        if self.use_extra:
            x = x + self.extra
        return super().forward(x)


def build(n_stages, with_unused=False, extra_stage=None, shared=None):
    """The stages' modules; with ``shared`` = (a, b), stage b runs stage a's."""
    torch.manual_seed(0)
    modules = [FlexBlock(with_unused, i == extra_stage) for i in range(n_stages)]
    if shared is not None:
        a, b = shared
        modules[b] = modules[a]
    return modules


class DDPStagesRunner:
    """Builds every stage of a schedule on this rank as DDP with a recording comm
    hook, and checks gradients, bucket hand-offs and overlap over two steps.
    ``ddp_kwargs``: the DDP options; ``with_unused``: each module also holds a
    parameter no micro-batch uses; ``shared`` = (a, b): stage b runs stage a's
    DDP module; ``csv``: run the schedule's order through a
    _PipelineScheduleRuntime that loads its compute+comms CSV."""

    def _make_stages(
        self,
        schedule_cls,
        ddp_kwargs,
        dp_group,
        pp_group,
        *,
        with_unused=False,
        shared=None,
        python_reducer=False,
        csv=False,
    ):
        n_stages = SCHEDULES[schedule_cls]
        modules = build(n_stages, with_unused, shared=shared)
        events = []  # ("acc", stage, name) and ("comm", stage, bucket), in order
        stages = []
        # A stage whose module an earlier stage has: the same DDP instance, and
        # its events and gradients are that stage's.
        repeated = {i for i in range(n_stages) if modules[i] in modules[:i]}
        for i, module in enumerate(modules):
            if i in repeated:
                ddp = stages[modules.index(module)].submod
                stages.append(
                    PipelineStage(ddp, i, n_stages, torch.device("cpu"), group=pp_group)
                )
                continue
            with torch._dynamo.config.patch(
                optimize_ddp="python_reducer" if python_reducer else True
            ):
                # DDP's Python reducer takes no bucket comm hook: values only.
                ddp = recording_ddp(
                    module,
                    dp_group,
                    None if python_reducer else events,
                    ("comm", i),
                    **ddp_kwargs,
                )
            for name, p in module.named_parameters():
                p.register_post_accumulate_grad_hook(
                    lambda p, i=i, name=name: events.append(("acc", i, name))
                )
            stages.append(
                PipelineStage(ddp, i, n_stages, torch.device("cpu"), group=pp_group)
            )
        schedule = schedule_cls(stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)
        if csv:
            # The same order, run by a runtime that loads its compute+comms CSV
            # (it executes pipeline_order_with_comms; pipeline_order stays empty).
            path = f"{self.file_name}.{self.rank}.csv"
            schedule._dump_csv(path, format="compute_comms")
            schedule = _PipelineScheduleRuntime(
                stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
            )
            schedule._load_csv(path, format="compute_comms")
            os.remove(path)
        return modules, stages, schedule, events, repeated

    def _run_schedule(
        self,
        schedule_cls,
        ddp_kwargs,
        dp_group,
        pp_group,
        *,
        name,
        with_unused=False,
        shared=None,
        python_reducer=False,
        csv=False,
    ):
        n_stages = SCHEDULES[schedule_cls]
        modules, stages, schedule, events, repeated = self._make_stages(
            schedule_cls,
            ddp_kwargs,
            dp_group,
            pp_group,
            with_unused=with_unused,
            shared=shared,
            python_reducer=python_reducer,
            csv=csv,
        )
        for step in range(N_STEPS):
            x, y = data(step, self.rank)
            events.clear()
            schedule.step(x, target=y)
            reference = reference_grads(
                build(n_stages, with_unused, shared=shared), step, DP
            )
            for i, stage in enumerate(stages):
                if i in repeated:
                    continue
                msg = f"{schedule_cls.__name__}, {name}, step {step}, stage {i}"
                for (pname, p), ref in zip(
                    modules[i].named_parameters(),
                    reference[i].parameters(),
                    strict=True,
                ):
                    torch.testing.assert_close(p.grad, ref.grad, msg=f"{msg} {pname}")
                    p.grad = None
                if python_reducer:
                    continue
                mine = [e[:3] for e in events if e[1] == i]
                n_buckets = assert_each_bucket_once(
                    self,
                    [(e[2], e[3]) for e in events if e[0] == "comm" and e[1] == i],
                    modules[i],
                    f"{msg} {mine}",
                )
                if step == 0:
                    # DDP's first bucket holds both parameters until DDP rebuilds
                    # its buckets (here: one per parameter) at the next forward.
                    continue
                self.assertEqual(n_buckets, len(list(modules[i].parameters())), msg=msg)
                # The first bucket's all-reduce starts while the stage's last
                # backward still accumulates gradients.
                first_comm = next(k for k, e in enumerate(mine) if e[0] == "comm")
                last_acc = max(k for k, e in enumerate(mine) if e[0] == "acc")
                self.assertLess(first_comm, last_acc, msg=f"{msg}: {mine}")

    def _run_refused(self, schedule_cls, ddp_kwargs, dp_group, pp_group, pattern, **kw):
        """The first step raises ``pattern`` on every rank."""
        _, _, schedule, _, _ = self._make_stages(
            schedule_cls, ddp_kwargs, dp_group, pp_group, **kw
        )
        x, y = data(0, self.rank)
        with self.assertRaisesRegex(RuntimeError, pattern):
            schedule.step(x, target=y)


class DDPUsageRunner:
    """Every stage DDP with a comm hook recording (stage, bucket index, bucket
    parameters) into ``comms``; ``make_schedule()`` builds new stages and a new
    schedule around the same DDP modules."""

    def _usage_setup(
        self,
        schedule_cls,
        dp_group,
        pp_group,
        *,
        extra_stage=None,
        manual=False,
        scale_grads=False,
        stage_kwargs=None,
    ):
        n_stages = SCHEDULES[schedule_cls]
        modules = build(n_stages, extra_stage=extra_stage)
        comms = []
        ddps = []
        for i, module in enumerate(modules):
            ddp = recording_ddp(module, dp_group, comms, (i,))
            if manual:
                ddp.require_manual_backward_finalization = True
            ddps.append(ddp)

        def make_schedule():
            stages = [
                PipelineStage(
                    ddp,
                    i,
                    n_stages,
                    torch.device("cpu"),
                    group=pp_group,
                    **(stage_kwargs or {}),
                )
                for i, ddp in enumerate(ddps)
            ]
            return schedule_cls(
                stages,
                n_microbatches=N_MICROBATCHES,
                loss_fn=loss_fn
                if scale_grads
                else (lambda out, target: loss_fn(out, target) / N_MICROBATCHES),
                scale_grads=scale_grads,
            )

        return modules, ddps, comms, make_schedule

    def _usage_steps(
        self,
        case,
        schedule,
        modules,
        ddps,
        comms,
        *,
        extra_stage=None,
        steps=range(N_STEPS),
        no_sync_step=None,
        manual=False,
    ):
        """Steps ``steps``, each checked against the reference: every bucket
        handed to the comm hook once, and the gradients (the sum over steps
        0 and 1 after a step 0 under the user's no_sync())."""
        n_stages = len(modules)
        for step in steps:
            x, y = data(step, self.rank)
            comms.clear()
            with contextlib.ExitStack() as stack:
                if step == no_sync_step:
                    for ddp in ddps:
                        stack.enter_context(ddp.no_sync())
                schedule.step(x, target=y)
            if manual:
                for ddp in ddps:
                    ddp.finalize_backward()
            # Also in a step under the user's no_sync(): the schedule arms the
            # reducer at each stage's last backward regardless, as before (a W
            # then with DDP's own finalization); the values stay right for an
            # averaging hook.
            for i, module in enumerate(modules):
                assert_each_bucket_once(
                    self,
                    [(b, params) for j, b, params in comms if j == i],
                    module,
                    f"{case}, step {step}, stage {i}",
                )
            if step == no_sync_step:
                continue
            reference = reference_grads(
                build(n_stages, extra_stage=extra_stage), step, DP
            )
            if no_sync_step is not None:  # its gradients were accumulated
                for ref, ref0 in zip(
                    reference,
                    reference_grads(build(n_stages), no_sync_step, DP),
                    strict=True,
                ):
                    for p, p0 in zip(ref.parameters(), ref0.parameters(), strict=True):
                        p.grad += p0.grad
            for i, (module, ref) in enumerate(zip(modules, reference, strict=True)):
                for (name, p), ref_p in zip(
                    module.named_parameters(), ref.parameters(), strict=True
                ):
                    torch.testing.assert_close(
                        p.grad, ref_p.grad, msg=f"{case}, step {step}, {i}.{name}"
                    )
                    p.grad = None
            no_sync_step = None


# (dp, pp) = (2, 2) on four ranks: schedule -> stages per pipeline rank and
# whether they are placed in a V (pipeline rank r holds stages r and
# 2 * pp - 1 - r) or looped (r, r + pp, ...).
PP2_SCHEDULES = {
    ScheduleZBVZeroBubble: (2, "v"),
    ScheduleDualPipeV: (2, "v"),
    ScheduleInterleavedZeroBubble: (2, "loop"),
    ScheduleInterleaved1F1B: (2, "loop"),
    Schedule1F1B: (1, "loop"),
}
# Every collective and pipeline transfer of the four-rank test's DDP modules and
# stages waits at most this long: a rank left waiting while its peers raised
# fails instead of hanging. (The default group keeps the default timeout, so that
# slow process start-up on a loaded machine is not a failure.)
PG_TIMEOUT = timedelta(seconds=30)


class DDPFourRankRunner:
    @property
    def world_size(self) -> int:
        return 4

    def _pp2_groups(self):
        """The (dp, pp) = (2, 2) mesh's groups (rank = 2 * dp_rank + pp_rank),
        built directly to give them the short timeout (init_device_mesh would
        give them the default one)."""
        dp_groups = [dist.new_group([r, r + 2], timeout=PG_TIMEOUT) for r in (0, 1)]
        pp_groups = [dist.new_group([r, r + 1], timeout=PG_TIMEOUT) for r in (0, 2)]
        return dp_groups[self.rank % 2], pp_groups[self.rank // 2]

    def _run_dp2_pp2(
        self,
        schedule_cls,
        config,
        dp_group,
        pp_group,
        refused=False,
        option_stages=None,
        pattern=None,
    ):
        """Every stage DDP with ``config`` (a DDP option set True, or "default");
        with ``option_stages``, only those stages have the option (the others
        default DDP) and no module holds an unused parameter. ``refused``: every
        rank raises at the first step (matching ``pattern``), before anything is
        computed or exchanged."""
        dp, pp = 2, 2
        dp_rank, pp_rank = divmod(self.rank, pp)
        per_rank, placement = PP2_SCHEDULES[schedule_cls]
        n_stages = per_rank * pp
        layout = (
            [pp_rank, n_stages - 1 - pp_rank]
            if placement == "v"
            else list(range(pp_rank, n_stages, pp))
        )
        with_unused = config == "find_unused_parameters" and option_stages is None
        ddp_kwargs = {} if config == "default" else {config: True}
        modules = build(n_stages, with_unused)
        events = []  # ("acc", stage, name) and ("comm", stage, bucket)
        stages = []
        for i in layout:
            kwargs = ddp_kwargs if option_stages is None or i in option_stages else {}
            ddp = recording_ddp(modules[i], dp_group, events, ("comm", i), **kwargs)
            for name, p in modules[i].named_parameters():
                p.register_post_accumulate_grad_hook(
                    lambda p, i=i, name=name: events.append(("acc", i, name))
                )
            stages.append(
                PipelineStage(ddp, i, n_stages, torch.device("cpu"), group=pp_group)
            )
        schedule = schedule_cls(
            stages if per_rank > 1 else stages[0],
            n_microbatches=N_MICROBATCHES,
            loss_fn=loss_fn,
        )
        for step in range(N_STEPS):
            events.clear()
            x, y = data(step, dp_rank)
            args = (x,) if 0 in layout else ()
            kwargs = {"target": y} if n_stages - 1 in layout else {}
            if refused:
                with self.assertRaisesRegex(RuntimeError, pattern or f"{config}=True"):
                    schedule.step(*args, **kwargs)
                self.assertEqual(events, [])
                for i in layout:
                    for p in modules[i].parameters():
                        self.assertIsNone(p.grad)
                return
            schedule.step(*args, **kwargs)
            reference = reference_grads(build(n_stages, with_unused), step, dp)
            for i in layout:
                msg = f"{schedule_cls.__name__}, {config}, step {step}, stage {i}"
                for (name, p), ref in zip(
                    modules[i].named_parameters(),
                    reference[i].parameters(),
                    strict=True,
                ):
                    torch.testing.assert_close(p.grad, ref.grad, msg=f"{msg} {name}")
                    p.grad = None
                mine = [e[:3] for e in events if e[1] == i]
                n_buckets = assert_each_bucket_once(
                    self,
                    [(e[2], e[3]) for e in events if e[0] == "comm" and e[1] == i],
                    modules[i],
                    f"{msg} {mine}",
                )
                if step == 0:
                    continue  # before DDP rebuilt its buckets
                self.assertEqual(n_buckets, len(list(modules[i].parameters())), msg=msg)
                first_comm = next(k for k, e in enumerate(mine) if e[0] == "comm")
                last_acc = max(k for k, e in enumerate(mine) if e[0] == "acc")
                self.assertLess(first_comm, last_acc, msg=f"{msg}: {mine}")


class ScheduleDDPTest(DDPStagesRunner, DDPUsageRunner, TwoRankGlooTestCase):
    def test_ddp_stages(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for config, ddp_kwargs in CONFIGS.items():
            for schedule_cls in SCHEDULES:
                with self.subTest(config=config, schedule=schedule_cls.__name__):
                    self._run_schedule(
                        schedule_cls,
                        ddp_kwargs,
                        *groups,
                        name=config,
                        python_reducer=config == "python_reducer",
                    )
                dist.barrier()
        # The actions a runtime executes: its compute+comms order loaded from a
        # CSV.
        with self.subTest(config="default", csv=True):
            self._run_schedule(
                ScheduleZBVZeroBubble, {}, *groups, name="default, csv", csv=True
            )
        dist.barrier()
        # A parameter no micro-batch uses, where the last stage's last backward is
        # a split W: DDP cannot finalize that W's reduction, and the step raises
        # on every rank (DDP alone raises at the next forward).
        for schedule_cls in (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble):
            with self.subTest(
                config="unused_parameter", schedule=schedule_cls.__name__
            ):
                _, _, schedule, _, _ = self._make_stages(
                    schedule_cls, {}, *groups, with_unused=True
                )
                x, y = data(0, self.rank)
                with self.assertRaises(RuntimeError):
                    schedule.step(x, target=y)
            dist.barrier()
        dist.destroy_process_group()

    def _failed_last_w(self, schedule_cls, dp_group, pp_group):
        # A user hook raises in the last stage's last W, after the schedule
        # set manual finalization and armed the reducer (on both ranks).
        n_stages = SCHEDULES[schedule_cls]
        modules, ddps, comms, make_schedule = self._usage_setup(
            schedule_cls, dp_group, pp_group
        )
        schedule = make_schedule()
        accumulations = []

        def hook(p):
            accumulations.append(p)
            if len(accumulations) == N_MICROBATCHES:
                raise RuntimeError("user hook: non-finite gradient")

        modules[-1].w.register_post_accumulate_grad_hook(hook)
        x, y = data(0, self.rank)
        with self.assertRaisesRegex(RuntimeError, "user hook") as raised:
            schedule.step(x, target=y)
        self.assertRegex(
            " ".join(getattr(raised.exception, "__notes__", [])),
            "DistributedDataParallel module is left unusable",
        )
        # DDP cannot abandon the armed reduction: the option stays set, and
        # every further use of the module with grad enabled raises an error
        # naming the failure (a plain DDP forward, as DDP alone raises after
        # a failed backward, and a new schedule's step); a forward with grad
        # disabled does not touch the reducer and runs, as with DDP alone.
        self.assertTrue(ddps[-1].require_manual_backward_finalization)
        left_armed = (
            rf"\[Stage {n_stages - 1}\] this DistributedDataParallel stage "
            "cannot reduce gradients any more: its last weight backward raised "
            r"\(RuntimeError: user hook: non-finite gradient\) after the "
            "pipeline schedule had set require_manual_backward_finalization"
        )
        comms.clear()
        for no_grad in (torch.no_grad, torch.inference_mode):
            with no_grad():
                torch.testing.assert_close(
                    ddps[-1](x), modules[-1](x), msg=no_grad.__name__
                )
        with self.assertRaisesRegex(RuntimeError, left_armed):
            ddps[-1](x)

        # A forward under no_grad that enables grad itself, and leaves it
        # on, has DDP prepare the armed reducer when it returns: it raises
        # too, instead of handing back an output whose backward would never
        # be reduced.
        def enable_grad_and_leave_it_on(*_):
            torch.set_grad_enabled(True)

        enable_grad = modules[-1].register_forward_pre_hook(enable_grad_and_leave_it_on)
        with torch.no_grad(), self.assertRaisesRegex(RuntimeError, left_armed):
            ddps[-1](x)
        enable_grad.remove()
        with self.assertRaisesRegex(RuntimeError, left_armed):
            make_schedule().step(x, target=y)
        self.assertEqual(comms, [])

    def _bypass_ddp(self, schedule_cls, dp_group, pp_group):
        # After a step, a backward through the module itself (not through
        # DDP's forward) is not reduced, as with DDP alone: the step leaves
        # DDP's reducer unarmed, also after a split last backward.
        n_stages = SCHEDULES[schedule_cls]
        modules, _, comms, make_schedule = self._usage_setup(
            schedule_cls, dp_group, pp_group
        )
        x, y = data(0, self.rank)
        make_schedule().step(x, target=y)
        for module in modules:
            for p in module.parameters():
                p.grad = None
        comms.clear()
        modules[-1](x).sum().backward()
        local = build(n_stages)[-1]
        local(x).sum().backward()
        self.assertEqual(comms, [])
        for (name, p), ref in zip(
            modules[-1].named_parameters(), local.parameters(), strict=True
        ):
            torch.testing.assert_close(p.grad, ref.grad, msg=name)

    def test_ddp_parameter_frozen_after_wrapping(self):
        # ``b`` of the last stage frozen after DDP wrapped the module (DDP still
        # reduces it; the stage, built after, does not know it): the last W
        # never reaches it and DDP's finalize_backward() raises its own error on
        # both ranks, with a note naming ``b``.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls in (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble):
            with self.subTest(schedule=schedule_cls.__name__):
                modules, _, _, make_schedule = self._usage_setup(schedule_cls, *groups)
                modules[-1].b.requires_grad_(False)
                x, y = data(0, self.rank)
                with self.assertRaisesRegex(
                    RuntimeError, "called before all DDP buckets were ready"
                ) as raised:
                    make_schedule().step(x, target=y)
                self.assertRegex(
                    " ".join(getattr(raised.exception, "__notes__", [])),
                    r"Parameters \['b'\] of the module do not require grad",
                )
            dist.barrier()
        dist.destroy_process_group()

    def test_ddp_stage_usage(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for case in (
            "no_sync",
            "manual",
            "manual_scale_grads",
            "failed_last_w",
            "bypass_ddp",
        ):
            for schedule_cls in SCHEDULES:
                if case == "failed_last_w" and schedule_cls not in (
                    ScheduleZBVZeroBubble,
                    ScheduleInterleavedZeroBubble,
                ):
                    continue  # the last stage's last backward is fused there
                with self.subTest(case=case, schedule=schedule_cls.__name__):
                    if case == "failed_last_w":
                        self._failed_last_w(schedule_cls, *groups)
                    elif case == "bypass_ddp":
                        self._bypass_ddp(schedule_cls, *groups)
                    elif case == "manual_scale_grads":
                        _, _, comms, make_schedule = self._usage_setup(
                            schedule_cls, *groups, manual=True, scale_grads=True
                        )
                        x, y = data(0, self.rank)
                        with self.assertRaisesRegex(
                            RuntimeError, "require_manual_backward_finalization=True"
                        ):
                            make_schedule().step(x, target=y)
                        self.assertEqual(comms, [])
                    else:
                        manual = case == "manual"
                        modules, ddps, comms, make_schedule = self._usage_setup(
                            schedule_cls, *groups, manual=manual
                        )
                        self._usage_steps(
                            case,
                            make_schedule(),
                            modules,
                            ddps,
                            comms,
                            no_sync_step=0 if case == "no_sync" else None,
                            manual=manual,
                        )
                dist.barrier()
        dist.destroy_process_group()


class ScheduleDDPFourRankTest(DDPFourRankRunner, TwoRankGlooTestCase):
    def test_ddp_stages_dp2_pp2(self):
        # (dp, pp) = (2, 2): two pipeline ranks per data-parallel replica, every
        # stage DDP. For two steps, every rank's gradients equal the float64
        # single-process reference averaged over the replicas, each bucket is
        # handed to the comm hook once per step, and from the second step on
        # (one parameter per bucket) the first bucket's all-reduce starts before
        # the stage's last gradient accumulation.
        self.init_gloo()
        groups = self._pp2_groups()
        for config in ("default", "gradient_as_bucket_view"):
            for schedule_cls in PP2_SCHEDULES:
                with self.subTest(config=config, schedule=schedule_cls.__name__):
                    self._run_dp2_pp2(schedule_cls, config, *groups)
                dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
