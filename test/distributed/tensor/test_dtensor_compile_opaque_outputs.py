# Owner(s): ["oncall: distributed"]
"""A compiled function returning a DTensor on a submesh partitions and matches eager, and
leaves eager DTensor code with real DeviceMesh objects.

torchtitan#3013: on a 2-D (fsdp, tp) mesh, ``DTensor.from_local(w.to_local(),
w.device_mesh["tp"], [Replicate()]) * x`` fails in the partitioner with "Node tangents_2
was invalid, but is output": the output's DeviceMesh is not any primal's mesh object
(DTensor's sharding cache hands back the one it saw first), but it is the object the
tangent was built from, so make_fx binds the forward output to the tangent placeholder.
After such a compile, the same expression in eager returned a DTensor whose device_mesh
is a trace's FakeScriptObject, from the same cache. The fake process group is enough: the
failures are at compile time or in the output's metadata.
"""

import torch
import torch.distributed as dist
from functorch.compile import nop
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Partial,
    Replicate,
    Shard,
)
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
from torch.distributed.tensor.debug import (
    _clear_fast_path_sharding_prop_cache,
    _clear_sharding_prop_cache,
    CommDebugMode,
)
from torch.nn.utils import parametrize as P
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


def replicated(mesh, seed):
    torch.manual_seed(seed)
    local = torch.randn(4, 4, dtype=torch.float64)
    return distribute_tensor(local, mesh, [Replicate()] * mesh.ndim).requires_grad_()


def output_on_tp_of_w(w, x):
    return DTensor.from_local(w.to_local(), w.device_mesh["tp"], [Replicate()]) * x


def both_sliced_inside(w, x):
    """The graph_trainer shape: every input on the 2-D mesh, the submesh made inside."""
    tp = w.device_mesh["tp"]
    return DTensor.from_local(w.to_local(), tp, [Replicate()]) * DTensor.from_local(
        x.to_local(), x.device_mesh["tp"], [Replicate()]
    )


class ReplicateComputation(torch.nn.Module):
    """torchtitan graph_trainer's SimpleFSDP parametrization: gather the parameter over
    fsdp, reduce its gradient as Partial("avg"), compute on the tp submesh sliced in
    forward."""

    def forward(self, param):
        mesh = param.device_mesh
        gathered = DTensor.from_local(param.to_local(), mesh["fsdp"], [Replicate()])
        gathered = gathered.redistribute(placements=[Replicate()])
        local = gathered.to_local(grad_placements=[Partial("avg")])
        return DTensor.from_local(local, mesh["tp"], param.placements[-1:])


class DTensorCompileOpaqueOutputTest(TestCase):
    def setUp(self):
        super().setUp()
        # Each test starts from empty sharding caches, as in a fresh process.
        _clear_sharding_prop_cache()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def check_matches_eager(self, fn, x_on_tp, backend):
        def inputs():
            # Fresh DTensors for each run: a clone would pick up the cached mesh object.
            x_mesh = self.mesh["tp"] if x_on_tp else self.mesh
            return replicated(self.mesh, 0), replicated(x_mesh, 1)

        eager_args, compiled_args = inputs(), inputs()
        eager = fn(*eager_args)
        eager.to_local().sum().backward()
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend, fullgraph=True)(*compiled_args)
        compiled.to_local().sum().backward()

        self.assertEqual(compiled.device_mesh, eager.device_mesh)
        self.assertEqual(compiled.placements, eager.placements)
        self.assertEqual(compiled.to_local(), eager.to_local(), atol=0, rtol=0)
        for ours, ref in zip(compiled_args, eager_args, strict=True):
            self.assertEqual(ours.grad.placements, ref.grad.placements)
            self.assertEqual(ours.grad.to_local(), ref.grad.to_local(), atol=0, rtol=0)

    def test_aot_eager(self):
        self.check_matches_eager(output_on_tp_of_w, True, "aot_eager")

    def test_aot_eager_submesh_made_inside(self):
        self.check_matches_eager(both_sliced_inside, False, "aot_eager")

    def test_default_partitioner(self):
        backend = aot_autograd(
            fw_compiler=nop, bw_compiler=nop, partition_fn=default_partition
        )
        self.check_matches_eager(output_on_tp_of_w, True, backend)
        self.check_matches_eager(both_sliced_inside, False, backend)

    def test_inductor(self):
        self.check_matches_eager(output_on_tp_of_w, True, "inductor")

    def simple_fsdp_model(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 8, bias=False),
            torch.nn.ReLU(),
            torch.nn.Linear(8, 8, bias=False),
        ).double()
        for linear in (model[0], model[2]):
            weight = distribute_tensor(
                linear.weight.detach(), self.mesh, [Replicate()] * 2
            )
            linear.weight = torch.nn.Parameter(weight)
            P.register_parametrization(
                linear, "weight", ReplicateComputation(), unsafe=True
            )
        return model

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_simple_fsdp_parametrization(self, backend):
        def step(model):
            torch.manual_seed(1)
            x = torch.randn(4, 8, dtype=torch.float64)
            out = model(distribute_tensor(x, self.mesh["tp"], [Replicate()]))
            out.to_local().sum().backward()
            return out

        reference, model = self.simple_fsdp_model(), self.simple_fsdp_model()
        expected = step(reference)
        torch._dynamo.reset()
        out = step(torch.compile(model, backend=backend, fullgraph=True))

        self.assertIs(type(out.device_mesh), DeviceMesh)
        self.assertEqual(out.device_mesh, expected.device_mesh)
        self.assertEqual(out.placements, expected.placements)
        self.assertEqual(out.to_local(), expected.to_local(), atol=0, rtol=0)
        params = zip(model.parameters(), reference.parameters(), strict=True)
        for ours, ref in params:
            self.assertEqual(ours.grad.placements, ref.grad.placements)
            self.assertEqual(ours.grad.to_local(), ref.grad.to_local(), atol=0, rtol=0)

    def test_eager_after_compile_gets_a_device_mesh(self):
        def inputs():
            w = replicated(self.mesh, 0)
            return w, replicated(self.mesh["tp"], 1)

        torch.compile(output_on_tp_of_w, backend="eager", fullgraph=True)(*inputs())
        out = output_on_tp_of_w(*inputs())
        self.assertIs(type(out.device_mesh), DeviceMesh)
        self.assertEqual(out.device_mesh, self.mesh["tp"])


instantiate_parametrized_tests(DTensorCompileOpaqueOutputTest)


def replicate_only(op_schema):
    spec = op_schema.args_schema[0].strategies[0].output_spec
    replicate = DTensorSpec(spec.mesh, (Replicate(),), spec.tensor_meta)
    return OpStrategy(
        [
            OpSpec(
                output_specs=replicate,
                input_specs=(replicate,),
                redistribute_cost=[[0.0]],
            )
        ]
    )


class DTensorFastPathClearTest(TestCase):
    """Eager cache misses are answered from the Python sharding cache, which backs the
    native one that traces empty: `_clear_fast_path_sharding_prop_cache()` must clear it
    too, or an eager op keeps a sharding computed before its strategy was replaced."""

    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        self.addCleanup(dist.destroy_process_group)
        self.mesh = init_device_mesh("cpu", (2,))
        _clear_sharding_prop_cache()
        self.addCleanup(_clear_sharding_prop_cache)
        self.addCleanup(torch._dynamo.reset)
        self.full = torch.arange(16, dtype=torch.float32).view(4, 4) - 8

    def eager_relu(self):
        with LocalTensorMode(frozenset(range(2))):
            x = distribute_tensor(self.full, self.mesh, [Shard(0)])
            with CommDebugMode() as comm:
                out = x.relu()
            self.assertEqual(out.full_tensor(), self.full.relu(), atol=0, rtol=0)
        return out.placements, comm.get_total_counts()

    def replace_relu_strategy(self):
        propagator = DTensor._op_dispatcher.sharding_propagator
        relu = torch.ops.aten.relu.default
        registries = (
            propagator.op_single_dim_strategy_funcs,
            propagator.op_strategy_funcs,
        )
        saved = [(registry, registry.pop(relu, None)) for registry in registries]

        def restore():
            for registry, entry in saved:
                registry.pop(relu, None)
                if entry is not None:
                    registry[relu] = entry

        self.addCleanup(restore)
        propagator.register_op_strategy(relu, replicate_only)

    def test_fast_path_clear_after_strategy_change(self):
        self.assertEqual(self.eager_relu(), ((Shard(0),), 0))
        self.replace_relu_strategy()
        # Without a clear, eager keeps the cached sharding (as torch 2.15.0 does),
        # while a trace computes its own: eager and compiled disagree until a clear.
        self.assertEqual(self.eager_relu(), ((Shard(0),), 0))
        torch._dynamo.reset()
        local = self.full.chunk(2)[0].clone()
        x = DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False)
        compiled = torch.compile(lambda t: t.relu(), backend="aot_eager")(x)
        self.assertEqual(compiled.placements, (Replicate(),))
        self.assertEqual(self.eager_relu(), ((Shard(0),), 0))
        # The fast-path clear is enough for eager to see the new strategy.
        _clear_fast_path_sharding_prop_cache()
        self.assertEqual(self.eager_relu(), ((Replicate(),), 1))


LIST_VIEWS = {
    "split": lambda x: x.split(2, dim=1),
    "chunk": lambda x: x.chunk(2, dim=1),
    "unbind": lambda x: x.unbind(1),
    "split_with_sizes": lambda x: torch.split(x, [1, 3], dim=1),
    "split_of_intermediate": lambda x: (x * 2).split(2, dim=1),
}


class DTensorCompileListViewTest(TestCase):
    """Views returned in a list (split, chunk, unbind) of a DTensor compile as in eager:
    tracing such an op with the native sharding cache left out must alias the list's
    elements as dispatchDTensorOp does, not as return_and_correct_aliasing does."""

    def setUp(self):
        super().setUp()
        _clear_sharding_prop_cache()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (4,))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def sharded(self):
        local = torch.arange(32, dtype=torch.float64).view(8, 4)
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False)

    @parametrize("backend", ["aot_eager", "inductor"])
    @parametrize("name", list(LIST_VIEWS))
    def test_list_of_views(self, backend, name):
        fn = LIST_VIEWS[name]
        x, ref = self.sharded().requires_grad_(), self.sharded().requires_grad_()
        out, expected = torch.compile(fn, backend=backend, fullgraph=True)(x), fn(ref)
        self.assertEqual(len(out), len(expected))
        for ours, theirs in zip(out, expected, strict=True):
            self.assertEqual(ours.placements, theirs.placements)
            self.assertEqual(ours.to_local(), theirs.to_local(), atol=0, rtol=0)
        sum(o.to_local().sum() * (i + 1) for i, o in enumerate(out)).backward()
        sum(o.to_local().sum() * (i + 1) for i, o in enumerate(expected)).backward()
        self.assertEqual(x.grad.to_local(), ref.grad.to_local(), atol=0, rtol=0)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_mutation_through_a_listed_view(self, backend):
        def fn(x):
            a, b = x.split(2, dim=1)
            a.mul_(2)
            return b + 1

        x, ref = self.sharded(), self.sharded()
        out, expected = torch.compile(fn, backend=backend, fullgraph=True)(x), fn(ref)
        self.assertEqual(out.to_local(), expected.to_local(), atol=0, rtol=0)
        self.assertEqual(x.to_local(), ref.to_local(), atol=0, rtol=0)


instantiate_parametrized_tests(DTensorCompileListViewTest)


if __name__ == "__main__":
    run_tests()
