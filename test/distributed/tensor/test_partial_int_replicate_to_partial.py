# Owner(s): ["oncall: distributed"]
"""Replicate -> Partial(sum) for integer and bool DTensors.

v / n has no integer (or bool) representation, so the first rank of the mesh dim keeps the
value and the others hold zeros (which sums to v) instead of a float division. In eager mode
the rank is chosen by a Python branch on this rank's coordinate (a copy on the first rank, one
zeros_like elsewhere); while tracing, and under LocalTensor's per-rank coordinates, it is
tensor arithmetic on the mesh coordinate, so it traces under compile_on_one_rank.
"""

import itertools
import math
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import (
    DTensor,
    distribute_tensor,
    Partial,
    Replicate,
    Shard,
)
from torch.distributed.tensor import _dispatch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._redistribute import redistribute_local_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)
from torch.testing._internal.distributed.fake_pg import FakeStore

INT_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


class DistPartialIntReplicateToPartialTest(DTensorContinuousTestBase):
    world_size = 2

    def _dtensor(self, mesh, placement, per_rank, dtype):
        local = map_local_for_rank(
            self.rank, lambda r: torch.tensor(per_rank[r], dtype=dtype)
        )
        return DTensor.from_local(local, mesh, [placement], run_check=False)

    def _to_partial_sum(self, rep):
        # DTensor.redistribute refuses R -> P; this is the transform ops plan for it.
        spec = rep._spec
        target = DTensorSpec(spec.mesh, (Partial("sum"),), tensor_meta=spec.tensor_meta)
        local = redistribute_local_tensor(rep.to_local(), spec, target)
        return DTensor(local, target, requires_grad=False)

    def test_redistribute_keeps_value_on_first_rank(self):
        mesh = self.build_device_mesh()
        values = [3, 5, 0, 9]
        for dtype in INT_DTYPES:
            rep = self._dtensor(mesh, Replicate(), [values, values], dtype)
            comm_mode = CommDebugMode()
            with comm_mode:
                part = self._to_partial_sum(rep)
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(part.dtype, dtype)
            self.assertEqual(part.to_local().dtype, dtype)
            expected = map_local_for_rank(
                self.rank,
                lambda r, dtype=dtype: torch.tensor(
                    values if r == 0 else [0] * 4, dtype=dtype
                ),
            )
            self.assertEqual(part.to_local(), expected)
            self.assertEqual(part.full_tensor(), torch.tensor(values, dtype=dtype))

    def test_replicate_into_integer_sum_partial_is_not_divided(self):
        mesh = self.build_device_mesh()
        for dtype in (torch.int64, torch.int32, torch.bool):
            dst = self._dtensor(
                mesh, Partial("sum"), [[0, 0, 0, 0], [0, 0, 0, 0]], dtype
            )
            values = [3, 5, 0, 9]
            src = self._dtensor(mesh, Replicate(), [values, values], dtype)
            comm_mode = CommDebugMode()
            with comm_mode:
                dst.copy_(src)
            self.assertEqual(comm_mode.get_total_counts(), 0)
            self.assertEqual(dst.full_tensor(), torch.tensor(values, dtype=dtype))

    def test_integer_partial_plus_replicate(self):
        mesh = self.build_device_mesh()
        p = self._dtensor(mesh, Partial("sum"), [[1, 2, 3], [4, 5, 6]], torch.int64)
        r = self._dtensor(mesh, Replicate(), [[10, 20, 33], [10, 20, 33]], torch.int64)
        out = p + r  # r goes Replicate -> Partial(sum), no collective
        self.assertEqual(out.placements, (Partial("sum"),))
        self.assertEqual(out.dtype, torch.int64)
        self.assertEqual(out.full_tensor(), torch.tensor([15, 27, 42]))

    def test_large_int64_is_kept_exactly_on_every_rank(self):
        # 2**53 + 1 and -(2**62) - 3 have no float64 representation: a division (or
        # any float round trip) would change them. No collective either.
        mesh = self.build_device_mesh()
        big = [2**53 + 1, -(2**62) - 3, 7]
        rep = self._dtensor(mesh, Replicate(), [big, big], torch.int64)
        comm_mode = CommDebugMode()
        with comm_mode:
            part = self._to_partial_sum(rep)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(part.placements, (Partial("sum"),))
        expected = map_local_for_rank(
            self.rank,
            lambda r: torch.tensor(big if r == 0 else [0, 0, 0], dtype=torch.int64),
        )
        self.assertEqual(part.to_local(), expected, atol=0, rtol=0)
        self.assertEqual(part.full_tensor(), torch.tensor(big), atol=0, rtol=0)

    def test_in_place_op_on_the_partial_leaves_the_source_alone(self):
        # Partial(sum) takes in-place ops: the first rank's local must not be
        # the caller's tensor, or mul_ would change it on that rank only
        mesh = self.build_device_mesh()
        for dtype in (torch.int64, torch.int32, torch.uint8):
            t = torch.tensor([4, 5, 6], dtype=dtype)
            rep = distribute_tensor(t, mesh, [Replicate()])
            part = distribute_tensor(t, mesh, [Partial()])
            part.mul_(2)
            self.assertEqual(t, torch.tensor([4, 5, 6], dtype=dtype))
            self.assertEqual(rep.to_local(), torch.tensor([4, 5, 6], dtype=dtype))
            self.assertEqual(part.full_tensor(), torch.tensor([8, 10, 12], dtype=dtype))
            again = distribute_tensor(t, mesh, [Partial()])
            self.assertEqual(again.full_tensor(), torch.tensor([4, 5, 6], dtype=dtype))
            part2 = self._to_partial_sum(rep)
            part2.add_(part2)
            self.assertEqual(rep.to_local(), torch.tensor([4, 5, 6], dtype=dtype))

    def test_rank_outside_the_mesh(self):
        # rank 1 is not in this mesh: its local is empty, as on every other path
        mesh = DeviceMesh("cpu", [0])
        t = torch.tensor([4, 5, 6])
        part = distribute_tensor(t, mesh, [Partial()])
        if self.rank == 0:
            self.assertEqual(part.to_local(), t)
        else:
            self.assertEqual(part.to_local().numel(), 0)

    def test_mul_and_div_split_integer_operand_keeps_inf_and_zero_division(self):
        # mul and div take a Partial("sum") at one operand: an integer or bool
        # Replicate operand split into one must not hold zeros where the other
        # operand holds inf or the denominator 0.0 (0 * inf and 0 / 0 are nan,
        # the sum inf). In a floating computation it is divided like a float;
        # an integer computation keeps it whole (2**53 + 1 stays exact).
        mesh = self.build_device_mesh()
        inf, nan = float("inf"), float("nan")
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        cases = [
            # (op, (value, placement, dtype) per operand, out dtype, collectives)
            (torch.mul, [([3, 3], "R", i32), ([inf, 2.0], "R", f32)], f32, 0),
            (torch.mul, [([inf, 2.0], "R", f32), ([3, 3], "R", i32)], f32, 0),
            (torch.mul, [([inf, 2.0], "avg", f32), (3, "R", i32)], f32, 1),
            (
                torch.mul,
                [([inf, -2.0], "avg", f32), ([True, True], "R", torch.bool)],
                f32,
                1,
            ),
            (torch.mul, [([3, -3], "R", i64), ([nan, -inf], "R", f32)], f32, 0),
            (torch.div, [([3, 3], "R", i32), ([0.0, 2.0], "R", f32)], f32, 0),
            (torch.div, [([-3, 0], "R", i32), ([0.0, 0.0], "R", f32)], f32, 0),
            (
                torch.div,
                [([True, True], "R", torch.bool), ([0.0, 2.0], "sum", f32)],
                f32,
                1,
            ),
            (torch.div, [([3, 3], "R", i32), ([0, 2], "R", i32)], f32, 0),
            (torch.mul, [([2**53 + 1, 3], "R", i64), ([1, 2], "R", i64)], i64, 0),
        ]
        for fn, operands, out_dtype, collectives in cases:
            with self.subTest(fn=fn.__name__, operands=operands):
                args = []
                for value, placement, dtype in operands:
                    if placement == "sum":
                        zeros = [0] * len(value)
                        per_rank = [value if r == 0 else zeros for r in range(2)]
                        args.append(
                            self._dtensor(mesh, Partial("sum"), per_rank, dtype)
                        )
                    else:
                        p = Replicate() if placement == "R" else Partial(placement)
                        args.append(self._dtensor(mesh, p, [value, value], dtype))
                expected = fn(
                    *(torch.tensor(value, dtype=dtype) for value, _, dtype in operands)
                ).to(out_dtype)
                out = self._dtensor(mesh, Partial("sum"), [[0, 0], [0, 0]], out_dtype)
                comm_mode = CommDebugMode()
                with comm_mode:
                    fn(*args, out=out)
                self.assertEqual(comm_mode.get_total_counts(), collectives)
                self.assertEqual(out.placements, (Partial("sum"),))
                self.assertEqual(out.dtype, out_dtype)
                self.assertEqual(out.full_tensor(), expected)

    def test_float_sum_partial_is_still_divided(self):
        # The floating-point path is unchanged: every rank holds v / n.
        mesh = self.build_device_mesh()
        rep = self._dtensor(mesh, Replicate(), [[3.0, 5.0], [3.0, 5.0]], torch.float32)
        part = self._to_partial_sum(rep)
        self.assertEqual(part.to_local(), torch.tensor([1.5, 2.5]))
        self.assertEqual(part.full_tensor(), torch.tensor([3.0, 5.0]))


class PartialIntReplicateToPartialMeshTest(TestCase):
    """LocalTensor over the fake process group, on 1-D meshes of 2 and 3 ranks
    and on 2x2 and 2x2x2 meshes. The truth is the op on plain tensors built
    from the inputs' full_tensor(), i.e. DTensor's own reduced values."""

    def _run(self, shape, fn, inputs, placements, collectives, exact=False):
        # inputs: (placements, local per mesh coordinate) per argument;
        # placements: the result's
        world_size = math.prod(shape)
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=world_size
        )
        try:
            mesh = init_device_mesh("cpu", shape)
            coords = list(itertools.product(*(range(n) for n in shape)))
            with LocalTensorMode(frozenset(range(world_size))):
                args = [
                    DTensor.from_local(
                        LocalTensor({r: local(c) for r, c in enumerate(coords)}),
                        mesh,
                        placements,
                        run_check=False,
                    )
                    for placements, local in inputs
                ]
                plain = [a.full_tensor()._local_tensors[0] for a in args]
                comm_mode = CommDebugMode()
                with comm_mode:
                    result = fn(*args)
                self.assertEqual(result.placements, placements)
                got = result.full_tensor()._local_tensors[0]
            truth = fn(*plain)
            self.assertEqual(got.dtype, truth.dtype)
            if exact:
                # bit for bit: a rounding difference is the failure looked for
                self.assertEqual(got, truth, equal_nan=True, atol=0, rtol=0)
            else:
                self.assertEqual(got, truth, equal_nan=True)
            self.assertEqual(comm_mode.get_total_counts(), collectives)
        finally:
            dist.destroy_process_group()

    def test_split_integer_operand_meets_an_infinite_alpha(self):
        # add/sub/rsub scale one operand by alpha: the zeros of an integer or
        # bool Replicate operand kept whole on the first rank would meet
        # alpha=inf there (0 * inf is nan, the sum inf)
        inf = float("inf")
        x = torch.tensor([1.0, -2.0])
        c = torch.tensor([3, 3], dtype=torch.int32)
        cases = [
            ("add", lambda a, b: torch.add(a, b, alpha=inf), torch.int32),
            ("add", lambda a, b: torch.add(a, b, alpha=-inf), torch.bool),
            ("add", lambda a, b: torch.add(a, b, alpha=inf), torch.int64),
            ("sub", lambda a, b: torch.sub(a, b, alpha=inf), torch.uint8),
            ("rsub", lambda a, b: torch.rsub(b, a, alpha=inf), torch.int32),
            ("add_", lambda a, b: a.clone().add_(b, alpha=inf), torch.int8),
            (
                "_foreach_add",
                lambda a, b: torch._foreach_add([a], [b], alpha=-inf)[0],
                torch.int32,
            ),
            (
                "_foreach_sub",
                lambda a, b: torch._foreach_sub([a], [b], alpha=inf)[0],
                torch.int64,
            ),
        ]
        for shape in ((2,), (3,), (2, 2), (2, 2, 2)):
            psum = (Partial("sum"),) * len(shape)
            rep = (Replicate(),) * len(shape)
            for name, fn, dtype in cases:
                with self.subTest(shape=shape, op=name, dtype=dtype):
                    self._run(
                        shape,
                        fn,
                        [
                            (psum, lambda co: x if not any(co) else x * 0),
                            (rep, lambda co, dtype=dtype: c.to(dtype)),
                        ],
                        psum,
                        collectives=0,
                    )
            with self.subTest(shape=shape, op="add out="):
                self._run(
                    shape,
                    lambda a, b, o: torch.add(a, b, alpha=inf, out=o),
                    [
                        (rep, lambda co: x),
                        (rep, lambda co: torch.tensor([True, True])),
                        (psum, lambda co: torch.zeros(2)),
                    ],
                    psum,
                    collectives=0,
                )

    def test_large_integer_operand_of_a_float_add_is_divided_like_a_float(self):
        # A float add/sub/rsub with a finite alpha rounds the integer operand
        # into its float dtype; kept whole on one rank, that rank would round
        # the converted value with its own piece and the sum would round again
        # at the same ulp (float32 [0.5, 0.5] + 16777218 read 16777218 for
        # 16777220). Converted and divided, each rank rounds at half that ulp,
        # as for a float operand, and the sums here are exact.
        cases = [
            ("add", lambda a, b: a + b),
            ("sub", lambda a, b: a - b),
            ("rsub", lambda a, b: torch.rsub(a, b)),
            ("add alpha=3", lambda a, b: torch.add(a, b, alpha=3)),
            ("add_", lambda a, b: a.clone().add_(b)),
            ("_foreach_add", lambda a, b: torch._foreach_add([a], [b])[0]),
            ("_foreach_sub", lambda a, b: torch._foreach_sub([a], [b])[0]),
        ]
        operands = [
            (
                torch.float32,
                torch.int32,
                [16777218, 33554436, 16777217, -16777219],
            ),
            (
                torch.float32,
                torch.int64,
                [16777218, 33554436, 16777217, -16777219],
            ),
            (
                torch.float64,
                torch.int64,
                [2**53 + 2, 2**54 + 4, 2**53 + 1, -(2**53) - 3],
            ),
        ]
        for shape in ((2,), (2, 2)):
            psum = (Partial("sum"),) * len(shape)
            rep = (Replicate(),) * len(shape)
            for dtype, int_dtype, values in operands:
                pieces = (
                    torch.tensor([0.5, 0.25, 1.5, -0.5], dtype=dtype),
                    torch.tensor([0.5, 0.25, 0.5, -0.5], dtype=dtype),
                )
                y = torch.tensor(values, dtype=int_dtype)
                for name, fn in cases:
                    if name == "add alpha=3" and len(shape) > 1:
                        # 3 * y / 4 rounds on a four-way split: exact sums
                        # only where alpha times each piece is exact
                        continue
                    with self.subTest(
                        shape=shape, op=name, dtype=dtype, operand=int_dtype
                    ):
                        self._run(
                            shape,
                            fn,
                            [
                                # the pieces on the first two ranks of the
                                # last mesh dim, zeros elsewhere
                                (
                                    psum,
                                    lambda co, pieces=pieces: (
                                        pieces[co[-1]]
                                        if not any(co[:-1])
                                        else pieces[0] * 0
                                    ),
                                ),
                                (rep, lambda co, y=y: y),
                            ],
                            psum,
                            collectives=0,
                            exact=True,
                        )

    def test_integer_operand_stays_whole_where_a_division_would_round(self):
        # At 3 ranks v / 3 rounds on each rank (float16 65504 / 3 rounds up
        # and the thirds sum to inf; 5 / 3 in float64 sums to
        # 5.000000000000001), while the integer kept whole on one rank is
        # exact: the Partial's own pieces carry no rounding here.
        psum, rep = (Partial("sum"),), (Replicate(),)
        cases = [
            ("add", lambda a, b: a + b),
            ("sub", lambda a, b: a - b),
            ("rsub", lambda a, b: torch.rsub(a, b)),
            ("_foreach_add", lambda a, b: torch._foreach_add([a], [b])[0]),
        ]
        operands = [
            ((3,), dtype, torch.tensor([1, 5, 5], dtype=torch.int64))
            for dtype in (torch.float64, torch.float32, torch.bfloat16)
        ] + [((3,), torch.float16, torch.tensor([1, 5, 65504], dtype=torch.int32))]
        # float16 and bfloat16 hold few digits of a large integer: at 8 ranks
        # its eighths round in the per-rank sums (60000 read 59968)
        # (complex32's parts are float16)
        operands += [
            ((8,), dtype, torch.tensor([65472, 60000, 40003], dtype=torch.int32))
            for dtype in (torch.float16, torch.bfloat16, torch.complex32)
        ]
        for shape, dtype, y in operands:
            x = torch.tensor([1.0, 1.0, 0.0], dtype=dtype)
            for name, fn in cases:
                with self.subTest(op=name, dtype=dtype, shape=shape):
                    self._run(
                        shape,
                        fn,
                        [
                            (psum, lambda co, x=x: x if not any(co) else x * 0),
                            (rep, lambda co, y=y: y),
                        ],
                        psum,
                        collectives=0,
                        exact=True,
                    )

    def test_operand_repeated_in_a_foreach_list_is_converted_per_entry(self):
        # One integer tensor passed for two list entries of different dtypes is
        # converted into each entry's dtype, not reused from the first entry
        # (a float64 result for a float32 entry; int64 2**40 + 1 rounded in
        # float32 read 2**40 + 2 through complex128)
        s = torch.tensor([2**40 + 1, 3, -5])
        x = torch.tensor([1.0, -2.0, 0.5])
        cases = [
            (torch.float64, torch.float32, float("inf")),
            (torch.complex128, torch.complex64, 1 + 0j),
        ]
        for shape in ((2,), (2, 2)):
            psum = (Partial("sum"),) * len(shape)
            rep = (Replicate(),) * len(shape)
            for first, second, alpha in cases:
                with self.subTest(shape=shape, dtypes=(first, second), alpha=alpha):
                    self._run(
                        shape,
                        lambda a, b, c, alpha=alpha: torch._foreach_add(
                            [a, b], [c, c], alpha=alpha
                        )[1],
                        [
                            (
                                psum,
                                lambda co, d=first: (x if not any(co) else x * 0).to(d),
                            ),
                            (
                                psum,
                                lambda co, d=second: (x if not any(co) else x * 0).to(
                                    d
                                ),
                            ),
                            (rep, lambda co: s),
                        ],
                        psum,
                        collectives=0,
                    )

    def test_split_without_a_pending_partial_takes_a_float_operands_plan(self):
        # An integer operand converted for alpha=-inf whose other mesh dims
        # carry no pending Partial is converted first and redistributed once,
        # like a floating operand: the same collectives and values as the
        # operand converted into float32 by the caller (a Shard -> Partial("sum")
        # split zero-fills, so those rows read nan either way). Before, it went
        # through the target with the split mesh dims left as they were: one
        # collective more for a Shard source.
        inf = float("inf")
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            mesh = init_device_mesh("cpu", (2, 2))
            full = torch.arange(16, dtype=torch.int32).reshape(4, 4) - 5
            cases = [
                ((Shard(0), Shard(1)), (Partial("sum"), Shard(0)), 1),
                ((Shard(1), Shard(0)), (Partial("sum"), Shard(1)), 1),
                ((Shard(0), Replicate()), (Partial("sum"), Shard(0)), 0),
                ((Replicate(), Shard(1)), (Partial("sum"), Shard(0)), 1),
            ]
            for src, dst, collectives in cases:
                with self.subTest(src=src, dst=dst):
                    with LocalTensorMode(frozenset(range(4))):
                        x = distribute_tensor(
                            torch.full((4, 4), 1.5), mesh, [Replicate()] * 2
                        )
                        got = {}
                        for dtype in (torch.int32, torch.float32):
                            c = distribute_tensor(full, mesh, src).to(dtype)
                            o = distribute_tensor(torch.zeros(4, 4), mesh, dst)
                            comm_mode = CommDebugMode()
                            with comm_mode:
                                torch.add(x, c, alpha=-inf, out=o)
                            self.assertEqual(o.placements, dst)
                            got[dtype] = (
                                o.full_tensor()._local_tensors[0],
                                comm_mode.get_total_counts(),
                            )
                    self.assertEqual(got[torch.int32][1], collectives)
                    self.assertEqual(
                        got[torch.int32], got[torch.float32], equal_nan=True
                    )
                    if src[0] == Replicate():
                        self.assertEqual(
                            got[torch.int32][0],
                            torch.add(torch.full((4, 4), 1.5), full, alpha=-inf),
                            equal_nan=True,
                        )
        finally:
            dist.destroy_process_group()

    def test_integer_operand_is_converted_into_the_current_default_dtype(self):
        # An integer tensor and a Python float compute in the default dtype:
        # a call under float64 after one under float32 converts the operand
        # into float64 (2**24 + 1 stays exact), not into the float32 of the
        # earlier call.
        values = [2**24 + 1, 2**53 - 1, 3, -(2**24 + 3)]
        cases = [
            ("mul", lambda y, o: torch.mul(y, 0.5, out=o)),
            ("div", lambda y, o: torch.div(y, 0.5, out=o)),
        ]
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        default = torch.get_default_dtype()
        try:
            mesh = init_device_mesh("cpu", (2,))
            for name, fn in cases:
                for dtype in (torch.float32, torch.float64):
                    with self.subTest(op=name, default_dtype=dtype):
                        torch.set_default_dtype(dtype)
                        y = torch.tensor(values)
                        truth = torch.zeros(4, dtype=dtype)
                        fn(y, truth)
                        with LocalTensorMode(frozenset(range(2))):
                            d = distribute_tensor(y, mesh, [Replicate()])
                            o = distribute_tensor(
                                torch.zeros(4, dtype=dtype), mesh, [Partial("sum")]
                            )
                            fn(d, o)
                            got = o.full_tensor()._local_tensors[0]
                        self.assertEqual(got, truth, atol=0, rtol=0)
        finally:
            torch.set_default_dtype(default)
            dist.destroy_process_group()

    def test_pending_integer_partial_is_reduced_in_its_dtype_before_the_split(
        self,
    ):
        # An integer or bool operand pending on mesh dim 0 and split into a
        # Partial("sum") on the other mesh dims for mul/div into a floating
        # out=: its pending reduction runs in its own dtype (int32 and int8
        # sums wrap, a bool sum is a logical or, bitwise_or stays bitwise),
        # and only then is it converted and split. One all-reduce, as
        # without the conversion.
        cases = [
            ("mul", "sum", torch.int32, lambda first: 2**31 - 1 if first else 1),
            ("div", "sum", torch.int8, lambda first: 100),
            ("div", "sum", torch.uint8, lambda first: 200 if first else 100),
            ("mul", "sum", torch.bool, lambda first: True),
            ("mul", "avg", torch.int32, lambda first: 1 if first else 2),
            ("mul", "bor", torch.int32, lambda first: 1 if first else 2),
            ("mul", "sum", torch.int32, lambda first: 2**24 + 1 if first else 1),
        ]
        for shape in ((2, 2), (2, 2, 2)):
            n = len(shape)
            rep = (Replicate(),) * n
            out_placements = (Replicate(),) + (Partial("sum"),) * (n - 1)
            for op, reduce_op, dtype, piece in cases:
                with self.subTest(shape=shape, op=op, reduce_op=reduce_op, dtype=dtype):
                    fn = getattr(torch, op)
                    self._run(
                        shape,
                        lambda a, b, o, fn=fn: fn(a, b, out=o),
                        [
                            (
                                (Partial(reduce_op),) + (Replicate(),) * (n - 1),
                                lambda co, dtype=dtype, piece=piece: torch.tensor(
                                    [piece(co[0] == 0), 1], dtype=dtype
                                ),
                            ),
                            (rep, lambda co: torch.ones(2)),
                            (out_placements, lambda co: torch.zeros(2)),
                        ],
                        out_placements,
                        collectives=1,
                    )

    def test_split_on_several_mesh_dims_matches_a_float_operands_split(self):
        # An integer or bool Replicate operand split into a Partial("sum") on
        # several mesh dims of a float computation is divided by the product
        # of their sizes at once, without redistribute_local_tensor, where
        # that gives what dividing the converted operand by each size in turn
        # gives: at most one size is not a power of 2 (2x2, 3x2, 2x3, 2x2x2).
        # On 3x3 the two divisions by 3 can round differently from one by 9,
        # so it keeps the successive divisions. Each rank's local (values,
        # dtype, strides) must equal the float operand's bit for bit.
        limits = {
            torch.int64: [2**62 + 1, 2**63 - 1, -(2**63), 2**53 + 1, -7],
            torch.int32: [2**31 - 1, -(2**31), 2**24 + 1, 5, -3],
            torch.int8: [127, -128, 1, 0, 7],
            torch.uint8: [255, 0, 1, 3, 128],
            torch.bool: [True, False, True, True, False],
        }

        def views(values, dtype):
            t = torch.tensor(values * 3, dtype=dtype)[:12].reshape(3, 4)
            return {
                "contiguous": t,
                "transposed": t.t(),
                "expanded": t[:1, :1].expand(2, 3),
                "empty_transposed": t.t()[:0],
                "0-dim": t[0, 0].clone(),
            }

        shapes = (((2, 2), 0), ((3, 2), 0), ((2, 3), 0), ((2, 2, 2), 0), ((3, 3), 1))
        default = torch.get_default_dtype()
        for shape, redistributions in shapes:
            world_size = math.prod(shape)
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=world_size
            )
            try:
                mesh = init_device_mesh("cpu", shape)
                n = len(shape)
                rep = [Replicate()] * n
                for default_dtype, (dtype, values) in itertools.product(
                    (torch.float32, torch.float64), limits.items()
                ):
                    torch.set_default_dtype(default_dtype)
                    for name, local in views(values, dtype).items():
                        with (
                            self.subTest(
                                shape=shape,
                                default_dtype=default_dtype,
                                dtype=dtype,
                                view=name,
                            ),
                            LocalTensorMode(frozenset(range(world_size))),
                        ):
                            other = torch.full(local.shape, 3.0)

                            def run(c):
                                o = DTensor.from_local(
                                    torch.zeros(local.shape), mesh, [Partial()] * n
                                )
                                comm_mode = CommDebugMode()
                                with comm_mode:
                                    torch.div(
                                        c,
                                        DTensor.from_local(other, mesh, rep),
                                        out=o,
                                    )
                                self.assertEqual(comm_mode.get_total_counts(), 0)
                                self.assertEqual(o.placements, (Partial(),) * n)
                                return o

                            c = DTensor.from_local(local, mesh, rep, run_check=False)
                            with mock.patch.object(
                                _dispatch,
                                "redistribute_local_tensor",
                                wraps=redistribute_local_tensor,
                            ) as redistribute:
                                got = run(c)
                            if local.numel():
                                self.assertEqual(
                                    redistribute.call_count, redistributions
                                )
                            want = run(c.to(default_dtype))
                            for r in range(world_size):
                                g = got.to_local()._local_tensors[r]
                                w = want.to_local()._local_tensors[r]
                                self.assertEqual(g.dtype, default_dtype)
                                self.assertEqual(g.stride(), w.stride())
                                self.assertEqual(g, w, atol=0, rtol=0, equal_nan=True)
                            self.assertEqual(
                                got.full_tensor()._local_tensors[0],
                                torch.div(local, other),
                            )
            finally:
                torch.set_default_dtype(default)
                dist.destroy_process_group()

    def test_split_after_a_pending_reduction_is_one_division(self):
        # An integer operand pending on mesh dim 0 and split on the others is
        # reduced in its own dtype (int32 wraps) and then divided once, by
        # the product of the split dims' sizes: one redistribute_local_tensor
        # (the reduction), one collective.
        for shape in ((2, 2), (2, 2, 2), (2, 3)):
            world_size = math.prod(shape)
            n = len(shape)
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=world_size
            )
            try:
                mesh = init_device_mesh("cpu", shape)
                with (
                    self.subTest(shape=shape),
                    LocalTensorMode(frozenset(range(world_size))),
                ):
                    pieces = LocalTensor(
                        {
                            # the first coordinate on mesh dim 0 holds
                            # 2**31 - 1, the others 1: the int32 sum wraps
                            r: torch.tensor(
                                [1 if r >= world_size // shape[0] else 2**31 - 1, 3],
                                dtype=torch.int32,
                            )
                            for r in range(world_size)
                        }
                    )
                    c = DTensor.from_local(
                        pieces, mesh, [Partial()] + [Replicate()] * (n - 1)
                    )
                    out_placements = (Replicate(),) + (Partial(),) * (n - 1)
                    o = DTensor.from_local(
                        torch.zeros(2), mesh, out_placements, run_check=False
                    )
                    comm_mode = CommDebugMode()
                    with (
                        comm_mode,
                        mock.patch.object(
                            _dispatch,
                            "redistribute_local_tensor",
                            wraps=redistribute_local_tensor,
                        ) as redistribute,
                    ):
                        torch.mul(
                            c,
                            DTensor.from_local(torch.ones(2), mesh, [Replicate()] * n),
                            out=o,
                        )
                    self.assertEqual(redistribute.call_count, 1)
                    self.assertEqual(comm_mode.get_total_counts(), 1)
                    self.assertEqual(o.placements, out_placements)
                    plain = c.full_tensor()._local_tensors[0]
                    self.assertEqual(plain[0].item(), -(2**31) + shape[0] - 2)
                    self.assertEqual(
                        o.full_tensor()._local_tensors[0], plain.to(torch.float32)
                    )
            finally:
                dist.destroy_process_group()


class DistPartialIntReplicateToPartialCompileTest(DTensorContinuousTestBase):
    """Real processes: one trace under compile_on_one_rank must serve every rank, and the
    eager branch on the coordinate agrees with the traced form."""

    world_size = 2

    def test_compile_on_one_rank_integer_partial_plus_replicate(self):
        mesh = self.build_device_mesh()
        p_local = torch.tensor([[1, 2, 3], [4, 5, 6]][self.rank], dtype=torch.int64)
        r_local = torch.tensor([10, 20, 33], dtype=torch.int64)
        p = DTensor.from_local(p_local, mesh, [Partial("sum")], run_check=False)
        r = DTensor.from_local(r_local, mesh, [Replicate()], run_check=False)
        torch._dynamo.reset()
        with torch.compiler.config.patch(compile_on_one_rank=True):
            fn = torch.compile(lambda a, b: a + b, backend="aot_eager", fullgraph=True)
            out = fn(p, r)
        self.assertEqual(out.dtype, torch.int64)
        self.assertEqual(out.full_tensor(), torch.tensor([15, 27, 42]))

    def test_large_int64_partial_plus_replicate_eager_and_compiled(self):
        # Eager takes the Python branch on this rank's coordinate; aot_eager without
        # compile_on_one_rank traces the tensor-arithmetic form (scalar_tensor, eq,
        # where). Both give the exact integer on every rank.
        mesh = self.build_device_mesh()
        big = [2**53 + 1, -(2**62) - 3, 7]
        p_local = torch.tensor([[1, 2, 3], [4, 5, 6]][self.rank], dtype=torch.int64)
        p = DTensor.from_local(p_local, mesh, [Partial("sum")], run_check=False)
        r = DTensor.from_local(torch.tensor(big), mesh, [Replicate()], run_check=False)
        truth = torch.tensor(big) + torch.tensor([5, 7, 9])

        comm_mode = CommDebugMode()
        with comm_mode:
            eager = p + r
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(eager.placements, (Partial("sum"),))
        self.assertEqual(eager.dtype, torch.int64)
        self.assertEqual(eager.full_tensor(), truth, atol=0, rtol=0)

        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        from torch._dynamo.backends.common import aot_autograd

        torch._dynamo.reset()
        fn = torch.compile(
            lambda a, b: a + b,
            backend=aot_autograd(fw_compiler=backend),
            fullgraph=True,
        )
        compiled = fn(p, r)
        self.assertEqual(compiled.placements, (Partial("sum"),))
        self.assertEqual(compiled.dtype, torch.int64)
        self.assertEqual(compiled.to_local(), eager.to_local(), atol=0, rtol=0)
        self.assertEqual(compiled.full_tensor(), truth, atol=0, rtol=0)
        targets = {
            str(n.target)
            for g in graphs
            for n in g.graph.nodes
            if n.op == "call_function"
        }
        self.assertIn("aten.where.self", targets)


DistPartialIntReplicateToPartialTestWithLocalTensor = create_local_tensor_test_class(
    DistPartialIntReplicateToPartialTest,
    # LocalTensor runs every rank of the world in the mesh's process: there is
    # no rank outside the mesh to run the test on
    skipped_tests=["test_rank_outside_the_mesh"],
    base_class=LocalDTensorContinuousTestBase,
)


if __name__ == "__main__":
    run_tests()
