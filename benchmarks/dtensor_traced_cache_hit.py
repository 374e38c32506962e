"""Cost of one hit of the overlay's traced sharding cache (propagate_op_sharding_traced).

    torch-overlay run -- python benchmarks/dtensor_traced_cache_hit.py

Overlay only (stock has no such cache). Under a FakeTensorMode, 2x2 mesh, rank 0 of 4 on
the fake process group: Python calls per hit (cProfile over 1000 hits, builtins included)
and time per hit (min of 7 rounds of 1000) for `mul.Tensor(x, x)` and
`view(x, [16, 2, 4])` on the same schema object, and calls per hit for `mul.Tensor` over
fresh DTensorSpecs equal to the cached ones (as each layer's op of a trace gets).
"""

import cProfile
import pstats
import time

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema
from torch.testing._internal.distributed.fake_pg import FakeStore

N = 1000


def main() -> None:
    aten = torch.ops.aten
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    prop = DTensor._op_dispatcher.sharding_propagator

    def info(op):
        return prop.op_to_schema_info_for_single_dim_strategy.get(op) or prop.op_to_schema_info.get(
            op
        )

    def spec():
        meta = TensorMeta(torch.Size([16, 8]), (8, 1), torch.float32)
        return DTensorSpec(mesh, (Shard(0), Replicate()), meta)

    def mul(a, b):
        return OpSchema(aten.mul.Tensor, (a, b), {}, schema_info=info(aten.mul.Tensor))

    s0 = spec()
    view = OpSchema(aten.view.default, (s0, [16, 2, 4]), {}, schema_info=info(aten.view.default))
    with FakeTensorMode():
        for name, schema in (("mul.Tensor(x, x)", mul(s0, s0)), ("view(x, [16, 2, 4])", view)):
            prop.propagate_op_sharding_traced(schema)  # the miss that fills the entry
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(N):
                prop.propagate_op_sharding_traced(schema)
            profiler.disable()
            calls = pstats.Stats(profiler).total_calls / N
            best = float("inf")
            for _ in range(7):
                start = time.perf_counter()
                for _ in range(N):
                    prop.propagate_op_sharding_traced(schema)
                best = min(best, (time.perf_counter() - start) / N * 1e6)
            print(f"{name:22s} same schema: {calls:.0f} calls/hit, {best:.2f} us/hit")
        fresh = [mul(spec(), spec()) for _ in range(N)]
        profiler = cProfile.Profile()
        profiler.enable()
        for schema in fresh:
            prop.propagate_op_sharding_traced(schema)
        profiler.disable()
        calls = pstats.Stats(profiler).total_calls / N
        print(f"{'mul.Tensor(x, x)':22s} fresh equal specs: {calls:.0f} calls/hit")


if __name__ == "__main__":
    main()
