# Owner(s): ["oncall: distributed"]
"""A ``step()`` after a step that raised part-way through computes the gradients of its
own micro-batches: it does not run backwards from the losses that the failed step left
in the schedule. One gloo rank holds every stage; the failure is injected in the loss
function, in the last stage's forward or in a gradient hook of stage 0's weight, after
some micro-batches finished; the caller clears the grads (as ``zero_grad`` does) and runs
the next step on new data, whose grads must equal a single-process float64 reference."""

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import PipeliningMetadataError
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)


DIM, BATCH, N_MICROBATCHES = 4, 8, 4
MULTI_STAGE = (
    ScheduleZBVZeroBubble,
    ScheduleInterleavedZeroBubble,
    ScheduleInterleaved1F1B,
)


class Injected(RuntimeError):
    pass


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(DIM, dtype=torch.float64) * 0.1)
        self.fail_at_call = None
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise Injected(f"forward call {self.calls}")
        return torch.tanh(x @ self.w + self.b)


def build(n_stages):
    torch.manual_seed(0)
    return [Block() for _ in range(n_stages)]


def batch(step):
    g = torch.Generator().manual_seed(100 * step)
    x = torch.randn(BATCH, DIM, dtype=torch.float64, generator=g)
    y = torch.randn(BATCH, DIM, dtype=torch.float64, generator=g)
    return x, y


def mse(out, target):
    return ((out - target) ** 2).mean()


def reference_grads(n_stages, step):
    """Grads of one step on plain tensors: mean of the micro-batch losses."""
    torch.manual_seed(0)
    params = [
        (
            (torch.randn(DIM, DIM, dtype=torch.float64) * 0.5).requires_grad_(),
            (torch.randn(DIM, dtype=torch.float64) * 0.1).requires_grad_(),
        )
        for _ in range(n_stages)
    ]
    x, y = batch(step)
    total = 0
    for xm, ym in zip(x.chunk(N_MICROBATCHES), y.chunk(N_MICROBATCHES)):
        out = xm
        for w, b in params:
            out = torch.tanh(out @ w + b)
        total = total + mse(out, ym) / N_MICROBATCHES
    flat = [p for pair in params for p in pair]
    return torch.autograd.grad(total, flat)


class StepAfterFailedStepTest(TestCase):
    def setUp(self):
        super().setUp()
        self._dir = tempfile.TemporaryDirectory()
        store = dist.FileStore(os.path.join(self._dir.name, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)

    def tearDown(self):
        dist.destroy_process_group()
        self._dir.cleanup()
        super().tearDown()

    def _schedule(self, schedule_cls, where, k):
        """A schedule whose first step raises at the k-th call of ``where``."""
        single = schedule_cls in (ScheduleGPipe, Schedule1F1B)
        n_stages = 1 if single else 2
        modules = build(n_stages)
        stages = [
            PipelineStage(m, i, n_stages, torch.device("cpu"))
            for i, m in enumerate(modules)
        ]
        armed = [True]
        loss_calls, hook_calls = [0], [0]

        def loss_fn(out, target):
            loss_calls[0] += 1
            if armed[0] and where == "loss" and loss_calls[0] == k:
                raise Injected(f"loss call {k}")
            return mse(out, target)

        def hook(grad):
            hook_calls[0] += 1
            if armed[0] and where == "backward" and hook_calls[0] == k:
                raise Injected(f"stage 0 weight hook call {k}")
            return grad

        modules[0].w.register_hook(hook)
        if where == "forward":
            modules[-1].fail_at_call = k
        stage_arg = stages[0] if single else stages
        schedule = schedule_cls(
            stage_arg, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn
        )

        def disarm():
            armed[0] = False
            modules[-1].fail_at_call = None

        return modules, schedule, disarm

    def _fail_first_step(self, schedule, disarm, modules):
        x, y = batch(0)
        with self.assertRaises(Exception) as ctx:
            schedule.step(x, target=y)
        error = ctx.exception
        self.assertIsInstance(
            error if isinstance(error, Injected) else error.__cause__, Injected
        )
        # the failure happened after some micro-batches finished their loss
        self.assertGreater(len(schedule._internal_losses), 0)
        disarm()
        for m in modules:
            m.zero_grad(set_to_none=True)

    def _check_next_step(self, schedule, modules):
        x, y = batch(1)
        schedule.step(x, target=y)
        grads = [p.grad for m in modules for p in m.parameters()]
        for grad, expected in zip(grads, reference_grads(len(modules), 1), strict=True):
            self.assertIsNotNone(grad)
            self.assertEqual(grad, expected, atol=1e-12, rtol=1e-12)
        self.assertEqual(schedule._internal_losses, [])

    @parametrize("schedule_cls", MULTI_STAGE, name_fn=lambda c: c.__name__)
    @parametrize("where,k", [("loss", 4), ("forward", 3), ("forward", 5)])
    def test_multi_stage(self, schedule_cls, where, k):
        modules, schedule, disarm = self._schedule(schedule_cls, where, k)
        self._fail_first_step(schedule, disarm, modules)
        self._check_next_step(schedule, modules)

    @parametrize("k", [1, 3])
    def test_dualpipev_backward_failure(self, k):
        modules, schedule, disarm = self._schedule(ScheduleDualPipeV, "backward", k)
        self._fail_first_step(schedule, disarm, modules)
        self._check_next_step(schedule, modules)

    @parametrize("where,k", [("loss", 4), ("forward", 3)])
    def test_dualpipev_forward_failure_refused(self, where, k):
        # A forward that fails in DualPipeV's overlapped F/B pair leaves a
        # gradient receive buffer assigned; the next step refuses it instead of
        # running (see _recv_buffers._INCOMPLETE_RECV_BUFFER_ERROR).
        modules, schedule, disarm = self._schedule(ScheduleDualPipeV, where, k)
        self._fail_first_step(schedule, disarm, modules)
        x, y = batch(1)
        with self.assertRaisesRegex(
            PipeliningMetadataError,
            "still owned .* Build new stages and a new schedule to run another step",
        ) as ctx:
            schedule.step(x, target=y)
        # Every stage is on this rank: no P2P work is in flight, so the process
        # group is kept, and new stages and a new schedule around the same
        # modules train on.
        self.assertRegex(
            str(ctx.exception),
            "If every stage is on this rank, no P2P work is in flight and the "
            "process group can be kept",
        )
        for m in modules:  # the refused step may have accumulated some
            m.zero_grad(set_to_none=True)
        stages = [
            PipelineStage(m, i, len(modules), torch.device("cpu"))
            for i, m in enumerate(modules)
        ]
        schedule = ScheduleDualPipeV(stages, n_microbatches=N_MICROBATCHES, loss_fn=mse)
        self._check_next_step(schedule, modules)

    @parametrize(
        "schedule_cls", (ScheduleGPipe, Schedule1F1B), name_fn=lambda c: c.__name__
    )
    @parametrize("where,k", [("loss", 3), ("forward", 4)])
    def test_single_stage(self, schedule_cls, where, k):
        modules, schedule, disarm = self._schedule(schedule_cls, where, k)
        self._fail_first_step(schedule, disarm, modules)
        self._check_next_step(schedule, modules)

    @parametrize(
        "schedule_cls",
        (ScheduleGPipe, ScheduleZBVZeroBubble),
        name_fn=lambda c: c.__name__,
    )
    def test_losses_list(self, schedule_cls):
        # losses= gets this step's losses only (it raised "Expecting 4 losses
        # but got 6" when the failed step left two)
        modules, schedule, disarm = self._schedule(schedule_cls, "loss", 4)
        self._fail_first_step(schedule, disarm, modules)
        x, y = batch(1)
        losses = []
        schedule.step(x, target=y, losses=losses)
        with torch.no_grad():
            expected = []
            for xm, ym in zip(x.chunk(N_MICROBATCHES), y.chunk(N_MICROBATCHES)):
                out = xm
                for m in modules:
                    out = torch.tanh(out @ m.w + m.b)
                expected.append(mse(out, ym))
        self.assertEqual(len(losses), N_MICROBATCHES)
        for loss, ref in zip(losses, expected, strict=True):
            self.assertEqual(loss, ref, atol=1e-12, rtol=1e-12)


instantiate_parametrized_tests(StepAfterFailedStepTest)


if __name__ == "__main__":
    run_tests()
