# Owner(s): ["oncall: distributed"]
"""An out= op keeps out's DTensorSpec object where it equals the output spec.

The sharding cache key of an out= op holds out's spec (its placements and dtype
decide the plan). After the op, out's spec is the output spec of the cached
plan; when that was a new object equal to out's old spec, every later call
compared the key's spec with ``DTensorSpec.__eq__`` (in Python) instead of by
identity. Sharding propagation now returns out's own spec object when the two
are equal, so out keeps it. Where they differ (another placement, dtype or
shape), out takes the output spec as before.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    init_device_mesh,
    Partial,
    Replicate,
    Shard,
)
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


WORLD_SIZE = 2


class OutVariantSpecIdentityTest(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
        )
        self.mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        _clear_sharding_prop_cache()

    def tearDown(self):
        _clear_sharding_prop_cache()
        dist.destroy_process_group()
        super().tearDown()

    def dtensor(self, local, placement):
        return DTensor.from_local(local, self.mesh, [placement], run_check=False)

    def test_out_keeps_an_equal_spec_object(self):
        x_local = torch.arange(32, dtype=torch.float32).reshape(4, 8)
        y_local = torch.ones(4, 8)
        cases = [
            ("sum.IntList_out", (4,), lambda x, y, o: torch.sum(x, 1, out=o)),
            ("cumsum.out", (4, 8), lambda x, y, o: torch.cumsum(x, 1, out=o)),
            ("add.out", (4, 8), lambda x, y, o: torch.add(x, y, out=o)),
        ]
        for placement in (Shard(0), Partial()):
            for name, out_shape, fn in cases:
                with self.subTest(f"{name} {placement}"):
                    _clear_sharding_prop_cache()
                    x = self.dtensor(x_local, placement)
                    y = self.dtensor(y_local, placement)
                    out = self.dtensor(torch.empty(out_shape), placement)
                    spec = out._spec
                    for _ in range(3):  # a miss, then cache hits
                        result = fn(x, y, out)
                        self.assertIs(result, out)
                        self.assertIs(out._spec, spec)
                        self.assertEqual(out.placements, (placement,))
                        self.assertEqual(
                            out.to_local(), fn(x_local, y_local, torch.empty(out_shape))
                        )

    def test_out_of_another_spec_takes_the_output_spec(self):
        # A Partial out and then a Replicate out of the same dtype: each gets
        # its own plan (out is in the key) and its own placement.
        x = self.dtensor(torch.ones(4, 8), Partial())
        partial_out = self.dtensor(torch.empty(4), Partial())
        torch.sum(x, 1, out=partial_out)
        self.assertEqual(partial_out.placements, (Partial(),))
        replicate_out = self.dtensor(torch.empty(4), Replicate())
        spec = replicate_out._spec
        torch.sum(x, 1, out=replicate_out)
        self.assertEqual(replicate_out.placements, (Replicate(),))
        self.assertIs(replicate_out._spec, spec)
        # An out of another shape is resized: its spec is the output spec.
        resized_out = self.dtensor(torch.empty(0), Replicate())
        old_spec = resized_out._spec
        torch.sum(self.dtensor(torch.ones(4, 8), Replicate()), 1, out=resized_out)
        self.assertIsNot(resized_out._spec, old_spec)
        self.assertEqual(resized_out._spec.tensor_meta.shape, torch.Size([4]))
        self.assertEqual(resized_out.to_local(), torch.full((4,), 8.0))

    def test_out_on_an_equal_mesh_of_another_group_takes_the_inputs_mesh(self):
        # DeviceMesh.__eq__ compares ranks, not process groups: an out on an
        # equal mesh of another group must not keep its mesh, or its next
        # collectives would run on that group (and the cached plan would hand
        # that mesh to later outs).
        side_mesh = DeviceMesh.from_group(dist.new_group([0, 1]), "cpu")
        self.assertEqual(side_mesh, self.mesh)
        x = self.dtensor(torch.ones(4, 8), Shard(0))
        y = self.dtensor(torch.ones(4, 8), Shard(0))
        side_out = DTensor.from_local(
            torch.empty(4, 8), side_mesh, [Shard(0)], run_check=False
        )
        torch.add(x, y, out=side_out)
        self.assertIs(side_out.device_mesh, self.mesh)
        out = self.dtensor(torch.empty(4, 8), Shard(0))
        torch.add(x, y, out=out)  # a cache hit
        self.assertIs(out.device_mesh, self.mesh)
        self.assertEqual(out.to_local(), torch.full((4, 8), 2.0))


if __name__ == "__main__":
    run_tests()
