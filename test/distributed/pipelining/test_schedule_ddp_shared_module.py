# Owner(s): ["oncall: distributed"]
"""Several stages on one rank that share one DistributedDataParallel module (a looped
or V layout built around one module) reduce it once per step, in the last of their
last backwards in the actions the step executes; the others only accumulate.

Two data-parallel replicas (world size 2, gloo), each holding every stage, against
a float64 single-process reference with the shared module, each bucket handed to
the comm hook once per step:
- test_ddp_shared_module: stages 0 and 1 of ScheduleZBVZeroBubble and
  ScheduleDualPipeV (stage 0 reduces), 1 and 3 of ScheduleInterleavedZeroBubble
  and ScheduleInterleaved1F1B (stage 1 reduces), two steps, with the overlap check
  of test_schedule_ddp.py.
- test_ddp_shared_module_order_and_partial_use: the reducing stage is decided at
  every step from the executed order (two schedules over the same stages
  alternated; another order loaded into a runtime schedule; a reloaded order
  whose reducing stage ends with a split W refuses find_unused_parameters;
  static_graph refused at the step's start), and a parameter that only some
  sharing stages use (only when the input requires grad; or by stage 0 only,
  with stage 1's W reducing) is reduced too; find_unused_parameters works where
  the reducing backward is fused. After every step (and the refused one) the
  parameters carry no hook the schedule registered.
- test_ddp_shared_module_zero_gradient_pass: such a parameter is marked ready
  after the reducing backward with a zero gradient through its AccumulateGrad
  node: an nn.Embedding(sparse=True) stays sparse and right, hooks on the
  parameters the reducing backward reaches run once per use and never with a
  zero gradient, and a parameter whose tensor or post-accumulate-grad hooks
  that pass would call once more is refused on every rank before DDP's reducer
  is armed (the fused B, stage 0's W that runs the whole backward, and a split
  W reducing).
- test_ddp_shared_module_hook_on_one_rank: such a hook on one data-parallel rank
  only is refused on every rank (the ranks agree before arming), none waits."""

import torch
import torch.distributed as dist
from test_schedule_ddp import (
    DDPStagesRunner,
    DP,
    PG_TIMEOUT,
    SCHEDULES,
)
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
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.testing._internal.common_utils import run_tests

# schedule -> (a, b): stage b is stage a's DDP module. The stage whose last
# backward comes last reduces it: 0 in the V layouts (its W runs the whole
# backward), 1 in the looped ones (a split W, or a fused B).
SHARED = {
    ScheduleZBVZeroBubble: (0, 1),
    ScheduleDualPipeV: (0, 1),
    ScheduleInterleavedZeroBubble: (1, 3),
    ScheduleInterleaved1F1B: (1, 3),
}


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


class ScheduleDDPSharedModuleTest(DDPStagesRunner, TwoRankGlooTestCase):
    def test_ddp_shared_module(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls in SCHEDULES:
            with self.subTest(schedule=schedule_cls.__name__):
                self._run_schedule(
                    schedule_cls,
                    {},
                    *groups,
                    name="shared_module",
                    shared=SHARED[schedule_cls],
                )
            dist.barrier()
        dist.destroy_process_group()

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

    def test_ddp_shared_module_hook_on_one_rank(self):
        # The hook on ``v`` of test_ddp_shared_module_zero_gradient_pass on rank
        # 0 only (e.g. a gradient-logging hook): every rank raises at the next
        # step before DDP's reducer is armed, rank 0 naming ``v`` and rank 1
        # naming rank 0, and nothing is handed to the comm hook (without the
        # ranks agreeing, rank 1 armed its reducer and waited in DDP's
        # all-reduce until the process group's timeout). The data-parallel group
        # times out after 30 s, so a rank left waiting fails instead of hanging.
        self.init_gloo()
        mesh = init_device_mesh("cpu", (DP, 1), mesh_dim_names=("dp", "pp"))
        groups = dist.new_group([0, 1], timeout=PG_TIMEOUT), mesh.get_group("pp")

        def on_module(module):
            def after_step(step):
                if self.rank == 0:
                    module.v.register_hook(lambda g: None)

            return after_step

        refused = (
            r"parameters \['v'\] of the DistributedDataParallel module that "
            r"several stages on this rank share .* tensor hooks \(register_hook\)"
            if self.rank == 0
            else r"data-parallel rank 0 .* refused to reduce the module"
        )
        for block, schedule in (
            (InputGradBlock, ScheduleInterleaved1F1B),
            (InputGradBlock, ScheduleZBVZeroBubble),
            (lambda: InputGradBlock(stage_0_only=True), "w1_last"),
        ):
            with self.subTest(schedule=str(schedule)):
                self._shared_steps(
                    groups,
                    block,
                    {"a": schedule},
                    [("a", None), ("a", None, refused)],
                    on_module=on_module,
                )
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
