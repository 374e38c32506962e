"""torch.compile with DTensor and nn.Module, compared with eager.

The 2-D mesh scenarios run in spawned children, each with its own fake process group of 4
ranks; the child inherits the overlay from verify. The others share verify's process
(and its 2-rank fake process group).
"""

from __future__ import annotations

from tools.reproducers import Outcome, in_spawned_child, reproducer


def _fsdp_tp_mesh():
    """A (fsdp, tp) = (2, 2) mesh on a 4-rank fake process group, in a spawned child."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"))


def _submesh_output(queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    mesh = _fsdp_tp_mesh()

    def f(w, x):
        return DTensor.from_local(w.to_local(), w.device_mesh["tp"], [Replicate()]) * x

    def inputs():
        torch.manual_seed(0)
        w = distribute_tensor(torch.randn(4, 4), mesh, [Replicate(), Replicate()])
        x = distribute_tensor(torch.randn(4, 4), mesh["tp"], [Replicate()])
        return w.requires_grad_(), x.requires_grad_()

    w, x = inputs()
    f(w, x).to_local().sum().backward()
    cw, cx = inputs()
    try:
        torch.compile(f, backend="aot_eager", fullgraph=True)(cw, cx).to_local().sum().backward()
        same = torch.equal(cw.grad.to_local(), w.grad.to_local()) and torch.equal(
            cx.grad.to_local(), x.grad.to_local()
        )
        queue.put((same, "compiled grads equal eager" if same else "grads differ from eager"))
    except Exception as error:  # the bug is a compile error
        message = [line for line in str(error).splitlines() if "Error" in line]
        queue.put((False, (message or [type(error).__name__])[0][:80]))
    dist.destroy_process_group()


def _submesh_inductor(queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    mesh = _fsdp_tp_mesh()

    def f(w):
        return DTensor.from_local(w.to_local(), w.device_mesh["tp"], [Replicate()])

    torch.manual_seed(0)
    w = distribute_tensor(torch.randn(4, 4), mesh, [Replicate(), Replicate()])
    try:
        out = torch.compile(f, backend="inductor", fullgraph=True)(w.requires_grad_())
        same = out.device_mesh == mesh["tp"] and torch.equal(out.to_local(), f(w).to_local())
        queue.put((same, "compiled equals eager" if same else "output differs from eager"))
    except Exception as error:  # the bug is a compile error
        message = [line for line in str(error).splitlines() if "Error" in line]
        queue.put((False, (message or [type(error).__name__])[0][:80]))
    dist.destroy_process_group()


@reproducer(
    bug="compile(from_local(w.to_local(), w.device_mesh['tp']), 'inductor'): _get_submesh node",
    upstream="pytorch/torchtitan#3013",
    patch="[DeviceMesh] Reconstruct a traced submesh through the _get_submesh OpOverload",
)
def compiled_submesh_not_an_op_overload() -> Outcome:
    ok, detail = in_spawned_child(_submesh_inductor)
    return Outcome(ok, detail)


@reproducer(
    bug="compile(from_local(w.to_local(), w.device_mesh['tp']) * x): forward output is tangents_2",
    upstream="pytorch/torchtitan#3013",
    patch="[DTensor] Keep traced ops out of the native sharding cache from Python",
)
def compiled_submesh_output_is_tangent() -> Outcome:
    ok, detail = in_spawned_child(_submesh_output)
    return Outcome(ok, detail)


def _mesh_after_compile(queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    mesh = _fsdp_tp_mesh()

    def f(w, x):
        return DTensor.from_local(w.to_local(), w.device_mesh["tp"], [Replicate()]) * x

    def inputs():
        w = distribute_tensor(torch.ones(4, 4), mesh, [Replicate(), Replicate()])
        return w, distribute_tensor(torch.ones(4, 4), mesh["tp"], [Replicate()])

    torch.compile(f, backend="eager", fullgraph=True)(*inputs())
    kind = type(f(*inputs()).device_mesh)
    queue.put((kind is DeviceMesh, f"eager output's device_mesh: {kind.__name__}"))
    dist.destroy_process_group()


@reproducer(
    bug="After a compile, eager from_local(..., mesh['tp']) * x carries the trace's mesh object",
    upstream="-",
    patch="[DTensor] Keep traced ops out of the native sharding cache from Python",
)
def eager_output_mesh_from_a_trace() -> Outcome:
    ok, detail = in_spawned_child(_mesh_after_compile)
    return Outcome(ok, detail)


@reproducer(
    bug="A compiled module keeps its parameter after module.__dict__['weight'] shadows it",
    upstream="pytorch/torchtitan#3122",
    patch="[dynamo] Guard that an attribute found through __getattr__ is not shadowed in __dict__",
)
def compiled_module_ignores_dict_shadow() -> Outcome:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Linear(4, 4, bias=False)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    compiled(x)
    module.__dict__["weight"] = torch.zeros(4, 4)
    same = torch.equal(compiled(x), module(x))
    return Outcome(same, "compiled equals eager" if same else "compiled still uses the parameter")


@reproducer(
    bug="compile(lambda w: w.to_local(), 'inductor')(param) returns param._local_tensor itself",
    upstream="pytorch/torchtitan#3122",
    patch="[aot_autograd] Return an output aliasing a subclass input's inner tensor as a view of it",
)
def compiled_to_local_mutates_parameter() -> Outcome:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, distribute_tensor, init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    param = torch.nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Replicate()]))
    out = torch.compile(lambda w: w.to_local(), backend="inductor", fullgraph=True)(param)
    inner = param._local_tensor
    # eager: a view of the local tensor (shared version counter), which keeps no grad_fn
    ok = out._base is inner and inner.grad_fn is None and not inner.requires_grad
    detail = (
        f"output is the local tensor: {out is inner}; a view of it: {out._base is inner}; "
        f"its grad_fn: {type(inner.grad_fn).__name__}"
    )
    return Outcome(ok, detail)
