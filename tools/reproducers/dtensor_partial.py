"""DTensor Partial placements: values compared with the plain-tensor ground truth.

Two ranks are simulated in this one process with LocalTensorMode over the fake process
group, as upstream's `create_local_tensor_test_class` twins do.
"""

from __future__ import annotations

from tools.reproducers import Outcome, reproducer

WORLD_SIZE = 2
PASS_THROUGH_PATCH = (
    "[DTensor] Views, selections and copies keep every pending reduction without a collective"
)


def two_rank_partial(reduce_op: str, per_rank):
    """A Partial DTensor whose rank r holds ``per_rank(r)``, and the mode to use it in."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.distributed.tensor import DTensor, Partial, init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=WORLD_SIZE)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    mode = LocalTensorMode(frozenset(range(WORLD_SIZE)))
    local = LocalTensor({r: per_rank(r) for r in range(WORLD_SIZE)})
    with mode:
        dt = DTensor.from_local(local, mesh, [Partial(reduce_op)], run_check=False)
    return dt, mode


def full_value(dt, mode) -> list:
    with mode:
        full = dt.full_tensor()
    return full.reconcile().tolist()


def replicate_param_with_partial_grad():
    """A Replicate parameter of ones whose .grad is Partial(sum) of 1 and 2 per rank."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    grad, mode = two_rank_partial("sum", lambda r: torch.ones(3) * (r + 1))
    with mode:
        ones = torch.ones(3)
    weight = torch.nn.Parameter(
        DTensor.from_local(ones, grad.device_mesh, [Replicate()], run_check=False)
    )
    weight.grad = grad
    return weight, mode


@reproducer(
    bug="zero_() / nn.init.zeros_ on Partial(product) raises",
    upstream="-",
    patch=PASS_THROUGH_PATCH,
)
def partial_product_zero_raises() -> Outcome:
    import torch
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.debug import CommDebugMode

    dt, mode = two_rank_partial("product", lambda r: torch.tensor([2.0 + r, -1.0]))
    comm = CommDebugMode()
    with mode, comm:
        torch.nn.init.zeros_(dt)
    value = full_value(dt, mode)
    ok = value == [0.0, 0.0] and dt.placements == (Partial("product"),)
    return Outcome(
        ok and comm.get_total_counts() == 0,
        f"full_tensor {value} (truth [0.0, 0.0]), {dt.placements[0]}, "
        f"{comm.get_total_counts()} collectives",
    )


@reproducer(
    bug="Partial transposed grad of a Replicate param is all-reduced in AccumulateGrad "
    "(new_empty_strided without the DTensor workaround)",
    upstream="pytorch/pytorch#180486",
    patch=(
        "[autograd] clone_obey_contract: a single clone for a tensor subclass gradient when the "
        "parameter has standard strides"
    ),
)
def accumulate_grad_reduces_partial_grad() -> Outcome:
    import torch
    from torch.distributed.tensor import Partial, Replicate, distribute_tensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops._tensor_ops import new_factory_single_dim_strategy
    from torch.distributed.tensor.debug import CommDebugMode, _clear_sharding_prop_cache
    from torch.distributed.tensor.experimental._context_parallel._sharding_rules import (
        _single_dim_strategy_context,
    )

    aten = torch.ops.aten

    def like_new_zeros(op, args_schema, kwargs_schema):  # Partial input -> Replicate output
        return new_factory_single_dim_strategy(aten.new_zeros.default, args_schema, kwargs_schema)

    dt, mode = two_rank_partial("sum", lambda r: torch.arange(6.0).reshape(3, 2).mul(r + 1).t())
    grad = dt
    with mode:
        weight = torch.nn.Parameter(
            distribute_tensor(torch.zeros(2, 3), dt.device_mesh, [Replicate()])
        )
    _clear_sharding_prop_cache()
    comm = CommDebugMode()
    try:
        with (
            _single_dim_strategy_context(
                aten.new_empty_strided.default, like_new_zeros, RuntimeSchemaInfo(1, ["dtype"])
            ),
            mode,
            comm,
        ):
            torch.autograd.backward(weight, grad)
    finally:
        _clear_sharding_prop_cache()
    placement = weight.grad.placements[0]
    value = full_value(weight.grad, mode)
    truth = (torch.arange(6.0).reshape(3, 2).t() * 3).tolist()
    ok = value == truth and placement == Partial("sum") and comm.get_total_counts() == 0
    return Outcome(
        ok, f"grad {placement}, {comm.get_total_counts()} collectives, value ok: {value == truth}"
    )


CAST_PATCH = (
    "[DTensor] Reduce a Partial DTensor before a dtype cast that does not commute with its "
    "reduction"
)
INT_SUM_CAST_PATCH = (
    "[DTensor] Reduce an integer Partial(sum) before casting it to a wider integer or a "
    "floating dtype"
)
PRIMS_CAST_PATCH = (
    "[DTensor] prims.convert_element_type keeps a pending sum through widening casts, like _to_copy"
)
VIEW_DTYPE_PATCH = "[DTensor] view(dtype) of a Partial DTensor reduces it first"


def cast_outcome(reduce_op: str, per_rank: dict, truth: list, cast) -> Outcome:
    """Cast a Partial DTensor and compare with the reduce-then-cast ground truth."""
    dt, mode = two_rank_partial(reduce_op, lambda r: per_rank[r])
    with mode:
        out = cast(dt)
    value = full_value(out, mode)
    return Outcome(value == truth, f"full_tensor {value} (truth {truth}), {out.placements[0]}")


@reproducer(
    bug="P(sum) int8 100+1, 100+2 .to(int32) keeps Partial (the int8 sum wraps)",
    upstream="-",
    patch=INT_SUM_CAST_PATCH,
)
def partial_sum_widening_int_cast() -> Outcome:
    import torch

    per_rank = {
        0: torch.tensor([100, 1], dtype=torch.int8),
        1: torch.tensor([100, 2], dtype=torch.int8),
    }
    return cast_outcome("sum", per_rank, [-56, 3], lambda t: t.to(torch.int32))


@reproducer(
    bug="P(sum) int64 2**24+1, 1 .float() rounds per rank (16777216, truth 16777218)",
    upstream="-",
    patch=INT_SUM_CAST_PATCH,
)
def partial_sum_int64_to_float_rounds() -> Outcome:
    import torch

    per_rank = {0: torch.tensor([2**24 + 1]), 1: torch.tensor([1])}
    return cast_outcome("sum", per_rank, [16777218.0], lambda t: t.float())


@reproducer(
    bug="P(sum) f32 70000, -70000 .to(float16) keeps Partial and reads nan (truth 0)",
    upstream="-",
    patch=CAST_PATCH,
)
def partial_sum_narrowing_float_cast() -> Outcome:
    import torch

    per_rank = {0: torch.tensor([70000.0, 1.0]), 1: torch.tensor([-70000.0, 2.0])}
    return cast_outcome("sum", per_rank, [0.0, 3.0], lambda t: t.to(torch.float16))


@reproducer(
    bug="prims.convert_element_type of P(sum) bf16 -> f32 all-reduces in bf16 (eager .to does not)",
    upstream="pytorch/pytorch#183363",
    patch=PRIMS_CAST_PATCH,
)
def partial_prims_convert_element_type() -> Outcome:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    per_rank = {
        0: torch.tensor([1.5, 2.0], dtype=torch.bfloat16),
        1: torch.tensor([0.25, -1.0], dtype=torch.bfloat16),
    }
    dt, mode = two_rank_partial("sum", lambda r: per_rank[r])
    comm = CommDebugMode()
    with mode, comm:
        out = torch.ops.prims.convert_element_type(dt, torch.float32)
    value = full_value(out, mode)
    ok = value == [1.75, 1.0] and comm.get_total_counts() == 0
    return Outcome(
        ok, f"full_tensor {value}, {out.placements[0]}, {comm.get_total_counts()} collectives"
    )


@reproducer(bug="P(max) int32 200, 100 .to(int8) keeps Partial", upstream="-", patch=CAST_PATCH)
def partial_max_narrowing_int_cast() -> Outcome:
    import torch

    per_rank = {
        0: torch.tensor([200], dtype=torch.int32),
        1: torch.tensor([100], dtype=torch.int32),
    }
    return cast_outcome("max", per_rank, [-56], lambda t: t.to(torch.int8))


@reproducer(
    bug="P(sum) float .int() under inference_mode keeps Partial", upstream="-", patch=CAST_PATCH
)
def partial_sum_int_cast_in_inference_mode() -> Outcome:
    import torch

    per_rank = {0: torch.tensor([1.5]), 1: torch.tensor([1.5])}
    with torch.inference_mode():
        return cast_outcome("sum", per_rank, [3], lambda t: t.int())


@reproducer(
    bug="P(sum) float32 .view(int32) sums bit patterns", upstream="-", patch=VIEW_DTYPE_PATCH
)
def partial_sum_view_dtype() -> Outcome:
    import torch

    per_rank = {0: torch.tensor([1.0]), 1: torch.tensor([2.0])}
    truth = torch.tensor([3.0]).view(torch.int32).tolist()
    return cast_outcome("sum", per_rank, truth, lambda t: t.view(torch.int32))


@reproducer(
    bug="detach() of a Partial(product) DTensor all-reduces",
    upstream="-",
    patch=PASS_THROUGH_PATCH,
)
def partial_product_detach_communicates() -> Outcome:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    dt, mode = two_rank_partial("product", lambda r: torch.tensor([2.0 + r, -1.0]))
    comm = CommDebugMode()
    with mode, comm:
        out = dt.detach()
    value = full_value(out, mode)
    ok = comm.get_total_counts() == 0 and value == [6.0, 1.0]
    return Outcome(ok, f"{out.placements[0]}, {comm.get_total_counts()} collectives, value {value}")


@reproducer(
    bug="select / slice of a Partial(product) or Partial(bxor) DTensor all-reduces",
    upstream="-",
    patch=PASS_THROUGH_PATCH,
)
def partial_product_selection_communicates() -> Outcome:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    results = []
    for reduce_op, per_rank, truth in (
        ("product", lambda r: torch.tensor([[2.0 + r, -1.0], [3.0, 0.5]]), [9.0, 0.25]),
        ("bxor", lambda r: torch.tensor([[12, 7], [5, 3 + r]]), [0, 7]),
    ):
        dt, mode = two_rank_partial(reduce_op, per_rank)
        comm = CommDebugMode()
        with mode, comm:
            out = dt[1][:2]
        value = full_value(out, mode)
        results.append((comm.get_total_counts() == 0 and value == truth, reduce_op, value, comm))
    ok = all(r[0] for r in results)
    detail = "; ".join(
        f"{op}: {c.get_total_counts()} collectives, value {v}" for _, op, v, c in results
    )
    return Outcome(ok, detail)


@reproducer(
    bug="Adam(foreach=True).zero_grad(set_to_none=False) raises on a Partial(sum) grad",
    upstream="-",
    patch="[DTensor] _foreach_zero_ keeps Partial gradients, like zero_",
)
def foreach_zero_grad_on_partial() -> Outcome:
    import torch

    weight, mode = replicate_param_with_partial_grad()
    with mode:
        torch.optim.Adam([weight], foreach=True).zero_grad(set_to_none=False)
    value = full_value(weight.grad, mode)
    return Outcome(value == [0.0, 0.0, 0.0], f"grad {value}, {weight.grad.placements[0]}")


@reproducer(
    bug="int64 P(sum).copy_(Replicate 3, 5) reads 2, 4 (Replicate -> Partial divides integers)",
    upstream="-",
    patch="[DTensor] Replicate -> Partial(sum) keeps integers whole instead of dividing them",
)
def integer_replicate_to_partial_divides() -> Outcome:
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    dst, mode = two_rank_partial("sum", lambda r: torch.zeros(2, dtype=torch.int64))
    with mode:
        src = DTensor.from_local(
            torch.tensor([3, 5]), dst.device_mesh, [Replicate()], run_check=False
        )
        dst.copy_(src)
    value = full_value(dst, mode)
    return Outcome(value == [3, 5], f"full_tensor {value} (truth [3, 5]), {dst.placements[0]}")


PROMOTION_PATCH = (
    "[DTensor] Reduce an integer or bool Partial(sum) DTensor before an op that computes it "
    "in another dtype"
)


def promotion_outcome(dtype, per_rank, fn, truth) -> Outcome:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    dt, mode = two_rank_partial("sum", lambda r: torch.tensor(per_rank[r], dtype=dtype))
    comm = CommDebugMode()
    with mode:
        with comm:
            out = fn(dt)
        placement = out.placements[0]
    value = full_value(out, mode)
    return Outcome(
        value == truth,
        f"full_tensor {value} (truth {truth}), {placement}, {comm.get_total_counts()} collectives",
    )


@reproducer(
    bug="P(sum) int8 100+70+1+3, 100+70+2+2 .sum() counts in int64: 348 (truth -164)",
    upstream="-",
    patch=PROMOTION_PATCH,
)
def partial_sum_int8_sum_promotes() -> Outcome:
    import torch

    per_rank = [[100, 70, 1, 3], [100, 70, 2, 2]]
    return promotion_outcome(torch.int8, per_rank, lambda t: t.sum(), -164)


@reproducer(
    bug="P(sum) int8 100, 100 * 0.5 computes per rank in float32: 100.0 (truth -28.0)",
    upstream="-",
    patch=PROMOTION_PATCH,
)
def partial_sum_int8_mul_float() -> Outcome:
    import torch

    return promotion_outcome(torch.int8, [[100, 1], [100, 2]], lambda t: t * 0.5, [-28.0, 1.5])


@reproducer(
    bug="P(sum) bool cumsum counts per rank: [2, 3] (truth [1, 2], True on both ranks is True)",
    upstream="-",
    patch=PROMOTION_PATCH,
)
def partial_sum_bool_cumsum() -> Outcome:
    import torch

    return promotion_outcome(
        torch.bool, [[True, True], [True, False]], lambda t: t.cumsum(0), [1, 2]
    )


@reproducer(
    bug="P(sum) x + torch.tensor(3) then x + 3: the native sharding cache runs the "
    "0-d tensor's plan for the Python scalar (x + 6 on 2 ranks)",
    upstream="-",
    patch="[DTensor] A scalar and a 0-d tensor share a native sharding entry only if "
    "their plans agree",
)
def scalar_after_zero_dim_tensor_on_partial() -> Outcome:
    import torch
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    def per_rank(r):
        return torch.tensor([1.5 * (r + 1), -2.0 * (r + 1)])

    _clear_sharding_prop_cache()
    try:
        values = []
        for s in (torch.tensor(3), 3):
            x, mode = two_rank_partial("sum", per_rank)
            truth = (sum(per_rank(r) for r in range(WORLD_SIZE)) + 3).tolist()
            with mode:
                result = x + s
            values.append(full_value(result, mode))
    finally:
        _clear_sharding_prop_cache()
    return Outcome(
        values == [truth, truth],
        f"x + torch.tensor(3) {values[0]}, then x + 3 {values[1]} (truth {truth})",
    )


@reproducer(
    bug="P(sum) pieces [0, -2], [5, 5]: x * inf and x / 0.0 read nan on empty caches "
    "(truth [inf, inf]; 0 * inf and -inf + inf are nan)",
    upstream="-",
    patch="[DTensor] mul and div keep a Partial(sum/avg) pending only for a finite factor "
    "and a nonzero divisor",
)
def partial_sum_times_inf() -> Outcome:
    return _partial_sum_factor_calls(after_finite=False)


@reproducer(
    bug="P(sum) pieces [0, -2], [5, 5]: x * 2.0, then x * inf and x / 0.0 read nan "
    "through the sharding caches (keyed without the factor's value class)",
    upstream="-",
    patch="[DTensor] Key a Python number's value class where the sharding caches leave "
    "its value out",
)
def partial_sum_times_inf_after_finite_factor() -> Outcome:
    return _partial_sum_factor_calls(after_finite=True)


def _partial_sum_factor_calls(after_finite: bool) -> Outcome:
    import math

    import torch
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    pieces = [[0.0, -2.0], [5.0, 5.0]]
    whole = torch.tensor(pieces).sum(0)
    calls = [
        ("x * 2.0", lambda t: t * 2.0),
        ("x * inf", lambda t: t * math.inf),
        ("x / 2.0", lambda t: t / 2.0),
        ("x / 0.0", lambda t: t / 0.0),
    ]
    _clear_sharding_prop_cache()
    try:
        values, truths = [], []
        for _, fn in calls:
            if not after_finite:
                _clear_sharding_prop_cache()
            x, mode = two_rank_partial("sum", lambda r: torch.tensor(pieces[r]))
            with mode:
                full = fn(x).full_tensor()
            # rank 0's value: the ranks' nan values do not reconcile
            values.append(full._local_tensors[0].tolist())
            truths.append(fn(whole).tolist())
    finally:
        _clear_sharding_prop_cache()
    detail = ", ".join(
        f"{n} {v} (truth {t})" for (n, _), v, t in zip(calls, values, truths, strict=True)
    )
    return Outcome(values == truths, detail)
