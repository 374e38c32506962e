# Owner(s): ["oncall: distributed"]
"""DDP-wrapped pipeline stages with a fused backward: the first step's metadata
inference must not arm DDP's reducer. On two ranks, as two data-parallel replicas
that each hold every stage ((dp, pp) = (2, 1)) and as two pipeline ranks
((dp, pp) = (1, 2)), for two steps every rank's gradients equal a float64
single-process reference averaged over the replicas, and DDP hands every bucket to
its comm hook exactly once per step. Two steps are needed: a bucket reduced twice in
the first step still holds the average (an average of averages), and the second
step shows the damage (DDP's bucket rebuild recorded both reductions).

A stage whose DDP module requires manual backward finalization is reduced by the
caller's finalize_backward() after step(): that works with scale_grads=False (the
loss divided by the number of micro-batches), and scale_grads=True, which would
divide the gradients before finalize_backward() overwrites them, is refused on every
rank before the step exchanges anything."""

import collections

import torch
import torch.distributed as dist
from test_schedule_ddp_manual_scale_grads import (
    Block,
    data,
    loss_fn,
    N_MICROBATCHES,
    recording_ddp,
    STAGES_PER_RANK,
    TwoRankGlooTestCase,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.testing._internal.common_utils import run_tests

N_STEPS = 2


def build(n_stages):
    torch.manual_seed(0)
    return [Block() for _ in range(n_stages)]


def reference_grads(modules, step, dp):
    """Gradients of one process running ``modules`` (freshly built) as the whole
    model, averaged over ``dp`` replicas."""
    for dp_rank in range(dp):
        x, y = data(step, dp_rank)
        for xm, ym in zip(
            x.chunk(N_MICROBATCHES), y.chunk(N_MICROBATCHES), strict=True
        ):
            out = xm
            for module in modules:
                out = module(out)
            (loss_fn(out, ym) / (N_MICROBATCHES * dp)).backward()
    return modules


def buckets_handed(calls, module):
    """``calls``: (bucket index, parameters) of each comm hook call for one DDP
    module in one step. Returns how often each bucket index was handed to the
    hook, or None unless the indices are 0..n-1 and the buckets' parameters
    (GradBucket.parameters()) cover every parameter of the module, each once
    per bucket index."""
    counts = collections.Counter(index for index, _ in calls)
    first = dict(reversed(calls))
    handed = sorted(id(p) for params in first.values() for p in params)
    if sorted(counts) != list(range(len(counts))) or handed != sorted(
        id(p) for p in module.parameters()
    ):
        return None
    return dict(counts)


def assert_each_bucket_once(test, calls, module, msg):
    """DDP handed each of its buckets to the comm hook exactly once (see
    ``buckets_handed``). Returns the number of buckets."""
    counts = buckets_handed(calls, module)
    test.assertTrue(
        counts is not None and set(counts.values()) == {1},
        f"{msg}: each bucket handed to the comm hook once: calls (bucket, "
        f"parameters) {[(b, len(ps)) for b, ps in calls]}",
    )
    return len(counts)


def run_and_compare(
    test, schedule, modules, layout, dp_rank, dp, name, calls=None, on_step=None
):
    """Runs ``N_STEPS`` steps of ``schedule``, whose stages ``layout`` (of
    ``len(modules)``) this rank holds with ``modules``, on data replica
    ``dp_rank`` of ``dp``. After each step (and ``on_step(step)``), the
    gradients of these stages equal ``reference_grads``, and, where ``calls``
    maps each stage to its comm hook calls, DDP handed each bucket to the hook
    once; then the gradients and calls are cleared."""
    n_stages = len(modules)
    for step in range(N_STEPS):
        x, y = data(step, dp_rank)
        args = (x,) if 0 in layout else ()
        kwargs = {"target": y} if n_stages - 1 in layout else {}
        schedule.step(*args, **kwargs)
        if on_step is not None:
            on_step(step)
        reference = reference_grads(build(n_stages), step, dp)
        for i in layout:
            msg = f"{name}, step {step}, stage {i}"
            if calls is not None:
                assert_each_bucket_once(test, calls[i], modules[i], msg)
                calls[i].clear()
            for (pname, p), ref in zip(
                modules[i].named_parameters(), reference[i].parameters(), strict=True
            ):
                torch.testing.assert_close(p.grad, ref.grad, msg=f"{msg} {pname}")
                p.grad = None


class ScheduleDDPMetadataTest(TwoRankGlooTestCase):
    def test_ddp_fused_backward_two_steps(self):
        self.init_gloo()
        for dp, pp in ((2, 1), (1, 2)):
            mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp", "pp"))
            dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
            dp_rank, pp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
            # STAGES_PER_RANK: stages per pipeline rank
            for schedule_cls, per_rank in STAGES_PER_RANK.items():
                n_stages = per_rank * pp
                layout = list(range(pp_rank, n_stages, pp))  # looped
                name = f"{schedule_cls.__name__}, (dp, pp) = ({dp}, {pp})"
                modules = build(n_stages)
                calls = {i: [] for i in layout}
                stages = []
                for i in layout:
                    ddp = recording_ddp(modules[i], dp_group, calls[i])
                    stages.append(
                        PipelineStage(
                            ddp, i, n_stages, torch.device("cpu"), group=pp_group
                        )
                    )
                schedule = schedule_cls(
                    stages if per_rank > 1 else stages[0],
                    n_microbatches=N_MICROBATCHES,
                    loss_fn=loss_fn,
                )
                run_and_compare(
                    self, schedule, modules, layout, dp_rank, dp, name, calls
                )
                dist.barrier()
        dist.destroy_process_group()

    def test_ddp_manual_finalization(self):
        self.init_gloo()
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "pp"))
        dp_group, pp_group = mesh.get_group("dp"), mesh.get_group("pp")
        for schedule_cls, n_stages in STAGES_PER_RANK.items():
            for scale_grads in (True, False):
                with self.subTest(schedule=schedule_cls.__name__, scale=scale_grads):
                    modules = build(n_stages)
                    calls = []  # (stage, bucket index, bucket parameters)
                    ddps, stages = [], []
                    for i, module in enumerate(modules):
                        ddp = recording_ddp(module, dp_group, calls, (i,))
                        ddp.require_manual_backward_finalization = True
                        ddps.append(ddp)
                        stages.append(
                            PipelineStage(
                                ddp, i, n_stages, torch.device("cpu"), group=pp_group
                            )
                        )
                    schedule = schedule_cls(
                        stages if n_stages > 1 else stages[0],
                        n_microbatches=N_MICROBATCHES,
                        loss_fn=loss_fn
                        if scale_grads
                        else (lambda o, t: loss_fn(o, t) / N_MICROBATCHES),
                        scale_grads=scale_grads,
                    )
                    for step in range(N_STEPS):
                        x, y = data(step, self.rank)
                        if scale_grads:
                            with self.assertRaisesRegex(
                                RuntimeError,
                                r"scale_grads=True\).*require_manual_backward_"
                                "finalization=True",
                            ):
                                schedule.step(x, target=y)
                            self.assertEqual(calls, [])
                            break
                        schedule.step(x, target=y)
                        for ddp in ddps:
                            ddp.finalize_backward()
                        reference = reference_grads(build(n_stages), step, 2)
                        for i, (module, ref_module) in enumerate(
                            zip(modules, reference, strict=True)
                        ):
                            msg = f"step {step}, stage {i}"
                            assert_each_bucket_once(
                                self,
                                [(b, ps) for j, b, ps in calls if j == i],
                                module,
                                msg,
                            )
                            for p, ref in zip(
                                module.parameters(),
                                ref_module.parameters(),
                                strict=True,
                            ):
                                torch.testing.assert_close(p.grad, ref.grad, msg=msg)
                                p.grad = None
                        calls.clear()
                dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
