# Owner(s): ["oncall: distributed"]
"""Reducing an integer Partial("avg") DTensor gives the average of the ranks' values.

c10d averages by summing the ranks' values in the tensor's dtype and dividing: an int8
Partial("avg") holding 100 on each of 2 ranks read -28 (200 wraps to -56), and so did an
op that keeps Partial("avg") and writes a value (constant_pad_nd, index_fill, fill_ with
100). Integer averages are now summed in int64 (int64 itself as a quotient and a
remainder), divided with truncation toward zero and cast back: one collective, as before.
"""

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)


def _trunc_mean(values):
    total = sum(values)
    mean = abs(total) // len(values)
    return mean if total >= 0 else -mean


class PartialIntegerAvgTest(DTensorContinuousTestBase):
    world_size = 2

    def _avg(self, mesh, per_rank, dtype):
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor(per_rank[r], dtype=dtype)
        )
        return DTensor.from_local(local, mesh, [Partial("avg")], run_check=False)

    def _columns(self, dtype):
        info = torch.iinfo(dtype)
        cols = [
            [100, 100],
            [3, 4],
            [info.max, info.max],
            [info.max, info.max - 1],
            [info.min, info.min],
            [info.min, info.max],
            [0, 0],
        ]
        if info.min < 0:
            cols += [[-100, -100], [-3, -4], [-3, 4], [info.min, -1]]
        return cols

    def test_reduce_to_replicate_and_shard(self):
        mesh = self.build_device_mesh()
        for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
            cols = self._columns(dtype)
            truth = torch.tensor([_trunc_mean(c) for c in cols], dtype=dtype)
            per_rank = [[c[r] for c in cols] for r in range(self.world_size)]
            for target in (Replicate(), Shard(0)):
                with self.subTest(dtype=dtype, target=target):
                    x = self._avg(mesh, per_rank, dtype)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        y = x.redistribute(mesh, [target])
                    self.assertEqual(comm_mode.get_total_counts(), 1)
                    self.assertEqual(y.placements, (target,))
                    self.assertEqual(y.dtype, dtype)
                    self.assertEqual(y.to_local().dtype, dtype)
                    # The local values, not full_tensor(): gloo gathers no int16.
                    expected = (
                        truth
                        if target == Replicate()
                        else map_local_for_rank(
                            self.rank,
                            lambda r, t=truth: t.chunk(self.world_size)[r],
                        )
                    )
                    self.assertEqual(y.to_local(), expected, atol=0, rtol=0)

    def test_ops_writing_a_value_into_an_integer_avg_partial(self):
        # Each rank writes the value; the average of equal values is that value.
        # masked_fill reduces its input first (one collective, Replicate).
        mesh = self.build_device_mesh()
        per_rank = [[10, -20, 30], [30, 40, -50]]
        mask_local = torch.tensor([False, True, False])
        cases = {
            "constant_pad_nd": lambda x, m: torch.constant_pad_nd(x, (1, 1), 100),
            "pad": lambda x, m: F.pad(x, (1, 1), value=100),
            "index_fill": lambda x, m: x.index_fill(0, torch.tensor([1]), 100),
            "fill_": lambda x, m: x.clone().fill_(100),
            "masked_fill": lambda x, m: x.masked_fill(m, 100),
        }
        for dtype in (torch.int8, torch.uint8, torch.int32):
            for name, fn in cases.items():
                with self.subTest(dtype=dtype, op=name):
                    x = self._avg(mesh, per_rank, dtype)
                    mask = DTensor.from_local(
                        mask_local, mesh, [Replicate()], run_check=False
                    )
                    plain = fn(x.full_tensor(), mask_local)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        out = fn(x, mask)
                    reduced_first = name == "masked_fill"
                    self.assertEqual(comm_mode.get_total_counts(), int(reduced_first))
                    self.assertEqual(
                        out.placements,
                        (Replicate() if reduced_first else Partial("avg"),),
                    )
                    with comm_mode:
                        full = out.full_tensor()
                    self.assertEqual(
                        comm_mode.get_total_counts(), int(not reduced_first)
                    )
                    self.assertEqual(full, plain, atol=0, rtol=0)

    def test_float_avg_is_unchanged(self):
        mesh = self.build_device_mesh()
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor([[1.5, 100.0], [3.0, -4.0]][r])
        )
        x = DTensor.from_local(local, mesh, [Partial("avg")], run_check=False)
        comm_mode = CommDebugMode()
        with comm_mode:
            y = x.redistribute(mesh, [Replicate()])
        self.assertEqual(comm_mode.get_total_counts(), 1)
        self.assertEqual(y.to_local(), torch.tensor([2.25, 48.0]))


PartialIntegerAvgTestWithLocalTensor = create_local_tensor_test_class(
    PartialIntegerAvgTest,
    base_class=LocalDTensorContinuousTestBase,
)


if __name__ == "__main__":
    run_tests()
