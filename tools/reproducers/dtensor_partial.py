"""DTensor Partial placements: values compared with the plain-tensor ground truth.

Two ranks are simulated in this one process with LocalTensorMode over the fake process
group, as upstream's `create_local_tensor_test_class` twins do.
"""

from __future__ import annotations

from tools.reproducers import Outcome, reproducer

WORLD_SIZE = 2
FILL_PATCH = (
    "[DTensor] fill_ keeps a Partial placement only when the fill value survives the reduction"
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
    bug="P(sum).fill_(1.5) reads back as world_size * 1.5",
    upstream="-",
    patch=FILL_PATCH,
)
def partial_sum_fill_multiplies_by_world_size() -> Outcome:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    dt, mode = two_rank_partial("sum", lambda r: torch.tensor([1.0 + r, 2.0]))
    comm = CommDebugMode()
    try:
        with mode, comm:
            dt.fill_(1.5)
    except RuntimeError as error:
        if "in-place operations that require placement changes" not in str(error):
            raise
        untouched = full_value(dt, mode) == [3.0, 4.0]
        return Outcome(untouched, "refused with a clear error; tensor left untouched")
    value = full_value(dt, mode)
    return Outcome(
        value == [1.5, 1.5],
        f"full_tensor {value} (truth [1.5, 1.5]), {dt.placements[0]}, "
        f"{comm.get_total_counts()} collectives",
    )


@reproducer(
    bug="zero_() / nn.init.zeros_ on Partial(product) raises",
    upstream="-",
    patch=FILL_PATCH,
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
    bug="P(sum).new_empty(shape).fill_(1.0) reads back as world_size",
    upstream="pytorch/pytorch#180486 (workaround #180511)",
    patch="[DTensor] new_empty of a Partial DTensor gives a Replicate buffer again",
)
def partial_new_empty_inherits_pending_sum() -> Outcome:
    import torch

    dt, mode = two_rank_partial("sum", lambda r: torch.tensor([1.0 + r, 2.0]))
    with mode:
        buffer = dt.new_empty((2,))
        buffer.fill_(1.0)
    value = full_value(buffer, mode)
    return Outcome(
        value == [1.0, 1.0], f"full_tensor {value} (truth [1.0, 1.0]), {buffer.placements[0]}"
    )


@reproducer(
    bug="Partial transposed grad of a Replicate param is all-reduced in AccumulateGrad "
    "(new_empty_strided without the DTensor workaround)",
    upstream="pytorch/pytorch#180486",
    patch="[autograd] clone_obey_contract: a single clone when the parameter has standard strides",
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
    "[DTensor] Keep a pending reduction through dtype casts and view(dtype) only when it commutes"
)


def cast_outcome(reduce_op: str, per_rank: dict, truth: list, cast) -> Outcome:
    """Cast a Partial DTensor and compare with the reduce-then-cast ground truth."""
    dt, mode = two_rank_partial(reduce_op, lambda r: per_rank[r])
    with mode:
        out = cast(dt)
    value = full_value(out, mode)
    return Outcome(value == truth, f"full_tensor {value} (truth {truth}), {out.placements[0]}")


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


@reproducer(bug="P(sum) float32 .view(int32) sums bit patterns", upstream="-", patch=CAST_PATCH)
def partial_sum_view_dtype() -> Outcome:
    import torch

    per_rank = {0: torch.tensor([1.0]), 1: torch.tensor([2.0])}
    truth = torch.tensor([3.0]).view(torch.int32).tolist()
    return cast_outcome("sum", per_rank, truth, lambda t: t.view(torch.int32))


@reproducer(
    bug="detach() of a Partial(product) DTensor all-reduces",
    upstream="-",
    patch='[DTensor] Views, aliases, clones and factories of a Partial("product") need no collective',
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
    patch="[DTensor] copy_ into a Partial destination: respect the cast, and do not divide integers",
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


@reproducer(
    bug="Adam.step() all-reduces one Partial(sum) gradient 3 times",
    upstream="-",
    patch="[optim] Adam reduces a Partial DTensor gradient once per step",
)
def adam_reduces_partial_grad_per_use() -> Outcome:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    weight, mode = replicate_param_with_partial_grad()
    comm = CommDebugMode()
    with mode, comm:
        torch.optim.Adam([weight], lr=0.1).step()
    count = comm.get_total_counts()
    return Outcome(count == 1, f"{count} all-reduce(s) per step (1 needed)")
