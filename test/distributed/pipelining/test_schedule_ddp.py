# Owner(s): ["oncall: distributed"]
"""Pipeline stages wrapped in DistributedDataParallel under the zero-bubble schedules
(split dX/dW backward) and Interleaved1F1B (fused backward, the control).

Two data-parallel replicas (world size 2, gloo), each holding every stage. For each
DDP configuration and schedule, over two steps: every rank's gradients equal a
float64 single-process reference averaged over the replicas, DDP hands every bucket
to its comm hook exactly once per step, and the first bucket is handed to it before
the stage's last gradient is accumulated (the all-reduce overlaps the rest of the
backward). DDP options that a split last backward cannot support raise the same
clear error on every rank before any communication, also at (dp, pp) = (1, 2) where
only one rank holds the split stages; find_unused_parameters works under
ScheduleDualPipeV with every stage on one rank (each stage's last backward is fused).
DDP mixed precision is not covered: DDP's constructor needs an accelerator for it,
and DDP alone raises "Expected to mark a variable ready only once" in a backward
after several forwards with it (it registers its reducer hooks at every forward),
which every schedule with several micro-batches does.

The same checks run for DDP's Python reducer (values only), for two stages on
the rank that share one DDP module (reduced once, in the later of their last
backwards), and the refusals also for a _PipelineScheduleRuntime that loads the
schedule's compute+comms CSV. test_ddp_shared_module_zero_gradient_pass covers a
parameter of a shared module that the reducing backward does not reach (marked
ready with a zero gradient): a sparse embedding stays sparse and right, hooks on
the parameters the reducing backward reaches run once per use, and a parameter
whose tensor or post-accumulate-grad hooks that pass would call once more is
refused on every rank before DDP's reducer is armed.

NoDDPStageTest (one process): a schedule without a DDP stage does not look at
its actions for DDP at a step.

test_ddp_stages_dp2_pp2 runs four ranks as (dp, pp) = (2, 2), two pipeline ranks
per replica, every stage DDP, under the same schedules and Schedule1F1B: with the
default options and gradient_as_bucket_view (and find_unused_parameters under the
fused schedules) the same gradient, once-per-bucket and overlap checks; the
refused options raise on every rank (the data- and pipeline-parallel groups time
out after 30 s, so a rank that does not refuse fails instead of hanging).

test_ddp_stage_usage covers how a training loop drives DDP around the schedule:
gradient accumulation across steps under the user's no_sync() (the schedule
reduces in that step as it did before, the right sum after the next), manual
finalization by the user after step() (refused with scale_grads=True, right with
scale_grads=False), a stage with a dw_builder under a split backward (refused),
a step after one that raised because a parameter got no gradient in a split
last backward (DDP left as it was: the next steps reduce right), a parameter
frozen after DDP wrapped the module (refused before DDP is armed), and a user
hook raising in the last weight backward after DDP was armed (the DDP module
then raises an error naming that failure at every further use), and a backward
through the module itself after a step (not reduced, as with DDP alone).

"Each bucket once" is observed through the comm hook only: the bucket indices
handed to it are 0..n-1, each once, and their GradBucket.parameters() are every
parameter of the module, each once."""

import contextlib
import os
from datetime import timedelta
from unittest import mock

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
    _Action,
    _PipelineScheduleRuntime,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_utils import run_tests, TestCase

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
    "find_unused_parameters": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    # A parameter no micro-batch uses, without find_unused_parameters: an error, as
    # with DDP alone (nothing is zero-filled), also when the parameter holds a stale
    # .grad from an earlier step (it is not taken as used).
    "unused_parameter": {},
    "unused_parameter_stale_grad": {},
    # DDP's Python reducer (torch._dynamo.config.optimize_ddp), which refuses
    # manual finalization: W reduces with DDP's own finalization then.
    "python_reducer": {},
    # Two stages on the rank run one module through one DDP instance (SHARED).
    "shared_module": {},
}
# schedule -> (a, b): with "shared_module", stage b is stage a's DDP module. The
# stage whose last backward comes last reduces it: 0 in the V layouts (its W
# runs the whole backward), 1 in the looped ones (a split W, or a fused B).
SHARED = {
    ScheduleZBVZeroBubble: (0, 1),
    ScheduleDualPipeV: (0, 1),
    ScheduleInterleavedZeroBubble: (1, 3),
    ScheduleInterleaved1F1B: (1, 3),
}
# Options refused where a stage's last backward is split, by schedule; their error
# names the option. DualPipeV with every stage on one rank ends each stage with a
# fused backward (stage 0's W runs the whole backward), so find_unused_parameters
# works there; static_graph is refused under every split schedule.
REFUSED = {
    "find_unused_parameters": {ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble},
    "static_graph": SPLIT,
}
UNUSED = {"find_unused_parameters", "unused_parameter", "unused_parameter_stale_grad"}


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


class InputGradBlock(Block):
    """Block with a parameter ``v`` used only when the input requires grad: by
    every stage but stage 0 (a received activation requires grad, the data does
    not), or, with ``stage_0_only``, only by stage 0."""

    def __init__(self, stage_0_only: bool = False):
        super().__init__()
        self.v = torch.nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64) * 0.3)
        self.stage_0_only = stage_0_only

    def forward(self, x):
        out = super().forward(x)
        return out + x @ self.v if x.requires_grad != self.stage_0_only else out


class SparseEmbeddingBlock(Block):
    """Block with an ``nn.Embedding(sparse=True)`` (DDP expects its sparse
    gradient) used only when the input requires grad: by stage 1, not stage 0."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(6, DIM, sparse=True, dtype=torch.float64)

    def forward(self, x):
        out = super().forward(x)
        if not x.requires_grad:
            return out
        return out + self.emb(torch.tensor([1, 3])).sum(0) * x


def _order(actions):
    return [_Action.from_str(a) for a in actions.split()]


# Compute-only orders of two stages on one rank (pp = 1), 4 micro-batches.
_FORWARDS = "0F0 1F0 0F1 1F1 0F2 1F2 0F3 1F3 "
_INPUTS = "1I0 0I0 1I1 0I1 1I2 0I2 1I3 0I3 "
ORDERS = {
    # stage 1's last W comes after stage 0's last W (no built-in schedule does)
    "w1_last": _order(_FORWARDS + _INPUTS + "0W0 0W1 0W2 0W3 1W0 1W1 1W2 1W3"),
    # stage 0's last W comes last (as in every built-in schedule)
    "w0_last": _order(_FORWARDS + _INPUTS + "1W0 1W1 1W2 1W3 0W0 0W1 0W2 0W3"),
    # fused backwards only
    "fused": _order(_FORWARDS + "1B0 0B0 1B1 0B1 1B2 0B2 1B3 0B3"),
}


def build(n_stages, with_unused=False, extra_stage=None, shared=None):
    torch.manual_seed(0)
    modules = [FlexBlock(with_unused, i == extra_stage) for i in range(n_stages)]
    if shared is not None:
        a, b = shared
        modules[b] = modules[a]
    return modules


class ScheduleDDPTest(TwoRankGlooTestCase):
    def _run_schedule(self, schedule_cls, config, dp_group, pp_group, csv=False):
        n_stages = SCHEDULES[schedule_cls]
        with_unused = config in UNUSED
        shared = SHARED[schedule_cls] if config == "shared_module" else None
        modules = build(n_stages, with_unused, shared=shared)
        events = []  # ("acc", stage, name) and ("comm", stage, bucket), in order
        stages = []
        # DDP's Python reducer takes no bucket comm hook: values only.
        values_only = config == "python_reducer"
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
                optimize_ddp="python_reducer" if config == "python_reducer" else True
            ):
                # No comm hook for values_only.
                ddp = recording_ddp(
                    module,
                    dp_group,
                    None if values_only else events,
                    ("comm", i),
                    **CONFIGS[config],
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
        if config == "unused_parameter_stale_grad":
            for module in modules:
                module.unused.grad = torch.ones_like(module.unused)
        if config.startswith("unused_parameter"):
            # Where a stage's last backward is a W, its finalize_backward() raises
            # in that step; after a fused last backward (DualPipeV ends with one),
            # DDP raises at the next forward, as without pipelining.
            expected = (
                (0, r"parameters \['unused'\] .* get no gradient in its last backward")
                if schedule_cls
                in (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble)
                else (1, "Expected to have finished reduction in the prior iteration")
            )
            for step in range(N_STEPS):
                x, y = data(step, self.rank)
                try:
                    schedule.step(x, target=y)
                except RuntimeError as error:
                    self.assertEqual(step, expected[0])
                    self.assertRegex(f"{error} {error.__cause__}", expected[1])
                    # A failed last W leaves the DDP modules as configured.
                    for stage in stages:
                        self.assertFalse(
                            stage.submod.require_manual_backward_finalization
                        )
                    return
            self.fail(f"{schedule_cls.__name__}: no error for an unused parameter")
        for step in range(N_STEPS):
            x, y = data(step, self.rank)
            if schedule_cls in REFUSED.get(config, ()):
                with self.assertRaisesRegex(RuntimeError, f"{config}=True"):
                    schedule.step(x, target=y)
                return
            events.clear()
            schedule.step(x, target=y)
            reference = reference_grads(
                build(n_stages, with_unused, shared=shared), step, DP
            )
            for i, stage in enumerate(stages):
                if i in repeated:
                    continue
                msg = f"{schedule_cls.__name__}, {config}, step {step}, stage {i}"
                for (name, p), ref in zip(
                    modules[i].named_parameters(),
                    reference[i].parameters(),
                    strict=True,
                ):
                    torch.testing.assert_close(p.grad, ref.grad, msg=f"{msg} {name}")
                    p.grad = None
                if values_only:
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

    def test_ddp_stages(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for config in CONFIGS:
            for schedule_cls in SCHEDULES:
                if config == "static_graph" and schedule_cls not in SPLIT:
                    # Fused backward with static_graph: a defect of its own (the
                    # first backward of the first step reduces), not covered here.
                    continue
                with self.subTest(config=config, schedule=schedule_cls.__name__):
                    self._run_schedule(schedule_cls, config, *groups)
                dist.barrier()
        # The refusals hold for the actions a runtime executes: its compute+comms
        # order loaded from a CSV (without them, find_unused_parameters fails
        # mid-step with "Expected to mark a variable ready only once").
        for config, schedule_cls in (
            ("default", ScheduleZBVZeroBubble),
            ("find_unused_parameters", ScheduleZBVZeroBubble),
            ("find_unused_parameters", ScheduleInterleavedZeroBubble),
            ("static_graph", ScheduleZBVZeroBubble),
        ):
            with self.subTest(config=config, schedule=schedule_cls.__name__, csv=True):
                self._run_schedule(schedule_cls, config, *groups, csv=True)
            dist.barrier()
        dist.destroy_process_group()

    def test_ddp_find_unused_split_last_backward_pp2(self):
        # (dp, pp) = (1, 2): ScheduleDualPipeV puts stages 0 and 3 on rank 0 (last
        # backwards: stage 0's W, which runs the whole backward, and a fused B)
        # and stages 1 and 2 on rank 1 (last backwards split). Every rank
        # refuses, also rank 0, whose own stages would be fine, instead of
        # waiting on rank 1.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (1, DP), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        modules = build(4, with_unused=True)
        mine = {0: [0, 3], 1: [1, 2]}[self.rank]
        stages = [
            PipelineStage(
                DDP(
                    modules[i],
                    process_group=dp_group,
                    find_unused_parameters=True,
                ),
                i,
                4,
                torch.device("cpu"),
                group=pp_group,
            )
            for i in mine
        ]
        schedule = ScheduleDualPipeV(
            stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
        )
        x, y = data(0, 0)
        with self.assertRaisesRegex(
            RuntimeError, r"stages \[1, 2\].*find_unused_parameters=True"
        ):
            if self.rank == 0:
                schedule.step(x, target=y)
            else:
                schedule.step()
        for i in mine:
            for p in modules[i].parameters():
                self.assertIsNone(p.grad)
        dist.barrier()
        dist.destroy_process_group()

    def test_ddp_find_unused_on_stage_0_only(self):
        # (dp, pp) = (2, 1): under ScheduleZBVZeroBubble and
        # ScheduleInterleavedZeroBubble only stage 0 (whose last backward, its W,
        # runs the whole backward) is DDP(find_unused_parameters=True), with an
        # unused parameter; the other stages, whose last backward is split, are
        # plain modules (their grads all-reduced by hand) or DDP with the
        # default options. Nothing is refused, and the grads equal the reference.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls in (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble):
            for rest in ("plain", "ddp"):
                n_stages = SCHEDULES[schedule_cls]
                modules = build(n_stages)
                modules[0].unused = torch.nn.Parameter(
                    torch.ones(DIM, dtype=torch.float64)
                )
                wrapped = [
                    DDP(module, process_group=dp_group, find_unused_parameters=i == 0)
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

    def _usage_step(self, case, schedule_cls, dp_group, pp_group):
        n_stages = SCHEDULES[schedule_cls]
        extra_stage = n_stages - 1 if case == "unused_then_used" else None
        modules = build(n_stages, extra_stage=extra_stage)
        comms = []
        ddps = []
        for i, module in enumerate(modules):
            ddp = recording_ddp(module, dp_group, comms, (i,))
            if case.startswith("manual"):
                ddp.require_manual_backward_finalization = True
            ddps.append(ddp)
        scale_grads = case in ("manual_scale_grads", "dw_builder")
        extra = {"dw_builder": lambda: lambda: None} if case == "dw_builder" else {}

        def make_schedule():
            stages = [
                PipelineStage(
                    ddp, i, n_stages, torch.device("cpu"), group=pp_group, **extra
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

        schedule = make_schedule()
        refused = {"manual_scale_grads": "require_manual_backward_finalization=True"}
        if schedule_cls in SPLIT:
            refused["dw_builder"] = "dw_builder"
        if case in refused:
            x, y = data(0, self.rank)
            with self.assertRaisesRegex(RuntimeError, refused[case]):
                schedule.step(x, target=y)
            self.assertEqual(comms, [])
            return
        if case == "frozen_after_wrap":
            # A parameter frozen after DDP wrapped the module (and after the
            # stage was built) is still one DDP reduces: the last stage's last W
            # (split) cannot reach it and raises before arming, on both ranks.
            modules[-1].b.requires_grad_(False)
            x, y = data(0, self.rank)
            with self.assertRaisesRegex(
                RuntimeError,
                r"parameters \['b'\] .* get no gradient .*\['b'\] no longer "
                "require grad",
            ):
                schedule.step(x, target=y)
            self.assertEqual([c[:2] for c in comms if c[0] == n_stages - 1], [])
            for ddp in ddps:
                self.assertFalse(ddp.require_manual_backward_finalization)
            return
        if case == "bypass_ddp":
            # After a step, a backward through the module itself (not through
            # DDP's forward) is not reduced, as with DDP alone: the step leaves
            # DDP's reducer unarmed, also after a split last backward.
            x, y = data(0, self.rank)
            schedule.step(x, target=y)
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
            return
        if case == "failed_last_w":
            # A user hook raises in the last stage's last W, after the schedule
            # set manual finalization and armed the reducer (on both ranks).
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
                rf"\[Stage {n_stages - 1}\] the weight backward that reduces "
                r"the gradients of this DistributedDataParallel stage raised "
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

            enable_grad = modules[-1].register_forward_pre_hook(
                enable_grad_and_leave_it_on
            )
            with torch.no_grad(), self.assertRaisesRegex(RuntimeError, left_armed):
                ddps[-1](x)
            enable_grad.remove()
            with self.assertRaisesRegex(RuntimeError, left_armed):
                make_schedule().step(x, target=y)
            self.assertEqual(comms, [])
            return
        reference = None
        for step in range(N_STEPS + (case == "unused_then_used")):
            x, y = data(step, self.rank)
            comms.clear()
            if case == "unused_then_used" and step == 0:
                # The last stage's extra parameter gets no gradient: its last W
                # (split) raises before anything is armed or set, on both ranks.
                modules[-1].use_extra = False
                with self.assertRaisesRegex(
                    RuntimeError, r"parameters \['extra'\] .* get no gradient"
                ):
                    schedule.step(x, target=y)
                self.assertEqual([c[:2] for c in comms if c[0] == n_stages - 1], [])
                for ddp in ddps:
                    self.assertFalse(ddp.require_manual_backward_finalization)
                for module in modules:
                    for p in module.parameters():
                        p.grad = None
                modules[-1].use_extra = True
                # Pipelining needs new stages and a new schedule after a step
                # that raised; the DDP modules are reused as they are.
                schedule = make_schedule()
                continue
            with contextlib.ExitStack() as stack:
                if case == "no_sync" and step == 0:
                    for ddp in ddps:
                        stack.enter_context(ddp.no_sync())
                schedule.step(x, target=y)
            if case == "manual":
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
            if case == "no_sync" and step == 0:
                continue
            reference = reference_grads(
                build(n_stages, extra_stage=extra_stage), step, DP
            )
            if case == "no_sync":  # step 0's gradients were accumulated
                for ref, ref0 in zip(
                    reference, reference_grads(build(n_stages), 0, DP), strict=True
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

    def _shared_steps(
        self, groups, block, schedules, plan, on_module=None, **ddp_kwargs
    ):
        """Stages 0 and 1 (pp = 1) share one DDP module. ``schedules``: name ->
        schedule class, or an ``ORDERS`` name for a _PipelineScheduleRuntime
        running that order, all over the same stages. ``plan``: one (schedule
        name, order name or None) per step; an order name loads that order into
        the runtime before the step. A step whose order a refusal names is
        given as (schedule name, order name, error pattern), and ends the case.
        ``on_module(module)``, if given, returns a function called with the step
        after each step (it may register hooks). After every step, the
        parameters carry no hook the schedule registered (the parameter use is
        recorded during a step)."""
        dp_group, pp_group = groups
        torch.manual_seed(0)
        module = block()
        after_step = on_module(module) if on_module is not None else None

        def hook_counts():
            return {
                name: len(p._post_accumulate_grad_hooks or {})
                for name, p in module.named_parameters()
            }

        own_hooks = hook_counts()

        def assert_no_schedule_hooks(msg):
            self.assertEqual(hook_counts(), own_hooks, msg=f"{msg}: hooks left")

        calls = []
        ddp = recording_ddp(module, dp_group, calls, (), **ddp_kwargs)
        stages = [
            PipelineStage(ddp, i, 2, torch.device("cpu"), group=pp_group)
            for i in range(2)
        ]
        built = {}
        for name, kind in schedules.items():
            if isinstance(kind, str):
                built[name] = _PipelineScheduleRuntime(
                    stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                )
                built[name]._prepare_schedule_with_comms({0: ORDERS[kind]})
            else:
                built[name] = kind(
                    stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
                )
        for step, (name, order, *refusal) in enumerate(plan):
            if order is not None:
                built[name]._prepare_schedule_with_comms({0: ORDERS[order]})
            calls.clear()
            x, y = data(step, self.rank)
            msg = f"step {step} ({name}, order {order})"
            if refusal:
                with self.assertRaisesRegex(RuntimeError, refusal[0]):
                    built[name].step(x, target=y)
                # Refused before DDP's reducer was armed: nothing reduced, and
                # a forward runs (DDP raises "Expected to have finished
                # reduction in the prior iteration" after an armed backward
                # failed, also under no_sync()).
                self.assertEqual(calls, [], msg=msg)
                self.assertFalse(ddp.require_manual_backward_finalization, msg=msg)
                with ddp.no_sync():
                    ddp(x)
                assert_no_schedule_hooks(msg)
                return
            built[name].step(x, target=y)
            assert_no_schedule_hooks(msg)
            if after_step is not None:
                after_step(step)
                own_hooks = hook_counts()
            torch.manual_seed(0)
            ref = block()
            reference_grads([ref, ref], step, DP)
            for (pname, p), r in zip(
                module.named_parameters(), ref.parameters(), strict=True
            ):
                # A sparse gradient stays sparse (its indices may differ).
                self.assertEqual(p.grad.layout, r.grad.layout, msg=f"{msg} {pname}")
                torch.testing.assert_close(
                    p.grad.to_dense(), r.grad.to_dense(), msg=f"{msg} {pname}"
                )
                p.grad = None
            assert_each_bucket_once(self, calls, module, msg)

    def test_ddp_shared_module_order_and_partial_use(self):
        # Two stages on the rank share one DDP module; the stage whose last
        # backward comes last in the executed order reduces it, decided at every
        # step; a parameter that only some sharing stages use is reduced too.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        izb, w1 = ScheduleInterleavedZeroBubble, "w1_last"
        cases = {
            # Two schedules over the same stages whose orders end with different
            # stages (IZB: stage 0; the runtime order: stage 1), alternated.
            "alternate": (
                Block,
                {"a": izb, "b": w1},
                [("a", None), ("b", None), ("a", None)],
                {},
            ),
            # Another order loaded into the same runtime schedule after a step.
            "reload_w0_w1": (
                Block,
                {"a": "w0_last"},
                [("a", None), ("a", "w1_last"), ("a", None)],
                {},
            ),
            "reload_w1_w0": (Block, {"a": w1}, [("a", None), ("a", "w0_last")], {}),
            # A reloaded order is checked again: its reducing stage 1 ends with
            # a split W, where find_unused_parameters is refused.
            "reload_refused": (
                Block,
                {"a": "fused"},
                [
                    ("a", None),
                    ("a", "w1_last", r"stages \[1\] .*find_unused_parameters=True"),
                ],
                {"find_unused_parameters": True},
            ),
            # Refused at the step's start (static_graph under a split schedule):
            # the parameter use recorded for the step stops with it.
            "refused_static_graph": (
                Block,
                {"a": ScheduleZBVZeroBubble},
                [("a", None, "static_graph=True")],
                {"static_graph": True},
            ),
            # ``v`` used by stage 1 only: the reducing stage 0's backward (fused,
            # or stage 0's W, which runs the whole backward) does not reach it.
            "input_grad_I1F1B": (
                InputGradBlock,
                {"a": ScheduleInterleaved1F1B},
                [("a", None)] * 2,
                {},
            ),
            "input_grad_ZBV": (
                InputGradBlock,
                {"a": ScheduleZBVZeroBubble},
                [("a", None)] * 2,
                {},
            ),
            "input_grad_IZB": (InputGradBlock, {"a": izb}, [("a", None)] * 2, {}),
            # ``v`` used by stage 0 only; stage 1's split W reduces.
            "stage_0_only_w1_last": (
                lambda: InputGradBlock(stage_0_only=True),
                {"a": w1},
                [("a", None)] * 2,
                {},
            ),
            # find_unused_parameters: the reducing stage 0's backward is fused,
            # stage 1's split W only accumulates.
            "find_unused_ZBV": (
                InputGradBlock,
                {"a": ScheduleZBVZeroBubble},
                [("a", None)] * 2,
                {"find_unused_parameters": True},
            ),
            "find_unused_IZB": (
                InputGradBlock,
                {"a": izb},
                [("a", None)] * 2,
                {"find_unused_parameters": True},
            ),
        }
        for case, (block, schedules, plan, ddp_kwargs) in cases.items():
            with self.subTest(case=case):
                self._shared_steps(groups, block, schedules, plan, **ddp_kwargs)
            dist.barrier()
        dist.destroy_process_group()

    def test_ddp_shared_module_zero_gradient_pass(self):
        # Two stages on the rank share one DDP module and a parameter is used
        # only by stage 1, while stage 0's backward (fused, or its W, which runs
        # the whole backward) reduces: that parameter is marked ready after it
        # with a zero gradient through its AccumulateGrad node.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")

        def count_hook_calls(module):
            # Hooks on the parameters both stages use (the reducing backward
            # reaches them): called once per use, never with a zero gradient.
            names = ("w", "b")
            calls = {name: [] for name in names}
            accumulated = dict.fromkeys(names, 0)
            for name in names:
                p = getattr(module, name)
                p.register_hook(lambda g, name=name: calls[name].append(bool(g.any())))
                p.register_post_accumulate_grad_hook(
                    lambda p, name=name: accumulated.__setitem__(
                        name, accumulated[name] + 1
                    )
                )

            def check(step):
                expected = {name: [True] * 2 * N_MICROBATCHES for name in names}
                msg = f"step {step}"
                self.assertEqual(calls, expected, msg=msg)
                self.assertEqual(
                    accumulated,
                    {name: len(c) for name, c in expected.items()},
                    msg=msg,
                )
                for name in calls:
                    calls[name].clear()
                    accumulated[name] = 0

            return check

        def hook_on_v(kind):
            # After the first step (DDP has rebuilt its buckets, one parameter
            # each), a hook on ``v`` (stage 1 only) that the zero-gradient pass
            # would call once more: additive, so the extra call would change
            # .grad.
            def add_one(p):
                p.grad.add_(1.0)

            def on_module(module):
                def after_step(step):
                    if kind == "tensor":
                        module.v.register_hook(lambda g: g + 1.0)
                    else:
                        module.v.register_post_accumulate_grad_hook(add_one)

                return after_step

            return on_module

        refused = (
            r"parameters \['v'\] of the DistributedDataParallel module that "
            r"several stages on this rank share .* {}"
        )
        cases = {
            # nn.Embedding(sparse=True) used by stage 1 only: the zero has the
            # layout of the sparse .grad, which DDP expects (a dense zero made
            # it dense: "Expected variable to have sparse gradient").
            "sparse_I1F1B": (SparseEmbeddingBlock, ScheduleInterleaved1F1B, None),
            "sparse_ZBV": (SparseEmbeddingBlock, ScheduleZBVZeroBubble, None),
            # Hooks only on parameters the reducing backward reaches.
            "hooks_I1F1B": (InputGradBlock, ScheduleInterleaved1F1B, count_hook_calls),
            "hooks_ZBV": (InputGradBlock, ScheduleZBVZeroBubble, count_hook_calls),
        }
        for case, (block, schedule_cls, on_module) in cases.items():
            with self.subTest(case=case):
                self._shared_steps(
                    groups,
                    block,
                    {"a": schedule_cls},
                    [("a", None)] * N_STEPS,
                    on_module=on_module,
                )
            dist.barrier()
        # A hook on ``v``, which the pass would call once more with a zero
        # gradient: the next step is refused on both ranks before DDP's
        # reducer is armed. The reducing backward: stage 0's fused B
        # (ScheduleInterleaved1F1B), stage 0's W, which runs the whole backward
        # (ScheduleZBVZeroBubble), and, with ``v`` used by stage 0 only, stage
        # 1's split W (an order ending with it).
        for kind, pattern in (
            ("tensor", r"tensor hooks \(register_hook\)"),
            ("post", "post-accumulate-grad hooks"),
        ):
            for block, schedule in (
                (InputGradBlock, ScheduleInterleaved1F1B),
                (InputGradBlock, ScheduleZBVZeroBubble),
                (lambda: InputGradBlock(stage_0_only=True), "w1_last"),
            ):
                with self.subTest(hook=kind, schedule=str(schedule)):
                    self._shared_steps(
                        groups,
                        block,
                        {"a": schedule},
                        [("a", None), ("a", None, refused.format(pattern))],
                        on_module=hook_on_v(kind),
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
            "dw_builder",
            "unused_then_used",
            "frozen_after_wrap",
            "failed_last_w",
            "bypass_ddp",
        ):
            for schedule_cls in SCHEDULES:
                if case == "dw_builder" and schedule_cls not in SPLIT:
                    continue
                if case in (
                    "unused_then_used",
                    "frozen_after_wrap",
                    "failed_last_w",
                ) and schedule_cls not in (
                    ScheduleZBVZeroBubble,
                    ScheduleInterleavedZeroBubble,
                ):
                    continue  # the last stage's last backward is fused there
                with self.subTest(case=case, schedule=schedule_cls.__name__):
                    self._usage_step(case, schedule_cls, *groups)
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
# DDP options at (dp, pp) = (2, 2) -> the schedules that refuse them. With more
# than one pipeline rank every stage of ScheduleDualPipeV but stage 0 ends with a
# split W, so find_unused_parameters is refused there too (every rank refuses,
# also the one whose own stages end fused); it works under the fused schedules
# (with a parameter no micro-batch uses). static_graph under a fused schedule is
# a defect of its own (see test_ddp_stages) and is not run.
PP2_CONFIGS = {
    "default": set(),
    "gradient_as_bucket_view": set(),
    "find_unused_parameters": SPLIT,
    "static_graph": SPLIT,
}
# Every collective and pipeline transfer of the four-rank test's DDP modules and
# stages waits at most this long: a rank that does not refuse while its peers do
# fails instead of hanging. (The default group keeps the default timeout, so that
# slow process start-up on a loaded machine is not a failure.)
PG_TIMEOUT = timedelta(seconds=30)


class ScheduleDDPFourRankTest(TwoRankGlooTestCase):
    @property
    def world_size(self) -> int:
        return 4

    def _run_dp2_pp2(self, schedule_cls, config, dp_group, pp_group):
        dp, pp = 2, 2
        dp_rank, pp_rank = divmod(self.rank, pp)
        per_rank, placement = PP2_SCHEDULES[schedule_cls]
        n_stages = per_rank * pp
        layout = (
            [pp_rank, n_stages - 1 - pp_rank]
            if placement == "v"
            else list(range(pp_rank, n_stages, pp))
        )
        with_unused = config == "find_unused_parameters"
        ddp_kwargs = {} if config == "default" else {config: True}
        modules = build(n_stages, with_unused)
        events = []  # ("acc", stage, name) and ("comm", stage, bucket)
        stages = []
        for i in layout:
            ddp = recording_ddp(modules[i], dp_group, events, ("comm", i), **ddp_kwargs)
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
            if schedule_cls in PP2_CONFIGS[config]:
                # Refused on every rank at the first step, before anything is
                # computed or exchanged.
                with self.assertRaisesRegex(RuntimeError, f"{config}=True"):
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

    def test_ddp_stages_dp2_pp2(self):
        # (dp, pp) = (2, 2): two pipeline ranks per data-parallel replica, every
        # stage DDP with the options of PP2_CONFIGS over its two replicas. For
        # two steps, every rank's gradients equal the float64 single-process
        # reference averaged over the replicas, each bucket is handed to the
        # comm hook once per step, and from the second step on (one parameter
        # per bucket) the first bucket's all-reduce starts before the stage's
        # last gradient accumulation. A refused option raises on every rank at
        # the first step with nothing computed or handed to the hook, and the
        # ranks then meet at a barrier (none waits in the pipeline).
        self.init_gloo()
        # The (dp, pp) = (2, 2) mesh's groups (rank = 2 * dp_rank + pp_rank),
        # built directly to give them the short timeout (init_device_mesh
        # would give them the default one).
        dp_groups = [dist.new_group([r, r + 2], timeout=PG_TIMEOUT) for r in (0, 1)]
        pp_groups = [dist.new_group([r, r + 1], timeout=PG_TIMEOUT) for r in (0, 2)]
        groups = dp_groups[self.rank % 2], pp_groups[self.rank // 2]
        for config, refused in PP2_CONFIGS.items():
            for schedule_cls in PP2_SCHEDULES:
                if config == "static_graph" and schedule_cls not in refused:
                    continue
                with self.subTest(config=config, schedule=schedule_cls.__name__):
                    self._run_dp2_pp2(schedule_cls, config, *groups)
                dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
