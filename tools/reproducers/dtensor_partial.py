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
