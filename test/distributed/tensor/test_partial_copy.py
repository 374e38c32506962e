# Owner(s): ["oncall: distributed"]
"""copy_ into a Partial destination.

copy_ casts the source to the destination's dtype; a pending reduction may pass through
only where that cast commutes with it. For avg/min/max a reduced source is a valid Partial
value too; a Partial(sum) destination with a non-commuting cast is refused (untouched)
instead of truncating per rank.
"""

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)

REFUSAL = "in-place operations that require placement changes are not supported"


class DistPartialCopyTest(DTensorContinuousTestBase):
    world_size = 2

    def _dtensor(self, mesh, placement, per_rank, dtype):
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor(per_rank[r], dtype=dtype)
        )
        return DTensor.from_local(local, mesh, [placement], run_check=False)

    def _copy(self, dst, src):
        comm_mode = CommDebugMode()
        with comm_mode:
            dst.copy_(src)
        return comm_mode.get_total_counts()

    def test_sum_into_integer_partial_is_refused_not_truncated(self):
        mesh = self.build_device_mesh()
        dst = self._dtensor(mesh, Partial("sum"), [[7, 7], [0, 0]], torch.int32)
        src = self._dtensor(
            mesh, Partial("sum"), [[0.5, 1.5], [0.5, 1.5]], torch.float32
        )
        with self.assertRaisesRegex(RuntimeError, REFUSAL):
            dst.copy_(src)
        self.assertEqual(dst.full_tensor(), torch.tensor([7, 7], dtype=torch.int32))
        empty = torch.empty_like(
            self._dtensor(mesh, Partial("sum"), [[1.0], [1.0]], torch.float32),
            dtype=torch.int32,
        )
        with self.assertRaisesRegex(RuntimeError, REFUSAL):
            empty.copy_(
                self._dtensor(mesh, Partial("sum"), [[0.5], [0.5]], torch.float32)
            )

    def test_same_dtype_copy_keeps_product_and_bitwise_partials(self):
        mesh = self.build_device_mesh()
        for reduce_op, dtype, per_rank, truth in (
            ("product", torch.float32, [[3.0, 5.0], [4.0, 0.5]], [12.0, 2.5]),
            ("band", torch.int64, [[6, 5], [3, 4]], [2, 4]),
            ("bor", torch.int64, [[6, 5], [3, 4]], [7, 5]),
            ("bxor", torch.int64, [[6, 5], [3, 4]], [5, 1]),
        ):
            dst = self._dtensor(mesh, Partial(reduce_op), [[0, 0], [0, 0]], dtype)
            src = self._dtensor(mesh, Partial(reduce_op), per_rank, dtype)
            self.assertEqual(self._copy(dst, src), 0)
            self.assertEqual(dst.placements, (Partial(reduce_op),))
            self.assertEqual(dst.full_tensor(), torch.tensor(truth, dtype=dtype))

    def test_max_into_uint8_partial_reduces_the_source_first(self):
        mesh = self.build_device_mesh()
        dst = self._dtensor(mesh, Partial("max"), [[0, 0], [0, 0]], torch.uint8)
        src = self._dtensor(
            mesh, Partial("max"), [[-1.0, 7.0], [3.0, 2.0]], torch.float32
        )
        self.assertEqual(self._copy(dst, src), 1)
        self.assertEqual(dst.placements, (Partial("max"),))
        self.assertEqual(dst.full_tensor(), torch.tensor([3, 7], dtype=torch.uint8))

    def test_commuting_copies_keep_partial_without_collectives(self):
        mesh = self.build_device_mesh()
        dst = self._dtensor(
            mesh, Partial("sum"), [[0.0, 0.0], [0.0, 0.0]], torch.float32
        )
        src = self._dtensor(
            mesh, Partial("sum"), [[1.0, 2.0], [0.5, -1.0]], torch.bfloat16
        )
        self.assertEqual(self._copy(dst, src), 0)
        self.assertEqual(dst.full_tensor(), torch.tensor([1.5, 1.0]))
        dst = self._dtensor(mesh, Partial("avg"), [[0.0], [0.0]], torch.float32)
        src = self._dtensor(mesh, Replicate(), [[4], [4]], torch.int32)
        self.assertEqual(self._copy(dst, src), 0)
        self.assertEqual(dst.full_tensor(), torch.tensor([4.0]))

    def test_replicate_int_destination_from_a_max_partial_reduces_once(self):
        # new_zeros of a Partial gives Replicate (an initialized factory).
        mesh = self.build_device_mesh()
        base = self._dtensor(mesh, Partial("sum"), [[1.0], [1.0]], torch.float32)
        dst = base.new_zeros((1,), dtype=torch.int32)
        src = self._dtensor(mesh, Partial("max"), [[-1.0], [3.5]], torch.float32)
        self.assertEqual(self._copy(dst, src), 1)
        self.assertEqual(dst.placements, (Replicate(),))
        self.assertEqual(dst.full_tensor(), torch.tensor([3], dtype=torch.int32))

    def test_integer_avg_destination_from_another_placement_is_refused(self):
        # c10d averages by summing the world size's copies in dst's dtype: a
        # reduced source written on every rank wraps there (int8 100 on 2 ranks
        # read -28), so only a Partial("avg") source of the same dtype passes.
        mesh = self.build_device_mesh()
        for dtype, dst_rows, src_rows in (
            (torch.int8, [[1, 1], [3, 3]], [[100, 1], [0, 1]]),
            (torch.uint8, [[1, 1], [3, 3]], [[161, 1], [0, 1]]),
            (
                torch.bool,
                [[True, False], [True, False]],
                [[True, False], [False, True]],
            ),
        ):
            for placement, src_dtype in (
                (Partial("max"), dtype),
                (Partial("min"), dtype),
                (Partial("sum"), dtype),
                (Partial("max"), torch.int32),
                (Partial("avg"), torch.int32),
                (Partial("max"), torch.float32),
            ):
                with self.subTest(dtype=dtype, src=(placement, src_dtype)):
                    dst = self._dtensor(mesh, Partial("avg"), dst_rows, dtype)
                    before = dst.to_local().clone()
                    src = self._dtensor(mesh, placement, src_rows, src_dtype)
                    # A same-dtype source meets the redistribution's own refusal.
                    with self.assertRaisesRegex(
                        (RuntimeError, AssertionError),
                        f"{REFUSAL}|to another \\(P\\(avg\\)\\) is unsupported",
                    ):
                        dst.copy_(src)
                    self.assertEqual(dst.placements, (Partial("avg"),))
                    self.assertEqual(dst.to_local(), before)
            with self.subTest(dtype=dtype, src="Shard(0)"):
                dst = self._dtensor(mesh, Partial("avg"), dst_rows, dtype)
                before = dst.to_local().clone()
                local = map_local_for_rank(
                    self.rank,
                    lambda r: torch.tensor(src_rows[0], dtype=dtype)[r : r + 1],
                )
                src = DTensor.from_local(
                    local, mesh, [Shard(0)], run_check=False, shape=(2,), stride=(1,)
                )
                with self.assertRaises(RuntimeError):
                    dst.copy_(src)
                self.assertEqual(dst.to_local(), before)
        # A Partial("avg") source of the same dtype is a local copy, as before.
        dst = self._dtensor(mesh, Partial("avg"), [[0, 0], [0, 0]], torch.int8)
        src = self._dtensor(mesh, Partial("avg"), [[4, 1], [2, 3]], torch.int8)
        self.assertEqual(self._copy(dst, src), 0)
        self.assertEqual(dst.placements, (Partial("avg"),))
        self.assertEqual(dst.to_local(), src.to_local())
        # A float32 Partial("avg") destination still takes the reduced source.
        dst = self._dtensor(
            mesh, Partial("avg"), [[0.0, 0.0], [0.0, 0.0]], torch.float32
        )
        src = self._dtensor(
            mesh, Partial("max"), [[100.0, 1.0], [0.0, 1.0]], torch.float16
        )
        self.assertEqual(self._copy(dst, src), 1)
        self.assertEqual(dst.placements, (Partial("avg"),))
        self.assertEqual(dst.full_tensor(), torch.tensor([100.0, 1.0]))

    def test_half_avg_destination_from_a_reduced_source_is_refused(self):
        # c10d averages a float16/bfloat16 Partial("avg") by summing the world
        # size's copies in that dtype: a reduced source written on every rank
        # overflows above finfo.max / world size (float16 40000 on 2 ranks read
        # inf), so such a destination takes no reduced source.
        mesh = self.build_device_mesh()
        for dtype, big in ((torch.float16, 40000.0), (torch.bfloat16, 3.0e38)):
            for placement, src_dtype, src_rows in (
                (Partial("sum"), dtype, [[big / 2, 1.0], [big / 2, 1.0]]),
                (Partial("max"), dtype, [[big, 1.0], [1.0, 1.0]]),
                (Partial("min"), dtype, [[big, 1.0], [big, 2.0]]),
                (Partial("max"), torch.float32, [[big, 1.0], [1.0, 1.0]]),
                (Partial("avg"), torch.float32, [[big, 1.0], [big, 1.0]]),
                (Replicate(), torch.float32, [[big, 1.0], [big, 1.0]]),
            ):
                with self.subTest(dtype=dtype, src=(placement, src_dtype)):
                    dst = self._dtensor(
                        mesh, Partial("avg"), [[1.0, 1.0], [3.0, 3.0]], dtype
                    )
                    before = dst.to_local().clone()
                    src = self._dtensor(mesh, placement, src_rows, src_dtype)
                    with self.assertRaisesRegex(
                        (RuntimeError, AssertionError),
                        f"{REFUSAL}|to another \\(P\\(avg\\)\\) is unsupported",
                    ):
                        dst.copy_(src)
                    self.assertEqual(dst.placements, (Partial("avg"),))
                    self.assertEqual(dst.to_local(), before)
            # The same refusal through _to_copy.out, which decomposes into a
            # cast and copy_.
            with self.subTest(dtype=dtype, src="_to_copy.out"):
                out = self._dtensor(
                    mesh, Partial("avg"), [[1.0, 1.0], [3.0, 3.0]], dtype
                )
                before = out.to_local().clone()
                src = self._dtensor(
                    mesh, Partial("avg"), [[big, 1.0], [big, 1.0]], torch.float32
                )
                with self.assertRaises((RuntimeError, AssertionError)):
                    torch.ops.aten._to_copy.out(src, out=out)
                self.assertEqual(out.placements, (Partial("avg"),))
                self.assertEqual(out.to_local(), before)
        # A same-dtype Partial("avg") source is a local copy, as before.
        dst = self._dtensor(
            mesh, Partial("avg"), [[0.0, 0.0], [0.0, 0.0]], torch.float16
        )
        src = self._dtensor(
            mesh, Partial("avg"), [[4.0, 1.0], [2.0, 3.0]], torch.float16
        )
        self.assertEqual(self._copy(dst, src), 0)
        self.assertEqual(dst.placements, (Partial("avg"),))
        self.assertEqual(dst.to_local(), src.to_local())

    def test_float32_avg_destination_takes_a_reduced_source(self):
        # A float32/float64 Partial("avg") destination takes a reduced source
        # of any floating or integer dtype, written on every rank (float64
        # [1.5, -2] into float32, as without the copy_ rule). Whether an
        # average of equal copies near finfo.max overflows is the backend's
        # (c10d's sum-then-divide on gloo, a pre-multiplied sum on NCCL), the
        # same for a same-dtype source: not decided by this rule.
        mesh = self.build_device_mesh()
        for dst_dtype, src_dtype, value in (
            (torch.float32, torch.float64, 1.5),
            (torch.float32, torch.float32, 1.5),
            (torch.float32, torch.bfloat16, 1.5),
            (torch.float32, torch.float16, 60000.0),
            (torch.float32, torch.int64, 2.0**62),
            (torch.float64, torch.float32, 2.0e38),
            (torch.float64, torch.float64, 1.5),
        ):
            for placement in (Replicate(), Partial("max"), Shard(0)):
                with self.subTest(dst=dst_dtype, src=(placement, src_dtype)):
                    if placement == Shard(0):
                        src_rows = [[value], [-2.0]]
                    elif placement == Replicate():
                        src_rows = [[value, -2.0], [value, -2.0]]
                    else:
                        src_rows = [[value, -2.0], [1.0, -2.0]]
                    dst = self._dtensor(
                        mesh, Partial("avg"), [[0.0, 0.0], [0.0, 0.0]], dst_dtype
                    )
                    src = self._dtensor(mesh, placement, src_rows, src_dtype)
                    plain = src.full_tensor().to(dst_dtype)
                    self.assertEqual(
                        self._copy(dst, src), 0 if placement == Replicate() else 1
                    )
                    self.assertEqual(dst.placements, (Partial("avg"),))
                    self.assertEqual(dst.full_tensor(), plain, atol=0, rtol=0)


DistPartialCopyTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialCopyTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
