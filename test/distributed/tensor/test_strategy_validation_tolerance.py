# Owner(s): ["oncall: distributed"]
"""The validator compares within the rounding of the per-rank values.

A rule the validator reports incorrect must be wrong, and a wrong rule must be reported."""

from fractions import Fraction

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._ops._math_ops import _NormPartial
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten
WORLD_SIZE = 2


# A sum that takes its dtype positionally (aten's softmax.int, log_softmax.int and
# to.dtype do too); named sum, so that the validator bounds its rounding as a sum's.
@torch.library.custom_op("strategy_validation_test::sum", mutates_args=())
def _sum_in(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.sum(x, dtype=dtype)


class StrategyValidatorTestBase(TestCase):
    def setUp(self):
        super().setUp()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
        )

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def check(self, op, args, combination, kwargs=None):
        """Whether the validator finds ``combination`` correct for ``op(*args)``."""
        ground_truth = sv._to_ground_truth(op(*args, **(kwargs or {})))
        with LocalTensorMode(frozenset(range(WORLD_SIZE))):
            mesh = init_device_mesh("cpu", (WORLD_SIZE,))
            valid, message = sv.validate_aten_combination(
                op, args, kwargs or {}, ground_truth, combination, WORLD_SIZE, mesh
            )
        return valid, message


class ToleranceTest(StrategyValidatorTestBase):
    """Rounding of the per-rank values is not a wrong rule; a wrong rule still is."""

    def test_linear_rules_within_rounding(self):
        torch.manual_seed(0)
        a, b = torch.randn(12, 4, 12) * 9, torch.randn(12, 12, 4) * 9
        rule = ((Replicate(), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.bmm.default, (a, b), rule)
        self.assertTrue(valid, message)
        x = torch.randn(4, 12, 4, dtype=torch.bfloat16)
        for reduce_op in ("sum", "avg"):
            rule = ((Partial(reduce_op),), (Partial(reduce_op),))
            valid, message = self.check(aten.clone.default, (x,), rule)
            self.assertTrue(valid, message)

    def test_widening_cast_keeps_the_input_rounding(self):
        # Each rank's bfloat16 split is rounded; cast to float64 the sum keeps that.
        torch.manual_seed(0)
        x = torch.randn(4, 4, 4, 4, dtype=torch.bfloat16)
        rule = ((Partial("sum"),), (Partial("sum"),))
        valid, message = self.check(
            aten._to_copy.default, (x,), rule, {"dtype": torch.float64}
        )
        self.assertTrue(valid, message)

    def test_nonlinear_rules_still_incorrect_in_bfloat16(self):
        torch.manual_seed(0)
        x = torch.randn(4, 12, 4, dtype=torch.bfloat16)
        rule = ((Partial("sum"),), (Partial("sum"),))
        self.assertFalse(self.check(aten.abs.default, (x,), rule)[0])
        self.assertFalse(self.check(aten.exp.default, (x,), rule)[0])
        rule = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
        self.assertFalse(self.check(aten.mul.Tensor, (x, x), rule)[0])

    def test_tolerance_is_per_element(self):
        # One element of 1e6 must not widen the tolerance of the others: adding a
        # Replicate operand on every rank of a P(sum) is off by (world_size - 1) * y.
        torch.manual_seed(0)
        x = torch.randn(8, 8)
        x[3, 5] = 1e6
        y = torch.randn(8, 8) * 0.05
        wrong = ((Partial("sum"), Replicate()), (Partial("sum"),))
        self.assertFalse(self.check(aten.add.Tensor, (x, y), wrong)[0])
        right = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.add.Tensor, (x, y), right)
        self.assertTrue(valid, message)
        # A contraction with an outlier: the bound is per output element.
        a, b = torch.randn(4, 8, 8), torch.randn(4, 8, 8)
        a[0, 0, 0] = 1e6
        rule = ((Replicate(), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.bmm.default, (a, b), rule)
        self.assertTrue(valid, message)
        wrong = ((Replicate(), Partial("sum")), (Replicate(),))
        self.assertFalse(self.check(aten.bmm.default, (a, b), wrong)[0])
        # A wrong bias in a bf16 addmm is caught away from the outlier.
        bias = torch.randn(8, 8, dtype=torch.bfloat16)
        m1 = torch.randn(8, 8, dtype=torch.bfloat16)
        m1[0, 0] = 1e4
        m2 = torch.randn(8, 8, dtype=torch.bfloat16)
        wrong = ((Replicate(), Partial("sum"), Replicate()), (Partial("sum"),))
        self.assertFalse(self.check(aten.addmm.default, (bias, m1, m2), wrong)[0])

    def test_integer_and_bool_outputs_compare_exactly(self):
        torch.manual_seed(0)
        flags, more = torch.rand(6, 1) > 0.5, torch.rand(6) > 0.5
        rule = ((Replicate(), Shard(0)), (Shard(1),))
        valid, message = self.check(aten.add.Tensor, (flags, more), rule)
        self.assertTrue(valid, message)
        x = torch.randint(-9, 10, (4, 6))
        rule = ((Partial("sum"), Partial("sum")), (Partial("sum"),))
        valid, message = self.check(aten.add.Tensor, (x, x), rule)
        self.assertTrue(valid, message)
        rule = ((Partial("sum"), Replicate()), (Partial("sum"),))
        self.assertFalse(self.check(aten.add.Tensor, (x, x + 1), rule)[0])

    def test_infinity_is_close_only_to_itself(self):
        # The per-element band must not accept a finite value, or the other
        # infinity, next to an infinite expected element (torch.isclose does not).
        inf, nan = float("inf"), float("nan")
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            for expected, actual in (
                ([inf, 1.0], [1.0, 1.0]),
                ([inf, 1.0], [-inf, 1.0]),
                ([-inf, 1.0], [65000.0, 1.0]),
                ([1.0, 1.0], [inf, 1.0]),
                ([nan, 1.0], [inf, 1.0]),
            ):
                e = torch.tensor(expected, dtype=dtype)
                a = torch.tensor(actual, dtype=dtype)
                atol = torch.full((2,), 1e-5, dtype=torch.float64)
                self.assertFalse(
                    sv._within(e, a, atol, 1e-5), (dtype, expected, actual)
                )
            e = torch.tensor([inf, -inf, nan, 1.0], dtype=dtype)
            atol = torch.full((4,), 1e-5, dtype=torch.float64)
            self.assertTrue(sv._within(e, e.clone(), atol, 1e-5), dtype)
        e = torch.tensor([complex(inf, 0.0), 1.0])
        a = torch.tensor([complex(1.0, 0.0), 1.0])
        self.assertFalse(sv._within(e, a, torch.full((2,), 1e-5), 1e-5))

    def test_narrowing_cast_of_a_partial_sum_is_reported(self):
        # Each rank rounds its value into the narrower dtype where the op on the
        # reduced value rounds once (float32 100.3 / -100.0 to bfloat16 read 0.5 for
        # 0.30078125): such a rule is wrong, not rounding to allow. A widening cast
        # of a bfloat16 split rounds nothing new and stays accepted.
        torch.manual_seed(0)
        for reduce_op in ("sum", "avg"):
            rule = ((Partial(reduce_op),), (Partial(reduce_op),))
            for source, target in (
                (torch.float32, torch.bfloat16),
                (torch.float32, torch.float16),
                (torch.float64, torch.bfloat16),
            ):
                x = (torch.rand(4, 6, dtype=torch.float64) * 18 - 9).to(source)
                kwargs = {"dtype": target}
                self.assertFalse(
                    self.check(aten._to_copy.default, (x,), rule, kwargs)[0],
                    (reduce_op, source, target),
                )
                self.assertFalse(
                    self.check(aten.sum.dim_IntList, (x, [1]), rule, kwargs)[0],
                    (reduce_op, source, target),
                )
            x = (torch.rand(4, 6) * 18 - 9).to(torch.bfloat16)
            valid, message = self.check(
                aten._to_copy.default, (x,), rule, {"dtype": torch.float32}
            )
            self.assertTrue(valid, message)


def judge(op, args, rule, world_size, kwargs=None):
    """The validator's full per-rule path (primary check and every mitigation)."""
    kwargs = kwargs or {}
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        truth = sv._to_ground_truth(op(*args, **kwargs))
        mitigations = sv._prepare_aten_mitigations(op, args, kwargs)
        with LocalTensorMode(frozenset(range(world_size))):
            mesh = init_device_mesh("cpu", (world_size,))
            return sv._validate_aten_with_mitigations(
                op, args, kwargs, *rule, truth, world_size, mesh, mitigations
            )
    finally:
        dist.destroy_process_group()


class WrongRuleTest(TestCase):
    """Wrong rules an earlier revision of this PR accepted,
    at 2 and 3 ranks; the right rules of the same samples stay accepted."""

    def test_wrong_rules_on_large_integers_and_bfloat16(self):
        g = torch.Generator().manual_seed(0)
        big = torch.randint(10_000_000, 20_000_000, (4, 4), generator=g)
        small_int = torch.randint(1, 5, (4, 4), generator=g)
        lse_in = (torch.randn(4, 6, generator=g) + 60).to(torch.bfloat16)
        tiny = (torch.rand(4, 4, generator=g) * 0.04 + 0.01).to(torch.bfloat16)
        tiny2 = (torch.rand(4, 4, generator=g) * 0.04 + 0.01).to(torch.bfloat16)
        xf = torch.randn(4, 4, generator=g)
        yb = (torch.randn(4, 4, generator=g) * 0.02).to(torch.bfloat16)
        P, R = Partial, Replicate()
        wrong = {
            # integers compare exactly (allclose let an error of 1 in 1e7 pass)
            "int64 add P(sum), R": (
                aten.add.Tensor,
                (big, small_int),
                ((P("sum"), R), (P("sum"),)),
            ),
            # no sum-like Partial: no rounding band (4 bf16 ulps are 3%)
            "bf16 logsumexp S(1) -> P(max)": (
                aten.logsumexp.default,
                (lse_in, [1]),
                ((Shard(1),), (P("max"),)),
            ),
            # offsets scaled to the element (|x| + 1 gave a band of ~0.06)
            "bf16 small clone P(sum) -> P(avg)": (
                aten.clone.default,
                (tiny,),
                ((P("sum"),), (P("avg"),)),
            ),
            "bf16 small clone P(avg) -> P(sum)": (
                aten.clone.default,
                (tiny,),
                ((P("avg"),), (P("sum"),)),
            ),
            "bf16 small add P(sum), R": (
                aten.add.Tensor,
                (tiny, tiny2),
                ((P("sum"), R), (P("sum"),)),
            ),
            # a bfloat16 Replicate operand does not set a float32 output's ulp
            "f32 + bf16 add P(sum), R": (
                aten.add.Tensor,
                (xf, yb),
                ((P("sum"), R), (P("sum"),)),
            ),
        }
        right = {
            "int64 add P(sum), P(sum)": (
                aten.add.Tensor,
                (big, small_int),
                ((P("sum"), P("sum")), (P("sum"),)),
            ),
            "bf16 logsumexp S(0)": (
                aten.logsumexp.default,
                (lse_in, [1]),
                ((Shard(0),), (Shard(0),)),
            ),
            "bf16 small clone P(sum)": (
                aten.clone.default,
                (tiny,),
                ((P("sum"),), (P("sum"),)),
            ),
            "bf16 small clone P(avg)": (
                aten.clone.default,
                (tiny,),
                ((P("avg"),), (P("avg"),)),
            ),
            "bf16 small add P(sum), P(sum)": (
                aten.add.Tensor,
                (tiny, tiny2),
                ((P("sum"), P("sum")), (P("sum"),)),
            ),
            "f32 + bf16 add P(sum), P(sum)": (
                aten.add.Tensor,
                (xf, yb),
                ((P("sum"), P("sum")), (P("sum"),)),
            ),
        }
        for world_size in (2, 3):
            for name, (op, args, rule) in wrong.items():
                with self.subTest(name, world_size=world_size):
                    self.assertFalse(judge(op, args, rule, world_size))
            for name, (op, args, rule) in right.items():
                if world_size == 3 and rule[0][0] == Shard(0):
                    continue  # 4 rows do not shard evenly on 3 ranks
                with self.subTest(name, world_size=world_size):
                    self.assertTrue(judge(op, args, rule, world_size))


class Float64RecheckTest(TestCase):
    """Wrong rules whose error is below the rounding band of the per-rank values,
    rejected by the float64 recheck at 2 and 3 ranks; the right
    rules of the same samples stay accepted."""

    def test_wrong_rules_below_a_median_band(self):
        g = torch.Generator().manual_seed(0)
        # most elements 1e6, one 0.01: the offsets' floor widened the small one
        big = torch.full((4, 4), 1e6) + torch.randn(4, 4, generator=g)
        big[1, 2] = 0.01
        y = torch.rand(4, 4, generator=g) * 0.04 + 0.01
        # 64 values ~N(0, 9) summing to 2e-4: the multilinear band is the result
        v = torch.randn(64, generator=g, dtype=torch.float64) * 3
        cancel = (v - v.mean() + 2e-4 / 64).float()
        # a bfloat16 P(sum) operand next to a float32 one
        xb = (torch.rand(4, 4, generator=g) + 2).to(torch.bfloat16)
        yf = torch.full((4, 4), 0.05)
        # an addmm whose product cancels (rows of B are +-1 in pairs), bias 0.1
        m1 = torch.full((4, 4), 1e6) + torch.randn(4, 4, generator=g)
        m2 = torch.ones(4, 4)
        m2[1::2] = -1
        bias = torch.full((4, 4), 0.1)
        P, R = Partial, Replicate()
        cases = {
            "addmm cancel": (
                aten.addmm.default,
                (bias, m1.round(), m2),
                (R, P("sum"), R),
                (P("sum"), P("sum"), R),
            ),
            "add floor": (
                aten.add.Tensor,
                (big, y),
                (P("sum"), R),
                (P("sum"), P("sum")),
            ),
            "sum cancel": (aten.sum.default, (cancel,), (P("sum"),), (P("sum"),)),
            "bf16 + f32 add": (
                aten.add.Tensor,
                (xb, yf),
                (P("sum"), R),
                (P("sum"), P("sum")),
            ),
        }
        outputs = {"sum cancel": ((P("avg"),), (P("sum"),))}
        for world_size in (2, 3):
            for name, (op, args, wrong_in, right_in) in cases.items():
                wrong_out, right_out = outputs.get(name, ((P("sum"),), (P("sum"),)))
                with self.subTest(name, world_size=world_size):
                    self.assertIs(
                        judge(op, args, (wrong_in, wrong_out), world_size), False
                    )
                    self.assertIs(
                        judge(op, args, (right_in, right_out), world_size), True
                    )

    def test_wrong_rules_next_to_huge_elements(self):
        # Float32 elements of 1e15 (1e20) next to one of 0.01: the split's floor
        # (1/16 of the median) made that element's per-rank values about 6e13
        # (6e18), and 4 float64 ulps of them exceeded the wrong rule's error.
        P, R = Partial, Replicate()
        for big, y in ((1e15, 0.03), (1e20, 1000.0)):
            x = torch.full((16,), big)
            x[::2] *= -1
            x[6] = 0.01
            x = x.reshape(4, 4)
            y = torch.full((4, 4), y)
            for world_size in (2, 3):
                with self.subTest(big=big, world_size=world_size):
                    wrong = ((P("sum"), R), (P("sum"),))
                    right = ((P("sum"), P("sum")), (P("sum"),))
                    self.assertIs(
                        judge(aten.add.Tensor, (x, y), wrong, world_size), False
                    )
                    self.assertIs(
                        judge(aten.add.Tensor, (x, y), right, world_size), True
                    )
        # A dtype argument: the recheck ran sum(dtype=torch.float32) in float32.
        g = torch.Generator().manual_seed(0)
        v = torch.randn(64, generator=g, dtype=torch.float64) * 3
        v -= v.mean()
        v[0] += 2e-4
        cancel = v.float()
        kwargs = {"dtype": torch.float32}
        for op, x in ((aten.sum.default, cancel), (aten.mean.default, cancel * 64)):
            for world_size in (2, 3):
                with self.subTest(str(op), world_size=world_size):
                    wrong = ((P("sum"),), (P("avg"),))
                    right = ((P("sum"),), (P("sum"),))
                    self.assertIs(judge(op, (x,), wrong, world_size, kwargs), False)
                    self.assertIs(judge(op, (x,), right, world_size, kwargs), True)

    def test_wrong_rules_of_cancelling_contractions(self):
        # Rows of +-1e9..1e10 pairs that cancel to 1e-3: 4 float64 ulps of the
        # contraction on the absolute per-rank values (about 5e11) exceeded the
        # wrong rule's error (the Replicate bias added on every rank, 1e-4). The
        # exact recheck has no such band.
        def cancelling(n, big, seed=0):
            g = torch.Generator().manual_seed(seed)
            x = (torch.rand(n, generator=g, dtype=torch.float64) + 0.5) * big
            x[1::2] = -x[0::2]
            x[0] += 1e-3
            return x

        f64 = torch.float64
        cases = {
            "addmm 1e9 K=256": (
                aten.addmm.default,
                (
                    torch.full((2, 2), 1e-4, dtype=f64),
                    cancelling(512, 1e9).reshape(2, 256),
                    torch.ones(256, 2, dtype=f64),
                ),
            ),
            "addmm 1e10 K=16": (
                aten.addmm.default,
                (
                    torch.full((4, 3), 5e-5, dtype=f64),
                    cancelling(64, 1e10).reshape(4, 16),
                    torch.ones(16, 3, dtype=f64),
                ),
            ),
            "baddbmm 1e10 K=64": (
                aten.baddbmm.default,
                (
                    torch.full((1, 2, 2), 1e-4, dtype=f64),
                    cancelling(128, 1e10).reshape(1, 2, 64),
                    torch.ones(1, 64, 2, dtype=f64),
                ),
            ),
        }
        P, R = Partial, Replicate()
        wrong = ((R, P("sum"), R), (P("sum"),))
        right = ((P("sum"), P("sum"), R), (P("sum"),))
        for world_size in (2, 3, 4):
            for name, (op, args) in cases.items():
                with self.subTest(name, world_size=world_size):
                    self.assertIs(judge(op, args, wrong, world_size), False)
                    self.assertIs(judge(op, args, right, world_size), True)

    def test_wrong_rules_of_cancelling_float64_and_complex128_values(self):
        # Float64 and complex128 terms of +-1e8..2e10 that cancel: the float64
        # recheck compared within 4 ulps of the op on the absolute per-rank values
        # (sum, add, sub, convolution), the exact check gave up for the whole tensor
        # on one nan or a beta above Veltkamp's splitter, and complex inputs had no
        # recheck. The recheck now compares within main's tolerance; the exact
        # evaluation only accepts a contraction that holds so.
        f64, c128, nan = torch.float64, torch.complex128, float("nan")

        def cancelling(n, big, small):
            g = torch.Generator().manual_seed(0)
            x = (torch.rand(n, generator=g, dtype=f64) + 0.5) * big
            x[1::2] = -x[0::2]
            x[0] += small
            return x

        P, R = Partial, Replicate()
        s, avg = (P("sum"),), (P("avg"),)
        sums = cancelling(1024, 1e8, 1e-4)
        a = torch.full((8,), 2e10, dtype=f64) * (1 + torch.arange(8, dtype=f64) / 16)
        rows = cancelling(512, 1e9, 1e-3).reshape(2, 256)
        ones = torch.ones(256, 2, dtype=f64)
        bias = torch.full((2, 2), 1e-4, dtype=f64)
        nan_bias = bias.clone()
        nan_bias[1, 1] = nan
        nan_b = torch.ones(256, 3, dtype=f64)
        nan_b[9, 2] = nan
        conv = (rows.t().reshape(1, 256, 2), torch.ones(2, 256, 1, dtype=f64))
        conv_args = (*conv, bias[0], [1], [0], [1], False, [0], 1)
        cases = {
            # name: (op, args, kwargs, wrong rule, right rule or None)
            "sum": (aten.sum.default, (sums,), {}, (s, avg), (s, s)),
            "add": (
                aten.add.Tensor,
                (a, -a + 3e-5),
                {},
                ((*s, *s), avg),
                ((*s, *s), s),
            ),
            "sub": (aten.sub.Tensor, (a, a - 3e-5), {}, ((*s, *s), avg), ((*s, *s), s)),
            "convolution, Replicate bias": (
                aten.convolution.default,
                conv_args,
                {},
                ((*s, R, R), s),
                ((*s, R, *s), s),
            ),
            "addmm, a nan in the bias": (
                aten.addmm.default,
                (nan_bias, rows, ones),
                {},
                ((R, *s, R), s),
                ((*s, *s, R), s),
            ),
            "mm, a nan in another column": (
                aten.mm.default,
                (cancelling(512, 1e9, 1e-4).reshape(2, 256), nan_b),
                {},
                ((*s, R), avg),
                ((*s, R), s),
            ),
            "addmm, beta=1e301": (
                aten.addmm.default,
                (torch.full((2, 2), 1e-305, dtype=f64), rows, ones),
                {"beta": 1e301},
                ((R, *s, R), s),
                None,
            ),
            "complex128 addmm": (
                aten.addmm.default,
                (bias.to(c128), rows.to(c128), ones.to(c128)),
                {},
                ((R, *s, R), s),
                ((*s, *s, R), s),
            ),
            "complex128 sum": (
                aten.sum.default,
                (sums.to(c128),),
                {},
                (s, avg),
                (s, s),
            ),
        }
        for world_size in (2, 3):
            for name, (op, args, kwargs, wrong, right) in cases.items():
                with self.subTest(name, world_size=world_size):
                    self.assertIs(judge(op, args, wrong, world_size, kwargs), False)
                    if right is not None:
                        self.assertIs(judge(op, args, right, world_size, kwargs), True)

    def test_exact_contraction(self):
        # The exact evaluation agrees with rational arithmetic, on pieces whose
        # terms cancel, with alpha, beta and a P(avg) divisor.
        g = torch.Generator().manual_seed(0)
        f64 = torch.float64
        pieces = [torch.randn(3, 8, generator=g, dtype=f64) * 1e12 for _ in range(2)]
        pieces.append(-pieces[0] - pieces[1] + torch.rand(3, 8, generator=g, dtype=f64))
        b = torch.randn(8, 2, generator=g, dtype=f64)
        bias = torch.randn(2, generator=g, dtype=f64) * 1e-3
        args = (
            sv._Expansion([bias]),
            sv._Expansion(pieces, 3),
            sv._Expansion([b]),
        )
        kwargs = {"beta": 0.3, "alpha": -1.7}
        hi, lo, bound = sv._exact_contraction(aten.addmm.default, args, kwargs)

        def exact(i, j):
            rows = [sum(Fraction(p[i, k].item()) for p in pieces) / 3 for k in range(8)]
            product = sum(r * Fraction(b[k, j].item()) for k, r in enumerate(rows))
            return Fraction(0.3) * Fraction(bias[j].item()) + Fraction(-1.7) * product

        for i in range(3):
            for j in range(2):
                value = Fraction(hi[i, j].item()) + Fraction(lo[i, j].item())
                self.assertLessEqual(abs(value - exact(i, j)), bound[i, j].item())
                self.assertLess(bound[i, j].item(), 1e-12)

    def test_positional_dtype_is_upcast(self):
        # The recheck ran a positional dtype=torch.float32 in float32, and the
        # multilinear band of the cancelling sum let a wrong P(sum) -> P(avg) pass.
        g = torch.Generator().manual_seed(0)
        v = torch.randn(64, generator=g, dtype=torch.float64) * 3
        v -= v.mean()
        v[0] += 2e-4
        args = (v.float(), torch.float32)
        op = torch.ops.strategy_validation_test.sum.default
        P = Partial
        for world_size in (2, 3):
            with self.subTest(world_size=world_size):
                wrong = ((P("sum"),), (P("avg"),))
                right = ((P("sum"),), (P("sum"),))
                self.assertIs(judge(op, args, wrong, world_size), False)
                self.assertIs(judge(op, args, right, world_size), True)

    def test_contractions_within_rounding(self):
        # Right rules whose per-rank values cancel: accepted in both checks.
        g = torch.Generator().manual_seed(0)
        a, b = (
            torch.randn(4, 8, 8, generator=g) * 1e3,
            torch.randn(4, 8, 8, generator=g),
        )
        bias = torch.randn(8, 8, generator=g) * 0.1
        m1, m2 = torch.randn(8, 8, generator=g) * 1e6, torch.randn(8, 8, generator=g)
        x = torch.randn(4, 6, generator=g).to(torch.bfloat16)
        P, R = Partial, Replicate()
        for world_size in (2, 3):
            with self.subTest(world_size=world_size):
                rule = ((R, P("sum")), (P("sum"),))
                self.assertIs(judge(aten.bmm.default, (a, b), rule, world_size), True)
                rule = ((P("sum"), P("sum"), R), (P("sum"),))
                self.assertIs(
                    judge(aten.addmm.default, (bias, m1, m2), rule, world_size), True
                )
                rule = ((P("avg"),), (P("avg"),))
                self.assertIs(
                    judge(aten.sum.dim_IntList, (x, [1]), rule, world_size), True
                )
                rule = ((P("sum"),), (P("sum"),))
                self.assertTrue(
                    judge(
                        aten._to_copy.default,
                        (x,),
                        rule,
                        world_size,
                        {"dtype": torch.float32},
                    )
                )


class CancellingPiecesTest(TestCase):
    """grid_sampler is linear in its input for a fixed grid, so P(sum), R -> P(sum)
    and P(avg), R -> P(avg) are right; its interpolation mixes neighbouring pieces
    of opposite sign, so in bfloat16 the per-rank outputs cancel far below the
    rounding of their terms and failed the band. The same pieces in float64 decide;
    a wrong rule stays rejected."""

    def test_grid_sampler_bfloat16(self):
        g = torch.Generator().manual_seed(0)
        P, R = Partial, Replicate()

        def u(*shape):
            return (torch.rand(*shape, generator=g) * 2.2 - 1.1).to(torch.bfloat16)

        x2, grid2 = torch.randn(2, 3, 4, 24, generator=g), u(2, 15, 12, 2)
        x3, grid3 = torch.randn(2, 3, 4, 8, 8, generator=g), u(2, 6, 5, 4, 3)
        x2, x3 = x2.to(torch.bfloat16), x3.to(torch.bfloat16)
        cases = {
            "2d bilinear": (aten.grid_sampler_2d.default, (x2, grid2, 0, 0, False)),
            "2d bicubic": (aten.grid_sampler_2d.default, (x2, grid2, 2, 1, True)),
            "3d bilinear": (aten.grid_sampler_3d.default, (x3, grid3, 0, 0, False)),
        }
        right = [((P(op), R), (P(op),)) for op in ("sum", "avg")]
        wrong = [
            ((P("sum"), R), (P("avg"),)),
            ((P("avg"), R), (P("sum"),)),
            ((P("sum"), R), (R,)),
            ((R, P("sum")), (P("sum"),)),  # not linear in the grid
            ((P("max"), R), (P("max"),)),  # bilinear weights mix the ranks
        ]
        for world_size in (2, 3):
            for name, (op, args) in cases.items():
                for rule in right:
                    with self.subTest(name, rule=rule, world_size=world_size):
                        self.assertIs(judge(op, args, rule, world_size), True)
                for rule in wrong:
                    if rule[0][0] == P("max") and name == "2d bicubic":
                        continue
                    with self.subTest(name, rule=rule, world_size=world_size):
                        self.assertIs(judge(op, args, rule, world_size), False)


class StockSplitRecheckTest(TestCase):
    """The float64 recheck splits P(sum)/P(avg) inputs as main does (offsets of
    |x| + 1): a wrong nonlinear rule's error on small values, or a clipping bound
    that only main's per-rank values reach, is not hidden by pieces scaled to the
    data; a _NormPartial input keeps its norm split."""

    def test_wrong_nonlinear_rules_on_small_values(self):
        g = torch.Generator().manual_seed(0)
        P, R = Partial, Replicate()
        for dtype in (torch.float32, torch.float64):

            def u(scale):
                return ((torch.rand(6, 6, generator=g) * 2 - 1) * scale).to(dtype)

            x, y = u(1e-3), u(1e-3)
            mid = u(9.0)
            mid[0, 0] = 9.0
            cases = {
                "mul": (
                    aten.mul.Tensor,
                    (x, y),
                    {},
                    (P("sum"), P("sum")),
                    (P("sum"), R),
                ),
                "mm": (
                    aten.mm.default,
                    (x, y),
                    {},
                    (P("sum"), P("sum")),
                    (P("sum"), R),
                ),
                "sin": (aten.sin.default, (u(1e-2),), {}, (P("sum"),), (Shard(0),)),
                "silu": (aten.silu.default, (u(1e-3),), {}, (P("avg"),), (Shard(0),)),
                "abs": (aten.abs.default, (u(1e-6),), {}, (P("sum"),), (Shard(0),)),
                "clamp 15": (
                    aten.clamp.default,
                    (mid, -15.0, 15.0),
                    {},
                    (P("sum"),),
                    (Shard(1),),
                ),
            }
            for world_size in (2, 3):
                for name, (op, args, kwargs, wrong_in, right_in) in cases.items():
                    wrong = (wrong_in, (wrong_in[0],))
                    right_out = (
                        right_in[0] if isinstance(right_in[0], Shard) else P("sum")
                    )
                    right = (right_in, (right_out,))
                    with self.subTest(name, dtype=dtype, world_size=world_size):
                        self.assertIs(judge(op, args, wrong, world_size, kwargs), False)
                        self.assertIs(judge(op, args, right, world_size, kwargs), True)

    def test_norm_partial_rules_keep_the_norm_split(self):
        g = torch.Generator().manual_seed(0)
        x = torch.rand(4, 4, generator=g) + 0.5  # non-negative, as a norm is
        for p in (1, 3):
            rule = ((_NormPartial(p),), (_NormPartial(p),))
            for world_size in (2, 3):
                with self.subTest(p=p, world_size=world_size):
                    self.assertIs(
                        judge(aten.clone.default, (x,), rule, world_size), True
                    )
                    self.assertIs(
                        judge(aten.mul.Tensor, (x, 2.0), rule, world_size), True
                    )


class SecondChanceLimitsTest(TestCase):
    """A combination that fails the band is judged again in float64 only where the
    float64 run is the op on the same values: not for a view as another dtype (the
    identity in float64), a cast, a value the dtype overflows, or an in-place op
    (whose float64 run must not change the sample)."""

    def test_nan_to_num_near_the_dtype_maximum_rejected(self):
        # nan_to_num replaces inf by the dtype's largest value: fp16 pieces
        # 60000 + 60000 hold inf, which becomes 65504, while the pieces'
        # nan_to_num sum to inf; in float64 the replacement, 1.8e308, hides it
        P = Partial
        x = torch.tensor([60000.0, -60000.0, 3.0, 65504.0], dtype=torch.float16)
        for kwargs in ({}, {"posinf": None}):
            for op in ("sum",):
                rule = ((P(op),), (P(op),))
                with self.subTest(kwargs=kwargs, rule=rule):
                    self.assertIs(
                        judge(aten.nan_to_num.default, (x,), rule, 2, kwargs), False
                    )

    def test_view_dtype_partial_rules_rejected(self):
        # Stock DTensor's view.dtype passes a Partial through; a bfloat16 value
        # read as float16 is not the sum of its pieces read so.
        g = torch.Generator().manual_seed(0)
        P = Partial
        cases = {
            "bf16->fp16": (torch.bfloat16, torch.float16),
            "fp16->bf16": (torch.float16, torch.bfloat16),
            "bf16->complex32": (torch.bfloat16, torch.complex32),
        }
        for name, (src, dst) in cases.items():
            x = (torch.randn(4, 4, generator=g) * 0.5).to(src)
            args = (x, dst)
            reduce_ops = (
                ("sum",) if dst == torch.complex32 else ("sum", "avg", "product")
            )
            for world_size in (2, 3):
                for op in reduce_ops:
                    rule = ((P(op),), (P(op),))
                    with self.subTest(name, rule=rule, world_size=world_size):
                        self.assertIs(
                            judge(aten.view.dtype, args, rule, world_size), False
                        )
            rule = ((Shard(0),), (Shard(0),))
            with self.subTest(name, rule=rule):
                self.assertIs(judge(aten.view.dtype, args, rule, 2), True)

    def test_overflow_in_the_dtype_rejected(self):
        # The pieces of |x| ~ 2e4 (float16) or 3e4 (cast to float16) overflow to
        # inf where the value they reduce to is finite.
        g = torch.Generator().manual_seed(0)
        P, R = Partial, Replicate()
        x = (torch.randn(4, 4, generator=g) * 2e4).to(torch.float16)
        three = torch.full((4, 4), 3.0, dtype=torch.float16)
        y = torch.randn(4, 4, generator=g) * 3e4
        rule = ((P("sum"), R), (P("sum"),))
        cast = ((P("sum"),), (P("sum"),))
        for world_size in (2, 3):
            with self.subTest("mul", world_size=world_size):
                self.assertIs(
                    judge(aten.mul.Tensor, (x, three), rule, world_size), False
                )
            for src in (torch.float32, torch.bfloat16):
                with self.subTest("_to_copy", src=src, world_size=world_size):
                    self.assertIs(
                        judge(
                            aten._to_copy.default,
                            (y.to(src),),
                            cast,
                            world_size,
                            {"dtype": torch.float16},
                        ),
                        False,
                    )

    def test_in_place_sample_unchanged(self):
        # A wrong in-place rule is rejected without running the op on the
        # sample's own tensors: the right rules validated after it on the same
        # sample stay correct.
        P, R = Partial, Replicate()
        self_ = torch.arange(1.0, 5.0, dtype=torch.float64)
        other = torch.full((4,), 0.5, dtype=torch.float64)
        for op in (aten.add_.Tensor, aten.mul_.Tensor):
            args = (self_.clone(), other.clone())
            truth = sv._to_ground_truth(op(self_.clone(), other.clone()))
            rules = [
                ((R, P("sum")), (P("sum"),)),
                ((Shard(0), Shard(0)), (Shard(0),)),
                ((R, R), (R,)),
            ]
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
            )
            try:
                with LocalTensorMode(frozenset(range(WORLD_SIZE))):
                    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
                    valid = [
                        sv.validate_aten_combination(
                            op, args, {}, truth, rule, WORLD_SIZE, mesh
                        )[0]
                        for rule in rules
                    ]
            finally:
                dist.destroy_process_group()
            with self.subTest(op=str(op)):
                self.assertEqual(args[0], self_)
                self.assertEqual(args[1], other)
                # add_ with a P(sum) other adds self on every rank: wrong.
                first = op is aten.mul_.Tensor
                self.assertEqual(valid, [first, True, True])


def assert_verdicts(test: TestCase, wrong: list, right: list) -> None:
    """Each (name, op, args, kwargs, rule) row of ``wrong`` rejected and of ``right``
    accepted, on 2 and 3 ranks."""
    for world_size in (2, 3):
        for expected, rows in ((False, wrong), (True, right)):
            for name, op, args, kwargs, rule in rows:
                with test.subTest(name, world_size=world_size, right=expected):
                    test.assertIs(judge(op, args, rule, world_size, kwargs), expected)


class HalfPrecisionConversionTest(TestCase):
    """Review rev25n N1: float16 <-> bfloat16 conversions of a P(sum)/P(avg)/
    P(product) passed, where stock's validator rejects them. float16 -> bfloat16
    is only 8x coarser, so each piece's bfloat16 rounding stayed within the band's
    4 float16 ulps of the per-rank magnitude; bfloat16 -> float16 is finer but
    narrower in range; the float64 recheck made the cast the identity. Witnesses
    (2 ranks): float16 pieces [100.3125, -100] cast to bfloat16 read 0.5, truth
    0.3125; bfloat16 P(product) pieces [2**17, 3.5 * 2**-17] cast to float16 read
    inf, truth 3.5. Widening casts (bfloat16 or float16 to float32, float16 to
    complex32) stay accepted."""

    def test_half_precision_conversions(self):
        P, R = Partial, Replicate()
        g = torch.Generator().manual_seed(17)
        b = (torch.rand(4, 6, generator=g) * 18 - 9).to(torch.bfloat16)
        h = (torch.rand(4, 6, generator=g) * 18 - 9).to(torch.float16)
        f16, bf16 = torch.float16, torch.bfloat16
        wrong, right = [], []
        for op in ("sum", "avg", "product"):
            one = ((P(op),), (P(op),))
            wrong += [
                (
                    f"bf16->f16 P({op})",
                    aten._to_copy.default,
                    (b,),
                    {"dtype": f16},
                    one,
                ),
                (
                    f"f16->bf16 P({op})",
                    aten._to_copy.default,
                    (h,),
                    {"dtype": bf16},
                    one,
                ),
            ]
        one = ((P("sum"),), (P("sum"),))
        wrong += [
            ("bf16 to.dtype f16", aten.to.dtype, (b, f16), {}, one),
            (
                "bf16 sum.dim_IntList(dtype=f16)",
                aten.sum.dim_IntList,
                (b, [1]),
                {"dtype": f16},
                one,
            ),
            (
                "bf16 cumsum(dtype=f16)",
                aten.cumsum.default,
                (b, 1),
                {"dtype": f16},
                one,
            ),
            (
                "f16 sum.dim_IntList(dtype=bf16)",
                aten.sum.dim_IntList,
                (h, [1]),
                {"dtype": bf16},
                one,
            ),
            (
                "copy_(bf16 R, f16 P(sum))",
                aten.copy_.default,
                (torch.zeros(4, 6, dtype=bf16), h),
                {},
                ((R, P("sum")), (P("sum"),)),
            ),
        ]
        for source, name in ((b, "bf16"), (h, "f16")):
            for op in ("sum", "avg"):
                right.append(
                    (
                        f"{name}->f32 P({op})",
                        aten._to_copy.default,
                        (source,),
                        {"dtype": torch.float32},
                        ((P(op),), (P(op),)),
                    )
                )
            right += [
                (
                    f"{name} sum.dim_IntList(dtype=f32) P(sum)",
                    aten.sum.dim_IntList,
                    (source, [1]),
                    {"dtype": torch.float32},
                    one,
                ),
                (
                    f"copy_(f32 R, {name} P(sum))",
                    aten.copy_.default,
                    (torch.zeros(4, 6), source),
                    {},
                    ((R, P("sum")), (P("sum"),)),
                ),
                (
                    f"{name} mul(P(sum), f32 R)",
                    aten.mul.Tensor,
                    (source, torch.rand(4, 6, generator=g)),
                    {},
                    ((P("sum"), R), (P("sum"),)),
                ),
            ]
        right += [
            (
                "bf16->f16 P(max)",
                aten._to_copy.default,
                (b,),
                {"dtype": f16},
                ((P("max"),), (P("max"),)),
            ),
            # Review rev25o: complex32 holds both parts of a float16 piece exactly.
            (
                "f16->c32 P(sum)",
                aten._to_copy.default,
                (h,),
                {"dtype": torch.complex32},
                one,
            ),
        ]
        assert_verdicts(self, wrong, right)


if __name__ == "__main__":
    run_tests()
