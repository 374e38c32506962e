# Owner(s): ["module: autograd"]
"""clone_obey_contract from the overlay's grad_layout_contract.h, without rebuilding torch.

A header change cannot be activated on a wheel (libtorch has its own inline copy), so this
test compiles the overlay's header into a small extension and compares it with the stock
function that the wheel's AccumulateGrad runs (a leaf backward), on many plain layouts and
on sparse leaves; compares direct calls with the same extension built from the stock
header where the stock path must be taken: plain tensors (results, grad_fn and dispatched
ops), non-strided layouts (sparse, mkldnn, nested, jagged), symbolic sizes, and tensor
subclasses under grad mode or with a gradient of another shape or device; checks that a
tensor subclass without grad mode sees one aten.clone(memory_format=...); and checks the
DTensor case the patch is for: a Partial, non-contiguous gradient of a Replicate parameter
stays Partial with no collective, even with DTensor's new_empty_strided rule reverted to
Replicate.
"""

import hashlib
import itertools
import re
import shutil
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    distribute_tensor,
)
from torch.distributed.tensor.debug import CommDebugMode, _clear_sharding_prop_cache
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorContinuousTestBase,
    create_local_tensor_test_class,
    LocalDTensorContinuousTestBase,
    map_local_for_rank,
)
from torch.testing._internal.logging_tensor import LoggingTensor, capture_logs
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "torch_overlay"
HEADER = "torch/csrc/autograd/utils/grad_layout_contract.h"
SOURCE = Path(__file__).with_suffix(".cpp")
# In this repo the header comes from the overlay; in a PyTorch checkout, from the source tree.
INCLUDE_ROOT = OVERLAY if (OVERLAY / HEADER).exists() else REPO
aten = torch.ops.aten


def _load_extension(stock):
    from torch.utils import cpp_extension

    if stock:
        header = Path(torch.__file__).parent / "include" / HEADER
        # Torch's own include path only, and no exact_memory_format (not in that header).
        include_paths, defines, prefix = (
            [],
            ["-DCLONE_OBEY_CONTRACT_STOCK_HEADER"],
            "stock_",
        )
    else:
        header = INCLUDE_ROOT / HEADER
        if not header.exists():
            raise RuntimeError(f"{header} is missing: run `torch-overlay sync` first")
        # -I paths come before torch's own include paths, so this header wins.
        include_paths, defines, prefix = [str(INCLUDE_ROOT)], [], ""
    digest = hashlib.sha256(header.read_bytes() + SOURCE.read_bytes()).hexdigest()[:12]
    name = f"clone_obey_contract_{prefix}{digest}"
    build_dir = REPO / "build" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=name,
        sources=[str(SOURCE)],
        extra_include_paths=include_paths,
        # Hidden inline symbols: calls bind to this library's own copy of the header.
        extra_cflags=[
            "-O1",
            "-fvisibility=hidden",
            "-fvisibility-inlines-hidden",
            *defines,
        ],
        build_directory=str(build_dir),
        verbose=False,
    )


@cache
def overlay_extension():
    """Build (once, cached under build/) and load the extension with the overlay header."""
    return _load_extension(stock=False)


@cache
def stock_extension():
    """The same extension built with the installed torch's (stock) header."""
    return _load_extension(stock=True)


def require_extension(test, stock=False):
    if shutil.which("c++") is None:
        test.skipTest("no C++ compiler to build the overlay header into an extension")
    return stock_extension() if stock else overlay_extension()


def variables(shape, dtype):
    """Leaf layouts: standard formats, permuted, odd size-1 strides, non-dense, overlapping."""
    base = torch.randn(shape, dtype=dtype)
    yield "contiguous", base
    if len(shape) == 4:
        yield "channels_last", base.to(memory_format=torch.channels_last)
    if len(shape) == 5:
        yield "channels_last_3d", base.to(memory_format=torch.channels_last_3d)
    if len(shape) >= 2:
        yield "permuted", base.transpose(0, -1).contiguous().transpose(0, -1)
    if 1 in shape:
        odd = [97 if s == 1 else st for s, st in zip(shape, base.stride(), strict=True)]
        yield (
            "size1_odd_stride",
            torch.empty_strided(shape, odd, dtype=dtype).copy_(base),
        )
    wide = torch.randn(*shape[:-1], shape[-1] * 2, dtype=dtype)
    yield "non_dense", wide[..., ::2]
    yield "overlapping", torch.randn(1, dtype=dtype).expand(shape)


def new_grads(shape, dtype):
    """Incoming gradient layouts, conj/neg views and zero-stride expands included."""
    g = torch.randn(shape, dtype=dtype)
    yield "contiguous", g
    if len(shape) >= 2:
        yield "transposed", g.transpose(0, -1).contiguous().transpose(0, -1)
    if len(shape) == 4:
        yield "channels_last", g.to(memory_format=torch.channels_last)
    yield "expanded", torch.randn((1, *shape[1:]), dtype=dtype).expand(shape)
    wide = torch.randn(*shape[:-1], shape[-1] * 2, dtype=dtype)
    yield "non_dense", wide[..., ::2]
    if dtype.is_complex:
        yield "conj_view", torch.randn(shape, dtype=dtype).conj()
    else:
        yield (
            "neg_view",
            torch.randn(shape, dtype=torch.complex128).conj().imag.to(dtype),
        )


SHAPES = [(5,), (3, 4), (2, 1, 3), (1, 3, 1, 4), (2, 3, 4, 5), (2, 3, 2, 2, 3), (0, 3)]
DTYPES = [torch.float32, torch.float64, torch.complex64]
SPARSE_LAYOUTS = {
    "sparse_coo": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.to_sparse_csr(),
    "sparse_csc": lambda t: t.to_sparse_csc(),
    "sparse_bsr": lambda t: t.to_sparse_bsr((2, 2)),
    "sparse_bsc": lambda t: t.to_sparse_bsc((2, 2)),
}


def any_layouts(shape):
    """Strided, sparse (COO and compressed), mkldnn, nested and jagged float32 tensors."""
    dense = torch.randn(shape)
    dense[0] = 0  # a few explicit zeros: sparse tensors with some unspecified elements
    yield "contiguous", dense
    yield "transposed", dense.t().contiguous().t()
    for name, to_layout in SPARSE_LAYOUTS.items():
        yield name, to_layout(dense)
    if torch.backends.mkldnn.is_available():
        yield "mkldnn", dense.to_mkldnn()
    yield "nested", torch.nested.nested_tensor([dense, dense * 2])
    yield (
        "jagged",
        torch.nested.nested_tensor([dense, dense[1:] * 2], layout=torch.jagged),
    )


def graph_desc(fn):
    """test_autograd.py's graph_desc: grad_fn names down to the leaves."""
    if fn is None:
        return "None"
    children = ", ".join(graph_desc(next_fn) for next_fn, _ in fn.next_functions)
    return f"{type(fn).__name__}({children})"


def logged_ops(logs):
    """Op names and memory_format kwargs from LoggingTensor's capture_logs() lines."""
    ops = []
    for line in logs:
        name = re.search(r"aten\.(\w+)\.", line).group(1)
        fmt = re.search(r"memory_format=([\w.]+)", line)
        ops.append(f"{name}({fmt.group(1)})" if fmt else name)
    return ops


class RecordOps(TorchDispatchMode):
    """Names of the aten ops dispatched under it (plain tensors too)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class IgnoresMemoryFormat(torch.Tensor):
    """Wrapper subclass whose clone keeps the layout it has (ignores memory_format)."""

    ops: list[str] = []

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device
        )

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        cls.ops.append(func.overloadpacket.__name__)
        kwargs = dict(kwargs or {})
        if func is aten.clone.default:
            kwargs["memory_format"] = torch.preserve_format
        args, kwargs = tree_map_only(cls, lambda t: t.elem, (args, kwargs))
        out = func(*args, **kwargs)
        if func is aten.copy_.default:
            return cls(out)
        return tree_map_only(torch.Tensor, cls, out)


def outcome(fn, *args, **kwargs):
    """fn's result, or the first line of the error it raises (same path: same error)."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0]}"


class TestCloneObeyContract(TestCase):
    def test_compiled_from_the_overlay_header(self):
        ext = require_extension(self)
        # exact_memory_format exists only in the overlay's header.
        self.assertEqual(ext.exact_memory_format(torch.empty(2, 3)), "Contiguous")
        self.assertEqual(ext.exact_memory_format(torch.empty(2, 3).t()), "none")
        cl = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        self.assertEqual(ext.exact_memory_format(cl), "ChannelsLast")

    def _check_same_as_stock(self, variable, new_grad, create_graph):
        ext = require_extension(self)
        leaf = variable.detach().requires_grad_()
        grad = new_grad.detach().requires_grad_(create_graph)
        torch.autograd.backward(leaf, grad, create_graph=create_graph)
        stock = leaf.grad
        patched = ext.accumulate_grad(leaf, grad, create_graph)
        self.assertEqual(patched.shape, stock.shape)
        self.assertEqual(patched.stride(), stock.stride())
        self.assertEqual(patched.dtype, stock.dtype)
        self.assertEqual(
            (patched.is_conj(), patched.is_neg()), (stock.is_conj(), stock.is_neg())
        )
        self.assertTrue(torch.equal(patched, stock))
        self.assertEqual(patched.requires_grad, stock.requires_grad)
        self.assertEqual(graph_desc(patched.grad_fn), graph_desc(stock.grad_fn))
        if create_graph and stock.numel():
            weight = torch.randn_like(stock)
            (expected,) = torch.autograd.grad((stock * weight).real.sum(), grad)
            (actual,) = torch.autograd.grad((patched * weight).real.sum(), grad)
            self.assertEqual(actual, expected, atol=0, rtol=0)

    def _assert_same_tensor(self, actual, expected):
        self.assertEqual(
            (actual.layout, actual.is_nested, actual.dtype, actual.requires_grad),
            (
                expected.layout,
                expected.is_nested,
                expected.dtype,
                expected.requires_grad,
            ),
        )
        if actual.layout == torch.jagged:
            self.assertEqual(actual.offsets(), expected.offsets())
            actual, expected = actual.values(), expected.values()
        elif actual.is_nested:
            self.assertEqual(
                actual._nested_tensor_size(), expected._nested_tensor_size()
            )
            self.assertEqual(
                actual._nested_tensor_strides(), expected._nested_tensor_strides()
            )
            self.assertTrue(
                torch.equal(actual.to_padded_tensor(0), expected.to_padded_tensor(0))
            )
            return
        self.assertEqual(actual.shape, expected.shape)
        if actual.layout == torch.strided:
            self.assertEqual(actual.stride(), expected.stride())
            self.assertTrue(torch.equal(actual, expected))
        else:
            self.assertTrue(
                torch.equal(actual.detach().to_dense(), expected.detach().to_dense())
            )

    def test_sparse_leaves_match_the_wheel(self):
        # AccumulateGrad of a strided (or same-layout sparse) gradient into a sparse leaf.
        # A strided one, and a CSC/BSR/BSC one (AccumulateGrad tests is_sparse_csr() only),
        # reaches clone_obey_contract with a variable that has no strides. The wheel accepts
        # every strided gradient; where it raises (CSC/BSR/BSC), so must the overlay.
        ext = require_extension(self)
        torch.manual_seed(0)
        strided_grads = len(list(new_grads((4, 6), torch.float32)))
        accepted = 0
        for (v_name, to_layout), create_graph in itertools.product(
            SPARSE_LAYOUTS.items(), [False, True]
        ):
            variable = to_layout(torch.randn(4, 6))
            grads = dict(new_grads((4, 6), torch.float32))
            grads["same_sparse_layout"] = to_layout(torch.randn(4, 6))
            for g_name, new_grad in grads.items():
                with self.subTest(
                    variable=v_name, grad=g_name, create_graph=create_graph
                ):
                    leaf = variable.detach().requires_grad_()
                    grad = new_grad.detach().requires_grad_(create_graph)
                    _, expected_error = outcome(
                        torch.autograd.backward, leaf, grad, create_graph=create_graph
                    )
                    actual, actual_error = outcome(
                        ext.accumulate_grad, leaf, grad, create_graph
                    )
                    self.assertEqual(actual_error, expected_error)
                    if expected_error is None:
                        self._assert_same_tensor(actual, leaf.grad)
                        accepted += new_grad.layout == torch.strided
        self.assertEqual(accepted, len(SPARSE_LAYOUTS) * 2 * strided_grads)

    def test_non_strided_layouts_take_the_stock_path(self):
        # Direct calls, also with a non-strided new_grad (AccumulateGrad clones those
        # itself): the result, or the error, of the header the wheel was built with.
        ext = require_extension(self)
        stock = require_extension(self, stock=True)
        self.assertFalse(hasattr(stock, "exact_memory_format"))
        torch.manual_seed(0)
        for (v_name, variable), (g_name, new_grad), create_graph in itertools.product(
            list(any_layouts((4, 6))), list(any_layouts((4, 6))), [False, True]
        ):
            if v_name in ("contiguous", "transposed") and g_name in (
                "contiguous",
                "transposed",
            ):
                continue  # strided: test_plain_tensors_match_the_stock_function_on_every_layout
            with self.subTest(variable=v_name, grad=g_name, create_graph=create_graph):
                grad = new_grad.detach().requires_grad_(create_graph)
                with torch.autograd.set_grad_enabled(create_graph):
                    expected, expected_error = outcome(
                        stock.clone_obey_contract, grad, variable
                    )
                    actual, actual_error = outcome(
                        ext.clone_obey_contract, grad, variable
                    )
                self.assertEqual(actual_error, expected_error)
                if expected_error is None:
                    self._assert_same_tensor(actual, expected)
                if v_name not in ("contiguous", "transposed"):
                    self.assertEqual(
                        outcome(ext.exact_memory_format, variable), ("none", None)
                    )

    def test_symbolic_sizes_take_the_stock_path(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import (
            DimDynamic,
            ShapeEnv,
            StatelessSymbolicContext,
        )

        ext = require_extension(self)
        stock = require_extension(self, stock=True)
        mode = FakeTensorMode(shape_env=ShapeEnv())
        dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
        variable = mode.from_tensor(torch.randn(3, 4), symbolic_context=dynamic)
        grad = mode.from_tensor(torch.randn(4, 3), symbolic_context=dynamic).t()
        with mode:
            self.assertEqual(ext.exact_memory_format(variable), "none")
            expected = stock.clone_obey_contract(grad, variable)
            actual = ext.clone_obey_contract(grad, variable)
        self.assertEqual(str(actual.shape), str(expected.shape))
        self.assertEqual(str(actual.stride()), str(expected.stride()))

    def test_plain_tensors_match_the_stock_function_on_every_layout(self):
        require_extension(self)
        torch.manual_seed(0)
        cases = 0
        for shape, dtype in itertools.product(SHAPES, DTYPES):
            combos = itertools.product(
                variables(shape, dtype), new_grads(shape, dtype), [False, True]
            )
            for (v_name, variable), (g_name, new_grad), create_graph in combos:
                with self.subTest(shape=shape, dtype=dtype, variable=v_name, grad=g_name,
                                  create_graph=create_graph):  # fmt: skip
                    self._check_same_as_stock(variable, new_grad, create_graph)
                    cases += 1
        self.assertGreater(cases, 500)

    def test_plain_tensors_take_the_stock_path(self):
        # Direct calls, with and without grad mode: the stock header's result, history and
        # dispatched ops (seen by a dispatch mode, which leaves the tensors plain).
        ext = require_extension(self)
        stock = require_extension(self, stock=True)
        torch.manual_seed(0)
        for shape, dtype in itertools.product(
            [(3, 4), (1, 3, 1, 4), (2, 3, 4, 5), (2, 3, 2, 2, 3)],
            [torch.float32, torch.complex64],
        ):
            for (v_name, variable), (g_name, new_grad), grad_mode in itertools.product(
                list(variables(shape, dtype)),
                list(new_grads(shape, dtype)),
                [False, True],
            ):
                with self.subTest(shape=shape, dtype=dtype, variable=v_name, grad=g_name,
                                  grad_mode=grad_mode):  # fmt: skip
                    grad = new_grad.detach().requires_grad_(grad_mode)
                    with torch.autograd.set_grad_enabled(grad_mode):
                        with RecordOps() as expected_ops:
                            expected = stock.clone_obey_contract(grad, variable)
                        with RecordOps() as actual_ops:
                            actual = ext.clone_obey_contract(grad, variable)
                    self.assertEqual(actual_ops.ops, expected_ops.ops)
                    self._assert_same_tensor(actual, expected)
                    self.assertEqual((actual.is_conj(), actual.is_neg()),
                                     (expected.is_conj(), expected.is_neg()))  # fmt: skip
                    self.assertEqual(
                        graph_desc(actual.grad_fn), graph_desc(expected.grad_fn)
                    )

    def test_create_graph_history_matches_test_autograd(self):
        # test_autograd.py's TestAutograd.test_function and test_once_differentiable: the
        # grad_fn of x.grad after backward(create_graph=True), here with the gradient that
        # reaches AccumulateGrad(x) accumulated by the extension.
        from torch.autograd import Function
        from torch.autograd.function import once_differentiable

        ext = require_extension(self)

        class MyFunction(Function):
            @staticmethod
            def forward(ctx, tensor1, pyscalar, tensor2):
                ctx.pyscalar = pyscalar
                ctx.save_for_backward(tensor1, tensor2)
                return tensor1 + pyscalar * tensor2 + tensor1 * tensor2

            @staticmethod
            def backward(ctx, grad_output):
                var1, var2 = ctx.saved_tensors
                return (
                    grad_output + grad_output * var2,
                    None,
                    (grad_output * ctx.pyscalar + grad_output * var1),
                )

        class OnceDifferentiable(MyFunction):
            backward = staticmethod(once_differentiable(MyFunction.backward))

        for fn in (MyFunction, OnceDifferentiable):
            with self.subTest(fn=fn.__name__):
                x = torch.randn(5, 5, dtype=torch.double, requires_grad=True)
                y = torch.randn(5, 5, dtype=torch.double, requires_grad=True)
                go = torch.ones((), dtype=torch.double, requires_grad=True)
                fn.apply(x, 2, y).sum().backward(go, create_graph=True)
                gx, _ = torch.autograd.grad(
                    fn.apply(x, 2, y).sum(), (x, y), go, create_graph=True
                )
                actual = graph_desc(ext.accumulate_grad(x, gx, True).grad_fn)
                self.assertEqual(actual, graph_desc(x.grad.grad_fn))
                self.assertTrue(actual.startswith("CopyBackwards(None, "), actual)
                # The string test_once_differentiable asserts.
                if fn is OnceDifferentiable:
                    self.assertEqual(
                        actual,
                        "CopyBackwards(None, Error(AccumulateGrad(), None, AccumulateGrad()))",
                    )

    def _subclass_outcomes(self, variable, new_grad, grad_mode, accumulate=False):
        """(ops, result or error) of the stock and the overlay header for a LoggingTensor
        new_grad (a fresh one per call, same strides: accumulate_grad may steal it)."""
        results = []
        for e in (require_extension(self, stock=True), require_extension(self)):
            grad = LoggingTensor(new_grad.clone(), requires_grad=grad_mode)
            with capture_logs() as logs, torch.autograd.set_grad_enabled(grad_mode):
                if accumulate:
                    leaf = variable.detach().requires_grad_()
                    out, error = outcome(e.accumulate_grad, leaf, grad, grad_mode)
                else:
                    out, error = outcome(e.clone_obey_contract, grad, variable)
            results.append((logged_ops(logs), out, error))
        return results

    def test_subclass_takes_a_single_clone_only_without_grad_mode(self):
        require_extension(self)
        torch.manual_seed(0)
        cases = {
            "contiguous": (
                torch.randn(3, 4),
                torch.randn(4, 3).t(),
                "contiguous_format",
            ),
            "channels_last": (
                torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
                torch.randn(2, 3, 4, 5),
                "channels_last",
            ),
            "channels_last_3d": (
                torch.randn(2, 3, 2, 2, 3).to(memory_format=torch.channels_last_3d),
                torch.randn(2, 3, 2, 2, 3),
                "channels_last_3d",
            ),
            "channels_last_size1": (
                torch.randn(2, 3, 1, 1).to(memory_format=torch.channels_last),
                torch.randn(2, 3, 1, 1),
                "channels_last",
            ),
            "permuted": (torch.randn(4, 3).t(), torch.randn(3, 4), None),
            "non_dense": (torch.randn(3, 8)[:, ::2], torch.randn(3, 4), None),
        }
        combos = itertools.product(cases.items(), [False, True], [False, True])
        for (name, (variable, new_grad, fmt)), grad_mode, accumulate in combos:
            with self.subTest(
                variable=name, grad_mode=grad_mode, accumulate=accumulate
            ):
                (
                    (expected_ops, expected, expected_error),
                    (actual_ops, actual, actual_error),
                ) = self._subclass_outcomes(variable, new_grad, grad_mode, accumulate)
                self.assertIsNone(expected_error)
                self.assertIsNone(actual_error)
                self.assertIsInstance(actual, LoggingTensor)
                if fmt is not None and not grad_mode:
                    self.assertEqual(actual_ops, [f"clone(torch.{fmt})"])
                    self.assertEqual(expected_ops, ["new_empty_strided", "copy_"])
                else:
                    self.assertEqual(actual_ops, expected_ops)
                    self.assertIn(
                        actual_ops,
                        (
                            ["new_empty_strided", "copy_"],
                            ["clone(torch.contiguous_format)"],
                        ),
                    )
                self.assertEqual(actual.shape, expected.shape)
                self.assertEqual(actual.stride(), expected.stride())
                if fmt is not None:
                    self.assertEqual(actual.stride(), variable.stride())
                self.assertEqual(actual.elem.stride(), expected.elem.stride())
                self.assertTrue(torch.equal(actual.elem, expected.elem))
                self.assertEqual(
                    graph_desc(actual.grad_fn), graph_desc(expected.grad_fn)
                )

    def test_subclass_clone_without_the_variable_strides_is_not_returned(self):
        # A clone that ignores memory_format would break the layout contract: the result
        # then comes from the stock path (new_empty_strided + copy_) after that clone.
        ext = require_extension(self)
        stock = require_extension(self, stock=True)
        torch.manual_seed(0)
        cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
        cases = {
            "channels_last variable, contiguous grad": (
                cl,
                torch.randn(2, 3, 4, 5),
                False,
            ),
            "contiguous variable, transposed grad": (
                torch.randn(3, 4),
                torch.randn(4, 3).t(),
                False,
            ),
            "contiguous variable, contiguous grad": (
                torch.randn(3, 4),
                torch.randn(3, 4),
                True,
            ),
        }
        for (name, (variable, new_grad, clone_kept)), accumulate in itertools.product(
            cases.items(), [False, True]
        ):
            with self.subTest(case=name, accumulate=accumulate):
                results = []
                for e in (stock, ext):
                    IgnoresMemoryFormat.ops = []
                    grad = IgnoresMemoryFormat(new_grad)
                    if accumulate:
                        out = e.accumulate_grad(
                            variable.detach().requires_grad_(), grad, False
                        )
                    else:
                        with torch.no_grad():
                            out = e.clone_obey_contract(grad, variable)
                    results.append((IgnoresMemoryFormat.ops, out))
                (expected_ops, expected), (actual_ops, actual) = results
                if clone_kept:
                    self.assertEqual(actual_ops, ["clone"])
                else:
                    self.assertEqual(
                        actual_ops, ["clone", "new_empty_strided", "copy_"]
                    )
                    self.assertEqual(expected_ops, ["new_empty_strided", "copy_"])
                self.assertEqual(actual.stride(), variable.stride())
                self.assertEqual(actual.stride(), expected.stride())
                self.assertEqual(actual.elem.stride(), expected.elem.stride())
                self.assertTrue(torch.equal(actual.elem, expected.elem))

    def test_subclass_grad_of_another_shape_or_device_takes_the_stock_path(self):
        # Direct calls only (the engine validates shapes and devices before AccumulateGrad;
        # torch.ops.inductor.accumulate_grad_ does not): the stock result, or error.
        require_extension(self)
        torch.manual_seed(0)
        cases = {
            "broadcastable (1, 4) into (3, 4)": (torch.randn(3, 4), torch.randn(1, 4)),
            "meta into cpu": (torch.randn(3, 4), torch.empty(3, 4, device="meta")),
            "cpu into meta": (torch.empty(3, 4, device="meta"), torch.randn(3, 4)),
        }
        for (name, (variable, new_grad)), grad_mode in itertools.product(
            cases.items(), [False, True]
        ):
            with self.subTest(case=name, grad_mode=grad_mode):
                (
                    (expected_ops, expected, expected_error),
                    (actual_ops, actual, actual_error),
                ) = self._subclass_outcomes(variable, new_grad, grad_mode)
                self.assertEqual(actual_ops, expected_ops)
                self.assertEqual(actual_error, expected_error)
                if expected_error is None:
                    self.assertEqual(
                        (
                            actual.shape,
                            actual.stride(),
                            actual.device,
                            actual.elem.device,
                        ),
                        (
                            expected.shape,
                            expected.stride(),
                            expected.device,
                            expected.elem.device,
                        ),
                    )
                    self.assertEqual(actual.shape, variable.shape)
                    self.assertEqual(actual.device, variable.device)


def new_empty_strided_replicates_partial(op, args_schema, kwargs_schema):
    """DTensor's new_empty_strided rule without the Partial workaround: the rule of the
    initialized factories, which gives a Replicate output for a Partial input."""
    from torch.distributed.tensor._ops._tensor_ops import (
        new_factory_single_dim_strategy,
    )

    return new_factory_single_dim_strategy(
        aten.new_zeros.default, args_schema, kwargs_schema
    )


@contextmanager
def reverted_new_empty_strided_rule():
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental._context_parallel._sharding_rules import (
        _single_dim_strategy_context,
    )

    _clear_sharding_prop_cache()
    try:
        with _single_dim_strategy_context(
            aten.new_empty_strided.default,
            new_empty_strided_replicates_partial,
            RuntimeSchemaInfo(1, ["dtype"]),
        ):
            yield
    finally:
        _clear_sharding_prop_cache()


class CloneObeyContractDTensorTest(DTensorContinuousTestBase):
    world_size = 2

    def test_partial_transposed_grad_of_replicate_param_stays_partial(self):
        ext = require_extension(self)
        stock = require_extension(self, stock=True)
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        param = nn.Parameter(distribute_tensor(torch.randn(4, 6), mesh, [Replicate()]))

        def local_grad(rank):  # non-contiguous: strides (1, 4)
            return torch.arange(24.0).reshape(6, 4).mul(rank + 1).t()

        grad = DTensor.from_local(
            map_local_for_rank(self.rank, local_grad),
            mesh,
            [Partial("sum")],
            run_check=False,
        )
        truth = sum(local_grad(r) for r in range(self.world_size))
        with reverted_new_empty_strided_rule():
            # The reverted rule really is in force: new_empty_strided of a Partial is Replicate.
            probe = grad.new_empty_strided((4, 6), (6, 1))
            self.assertEqual(probe.placements, (Replicate(),))
            comm_mode = CommDebugMode()
            with comm_mode:
                with torch.no_grad():  # AccumulateGrad's grad mode without create_graph
                    result = ext.clone_obey_contract(grad, param)
                accumulated = ext.accumulate_grad(param, grad, False)
            # With grad mode (create_graph), the stock path: here a Replicate buffer.
            with CommDebugMode() as expected_comms:
                expected = stock.clone_obey_contract(grad, param)
            with CommDebugMode() as actual_comms:
                actual = ext.clone_obey_contract(grad, param)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        for out in (result, accumulated):
            self.assertEqual(out.placements, (Partial("sum"),))
            self.assertEqual(out.stride(), param.stride())
            self.assertEqual(out.full_tensor(), truth)
        self.assertEqual(actual.placements, expected.placements)
        self.assertEqual(actual.placements, (Replicate(),))
        self.assertEqual(
            actual_comms.get_total_counts(), expected_comms.get_total_counts()
        )
        self.assertEqual(actual.stride(), expected.stride())
        self.assertEqual(actual.full_tensor(), truth)


CloneObeyContractDTensorTestWithLocalTensor = create_local_tensor_test_class(
    CloneObeyContractDTensorTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
