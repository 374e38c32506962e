# Owner(s): ["oncall: distributed"]
"""LocalTensor: aten.chunk whose ranks return different numbers of chunks.

torch.chunk decomposes into aten.split.Tensor while autograd dispatch runs,
and LocalTensor pads the shorter per-rank lists of split.Tensor with empty
chunks. With autograd dispatch excluded (inference mode, and below the
autograd kernel of an op, where DTensor redistributes the op's inputs)
aten.chunk.default reaches LocalTensor undecomposed and was not padded:
LocalTensor({...: None}) raised AttributeError ('NoneType' object has no
attribute 'requires_grad'), e.g. in the padded reduce-scatter of an uneven
nested shard.
"""

import itertools

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Partial,
    Replicate,
    Shard,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


class LocalTensorUnevenChunkTest(TestCase):
    def test_chunk_pads_the_ranks_with_fewer_chunks(self):
        # The second set differs in the other dim too: each rank's padding
        # takes its own tensor's shape (5x0 and 4x0), not the first rank's.
        local_sets = {
            "same_rows": {
                0: torch.arange(10.0).reshape(5, 2),
                1: torch.arange(5.0).reshape(5, 1),
            },
            "other_rows": {
                0: torch.arange(10.0).reshape(5, 2),
                1: torch.arange(4.0).reshape(4, 1),
            },
        }
        contexts = {
            "inference_mode": torch.inference_mode,
            "below_autograd": torch._C._AutoDispatchBelowAutograd,
            "enable_grad": torch.enable_grad,
        }
        for (set_name, locals_), (name, ctx) in itertools.product(
            local_sets.items(), contexts.items()
        ):
            with self.subTest(locals=set_name, context=name):
                with LocalTensorMode(frozenset(locals_)), ctx():
                    chunks = torch.chunk(LocalTensor(locals_), 2, dim=1)
                self.assertEqual(len(chunks), 2)
                for r, t in locals_.items():
                    expected = list(torch.chunk(t, 2, dim=1))
                    expected += [t.narrow(1, 0, 0)] * (2 - len(expected))
                    for chunk, e in zip(chunks, expected):
                        self.assertEqual(chunk._local_tensors[r], e)

    def test_reduce_scatter_of_an_uneven_nested_shard_below_autograd(self):
        # [Shard(1), Partial("sum")] -> [Shard(1), Shard(1)] of 3 columns on a
        # 2x2 mesh: mesh dim 0 leaves 2 and 1 columns, and the padded
        # reduce-scatter on mesh dim 1 chunks them into 2 and 1 pieces. Below
        # the autograd kernel, as an op's input redistribution runs.
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            mesh = init_device_mesh("cpu", (2, 2))
            full = torch.arange(15.0).reshape(5, 3)
            for dtype in (torch.float32, torch.int32):
                with self.subTest(dtype=dtype):
                    with LocalTensorMode(frozenset(range(4))):
                        d = distribute_tensor(
                            full.to(dtype), mesh, [Shard(1), Partial("sum")]
                        )
                        comm_mode = CommDebugMode()
                        with torch._C._AutoDispatchBelowAutograd(), comm_mode:
                            r = d.redistribute(mesh, [Shard(1), Shard(1)])
                        self.assertEqual(r.placements, (Shard(1), Shard(1)))
                        got = r.full_tensor()._local_tensors[0]
                    self.assertEqual(got, full.to(dtype), atol=0, rtol=0)
                    self.assertEqual(comm_mode.get_total_counts(), 1)
        finally:
            dist.destroy_process_group()

    def test_op_whose_input_takes_that_reduce_scatter(self):
        # torch.add(i32 [Shard(1), Partial("sum")], f32 R, alpha=inf,
        # out=f32 [Partial("sum"), Shard(1)]) on a 2x2 mesh, 5x3: where the
        # integer operand's pending sum is reduced in its own dtype before its
        # conversion, that reduction is the reduce-scatter above, run inside
        # the op's dispatch
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            mesh = init_device_mesh("cpu", (2, 2))
            base = torch.arange(15, dtype=torch.int32).reshape(5, 3) - 7
            # pieces base and base + 1 on mesh dim 1, sharded on mesh dim 0
            full = 2 * base + 1
            with LocalTensorMode(frozenset(range(4))):
                pieces = {r: (base + r % 2).chunk(2, dim=1)[r // 2] for r in range(4)}
                c = DTensor.from_local(
                    LocalTensor(pieces),
                    mesh,
                    [Shard(1), Partial("sum")],
                    run_check=False,
                    shape=full.shape,
                    stride=full.stride(),
                )
                x = distribute_tensor(torch.ones(5, 3), mesh, [Replicate()] * 2)
                out = distribute_tensor(
                    torch.zeros(5, 3), mesh, [Partial("sum"), Shard(1)]
                )
                torch.add(c, x, alpha=float("inf"), out=out)
                self.assertEqual(out.placements, (Partial("sum"), Shard(1)))
                got = out.full_tensor()._local_tensors[0]
            truth = torch.add(full, torch.ones(5, 3), alpha=float("inf"))
            self.assertEqual(got, truth, equal_nan=True)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
