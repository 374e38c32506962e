"""Upstream's strategy validator (`torch.distributed.tensor._ops.strategy_validation`) and the
one DTensor rule it found wrong: each row is a rule family of the validator's sweep.

A validator row is correct when the validator judges a known-right rule right and a
known-wrong rule wrong; the rule and the truth are given in the row's detail.
"""

from __future__ import annotations

import subprocess
import sys

from tools.reproducers import Outcome, reproducer
from tools.reproducers.dtensor_partial import WORLD_SIZE, two_rank_partial

SHAPE_PATCH = (
    "[DTensor] strategy_validation: run the local op with the local sizes DTensor gives it"
)
PARSE_PATCH = (
    "[DTensor] strategy_validation: check _NormPartial and _StridedShard rules instead of "
    "reporting them"
)
NEGATE_PATCH = (
    "[DTensor] strategy_validation: do not negate integer indices next to floating-point values"
)
RANDOM_PATCH = (
    "[DTensor] strategy_validation: skip geometric, log_normal and multinomial like the other "
    "random samplers"
)
PARTIAL_PATCH = (
    "[DTensor] strategy_validation: build Partial inputs for every reduce op and integer dtype"
)
TOLERANCE_PATCH = (
    "[DTensor] strategy_validation: compare within the rounding of the per-rank values"
)


def judge(op, args, right, wrong=None) -> Outcome:
    """The validator's verdicts on a right and (optionally) a wrong combination."""
    import torch.distributed as dist
    import torch.distributed.tensor._ops.strategy_validation as sv
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=WORLD_SIZE)
    truth = sv._to_ground_truth(op(*args))
    verdicts = []
    with LocalTensorMode(frozenset(range(WORLD_SIZE))):
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        for combination in (right, wrong) if wrong else (right,):
            verdict, _ = sv.validate_aten_combination(
                op, args, {}, truth, combination, WORLD_SIZE, mesh
            )
            verdicts.append(verdict)
    ok = verdicts[0] is True and (wrong is None or verdicts[1] is False)
    names = ["right rule: " + str(verdicts[0])]
    if wrong:
        names.append("wrong rule: " + str(verdicts[1]))
    return Outcome(ok, ", ".join(names) + " (expected True, False)")


@reproducer(
    bug="linalg_vector_norm(P(max), inf) keeps P(max): locals [-5, 1], [1, 1] read 5, truth 1",
    upstream="-",
    patch="[DTensor] An inf-norm of a Partial(max) DTensor reduces the input first",
)
def inf_norm_of_partial_max() -> Outcome:
    import torch

    per_rank = {0: torch.tensor([-5.0, 1.0]), 1: torch.tensor([1.0, 1.0])}
    dt, mode = two_rank_partial("max", lambda r: per_rank[r])
    with mode:
        value = torch.linalg.vector_norm(dt, float("inf")).full_tensor().reconcile().item()
    truth = torch.linalg.vector_norm(torch.stack(list(per_rank.values())).amax(0), float("inf"))
    return Outcome(value == truth.item(), f"value {value}, truth {truth.item()}")


@reproducer(
    bug="avg_pool2d of an int64 P(sum) keeps P(sum): window sums 11, 5 read 2 + 1, truth 4",
    upstream="-",
    patch="[DTensor] avg_pool of an integer Partial DTensor reduces the input first",
)
def integer_avg_pool_of_partial_sum() -> Outcome:
    import torch
    import torch.nn.functional as F

    per_rank = {0: torch.tensor([[[[1, 2], [3, 5]]]]), 1: torch.tensor([[[[1, 1], [1, 2]]]])}
    dt, mode = two_rank_partial("sum", lambda r: per_rank[r])
    with mode:
        value = F.avg_pool2d(dt, 2).full_tensor().reconcile().item()
    truth = F.avg_pool2d(per_rank[0] + per_rank[1], 2).item()
    return Outcome(value == truth, f"value {value}, truth {truth}")


@reproducer(
    bug="validator: view [4,4,4] -> [16,4] S(0) -> S(0) called incorrect (global sizes)",
    upstream="-",
    patch=SHAPE_PATCH,
)
def validator_view_shape_args() -> Outcome:
    import torch
    from torch.distributed.tensor import Shard

    x = torch.randn(4, 4, 4)
    right, wrong = ((Shard(0),), (Shard(0),)), ((Shard(0),), (Shard(1),))
    return judge(torch.ops.aten.view.default, (x, [16, 4]), right, wrong)


@reproducer(
    bug="validator: group_norm S(0), R, R -> S(0) x3 called incorrect (global N)",
    upstream="-",
    patch=SHAPE_PATCH,
)
def validator_group_norm_scalars() -> Outcome:
    import torch
    from torch.distributed.tensor import Replicate, Shard

    args = (torch.randn(2, 6, 3), torch.randn(6), torch.randn(6), 2, 6, 3, 2, 1e-5)
    right = ((Shard(0), Replicate(), Replicate()), (Shard(0),) * 3)
    wrong = ((Shard(0), Replicate(), Replicate()), (Replicate(),) * 3)
    return judge(torch.ops.aten.native_group_norm.default, args, right, wrong)


@reproducer(
    bug="validator: norm S(0) -> _NormP(2) called incorrect without a test (unparsed)",
    upstream="-",
    patch=PARSE_PATCH,
)
def validator_norm_partial_parsed() -> Outcome:
    import torch.distributed.tensor._ops.strategy_validation as sv

    parsed = sv.parse_placement("_NormP(2)"), sv.parse_placement("_S(0, 4)")
    return Outcome(None not in parsed, f"_NormP(2), _S(0, 4) parse to {parsed}")


_LDL_SOLVE = """
import torch, torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
dist.init_process_group("fake", rank=0, world_size=2)
a = torch.randn(5, 5)
ld, pivots = torch.linalg.ldl_factor(a + a.mT)
m = sv._prepare_aten_mitigations(torch.ops.aten.linalg_ldl_solve.default, (ld, pivots, a), {})
print("pivots negated:", not torch.equal(m.negated_args[1], pivots))
for _ in range(200):
    junk = [torch.randn(64) for _ in range(64)]
print("exited normally")
"""


@reproducer(
    bug="validator: linalg.ldl_solve negates pivots and corrupts the heap (SIGABRT)",
    upstream="-",
    patch=NEGATE_PATCH,
)
def validator_ldl_solve_pivots() -> Outcome:
    proc = subprocess.run(
        [sys.executable, "-c", _LDL_SOLVE], capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line]
    ok = proc.returncode == 0 and "pivots negated: False" in lines
    return Outcome(ok, f"exit {proc.returncode}; " + "; ".join(lines))


@reproducer(
    bug="validator: geometric / log_normal / multinomial rules called incorrect (random samplers)",
    upstream="-",
    patch=RANDOM_PATCH,
)
def validator_skips_random_samplers() -> Outcome:
    import torch.distributed.tensor._ops.strategy_validation as sv

    skipped = {op: op in sv.SKIP_OPS for op in ("geometric", "log_normal", "multinomial")}
    return Outcome(all(skipped.values()), f"in SKIP_OPS: {skipped}")


@reproducer(
    bug="validator: bf16 grid_sampler_2d P(sum), R -> P(sum) called incorrect (outputs cancel)",
    upstream="-",
    patch=TOLERANCE_PATCH,
)
def validator_grid_sampler_bfloat16() -> Outcome:
    import torch
    from torch.distributed.tensor import Partial, Replicate

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 24, generator=g).to(torch.bfloat16)
    grid = (torch.rand(2, 15, 12, 2, generator=g) * 2.2 - 1.1).to(torch.bfloat16)
    right = ((Partial("sum"), Replicate()), (Partial("sum"),))
    wrong = ((Partial("sum"), Replicate()), (Partial("avg"),))
    return judge(torch.ops.aten.grid_sampler_2d.default, (x, grid, 0, 0, False), right, wrong)


@reproducer(
    bug="validator: int64 add P(sum), P(sum) -> P(sum) called incorrect (float splits)",
    upstream="-",
    patch=PARTIAL_PATCH,
)
def validator_integer_partial_sum() -> Outcome:
    import torch
    from torch.distributed.tensor import Partial, Replicate

    a, b = torch.arange(-6, 6).reshape(3, 4), torch.arange(12).reshape(3, 4)
    right = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
    wrong = ((Partial("sum"), Partial("sum")), (Replicate(),))
    return judge(torch.ops.aten.add.Tensor, (a, b), right, wrong)


@reproducer(
    bug="validator: clone P(product) -> P(product) called incorrect (every rank full value)",
    upstream="-",
    patch=PARTIAL_PATCH,
)
def validator_product_partial() -> Outcome:
    import torch
    from torch.distributed.tensor import Partial

    x = torch.randn(4, 4)
    right = ((Partial("product"),), (Partial("product"),))
    wrong = ((Partial("product"),), (Partial("sum"),))
    return judge(torch.ops.aten.clone.default, (x,), right, wrong)


@reproducer(
    bug="validator: float32 bmm R, P(sum) -> P(sum) called incorrect (fixed 1e-5 tolerance)",
    upstream="-",
    patch=TOLERANCE_PATCH,
)
def validator_rounding_tolerance() -> Outcome:
    import torch
    from torch.distributed.tensor import Partial, Replicate

    torch.manual_seed(0)
    a, b = torch.randn(12, 4, 12) * 9, torch.randn(12, 12, 4) * 9
    right = ((Replicate(), Partial("sum")), (Partial("sum"),))
    wrong = ((Replicate(), Partial("sum")), (Replicate(),))
    return judge(torch.ops.aten.bmm.default, (a, b), right, wrong)
