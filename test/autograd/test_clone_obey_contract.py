# Owner(s): ["module: autograd"]
"""clone_obey_contract from the overlay's grad_layout_contract.h, without rebuilding torch.

A header change cannot be activated on a wheel (libtorch has its own inline copy), so this
test compiles the overlay's header into a small extension and compares it with the stock
function that the wheel's AccumulateGrad runs (a leaf backward), on many plain layouts,
and checks the DTensor case the patch is for: a Partial, non-contiguous gradient of a
Replicate parameter stays Partial with no collective, even with DTensor's new_empty_strided
rule reverted to Replicate.
"""

import hashlib
import itertools
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
    DTensorTestBase,
    create_local_tensor_test_class,
    map_local_for_rank,
    with_comms,
)

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "torch_overlay"
HEADER = "torch/csrc/autograd/utils/grad_layout_contract.h"
SOURCE = Path(__file__).with_suffix(".cpp")
# In this repo the header comes from the overlay; in a PyTorch checkout, from the source tree.
INCLUDE_ROOT = OVERLAY if (OVERLAY / HEADER).exists() else REPO
aten = torch.ops.aten


@cache
def overlay_extension():
    """Build (once, cached under build/) and load the extension with the overlay header."""
    from torch.utils import cpp_extension

    header = INCLUDE_ROOT / HEADER
    if not header.exists():
        raise RuntimeError(f"{header} is missing: run `torch-overlay sync` first")
    digest = hashlib.sha256(header.read_bytes() + SOURCE.read_bytes()).hexdigest()[:12]
    build_dir = REPO / "build" / f"clone_obey_contract_{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=f"clone_obey_contract_{digest}",
        sources=[str(SOURCE)],
        # -I paths come before torch's own include paths, so this header wins.
        extra_include_paths=[str(INCLUDE_ROOT)],
        # Hidden inline symbols: calls bind to this library's (patched) copy.
        extra_cflags=["-O1", "-fvisibility=hidden", "-fvisibility-inlines-hidden"],
        build_directory=str(build_dir),
        verbose=False,
    )


def require_extension(test):
    if shutil.which("c++") is None:
        test.skipTest("no C++ compiler to build the overlay header into an extension")
    return overlay_extension()


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
        yield "size1_odd_stride", torch.empty_strided(shape, odd, dtype=dtype).copy_(base)
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
        yield "neg_view", torch.randn(shape, dtype=torch.complex128).conj().imag.to(dtype)


SHAPES = [(5,), (3, 4), (2, 1, 3), (1, 3, 1, 4), (2, 3, 4, 5), (2, 3, 2, 2, 3), (0, 3)]
DTYPES = [torch.float32, torch.float64, torch.complex64]


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
        self.assertEqual((patched.is_conj(), patched.is_neg()), (stock.is_conj(), stock.is_neg()))
        self.assertTrue(torch.equal(patched, stock))
        self.assertEqual(patched.requires_grad, stock.requires_grad)
        if create_graph and stock.numel():
            weight = torch.randn_like(stock)
            (expected,) = torch.autograd.grad((stock * weight).real.sum(), grad)
            (actual,) = torch.autograd.grad((patched * weight).real.sum(), grad)
            self.assertEqual(actual, expected, atol=0, rtol=0)

    def test_plain_tensors_match_the_stock_function_on_every_layout(self):
        require_extension(self)
        torch.manual_seed(0)
        cases = 0
        for shape, dtype in itertools.product(SHAPES, DTYPES):
            for (v_name, variable), (g_name, new_grad), create_graph in itertools.product(
                list(variables(shape, dtype)), list(new_grads(shape, dtype)), [False, True]
            ):
                with self.subTest(shape=shape, dtype=dtype, variable=v_name, grad=g_name,
                                  create_graph=create_graph):  # fmt: skip
                    self._check_same_as_stock(variable, new_grad, create_graph)
                    cases += 1
        self.assertGreater(cases, 500)


def new_empty_strided_replicates_partial(op, args_schema, kwargs_schema):
    """DTensor's new_empty_strided rule without the Partial workaround: the rule of the
    initialized factories, which gives a Replicate output for a Partial input."""
    from torch.distributed.tensor._ops._tensor_ops import new_factory_single_dim_strategy

    return new_factory_single_dim_strategy(aten.new_zeros.default, args_schema, kwargs_schema)


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


class CloneObeyContractDTensorTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_partial_transposed_grad_of_replicate_param_stays_partial(self):
        ext = require_extension(self)
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        param = nn.Parameter(distribute_tensor(torch.randn(4, 6), mesh, [Replicate()]))

        def local_grad(rank):  # non-contiguous: strides (1, 4)
            return torch.arange(24.0).reshape(6, 4).mul(rank + 1).t()

        grad = DTensor.from_local(
            map_local_for_rank(self.rank, local_grad), mesh, [Partial("sum")], run_check=False
        )
        truth = sum(local_grad(r) for r in range(self.world_size))
        with reverted_new_empty_strided_rule():
            # The reverted rule really is in force: new_empty_strided of a Partial is Replicate.
            probe = grad.new_empty_strided((4, 6), (6, 1))
            self.assertEqual(probe.placements, (Replicate(),))
            comm_mode = CommDebugMode()
            with comm_mode:
                result = ext.clone_obey_contract(grad, param)
                accumulated = ext.accumulate_grad(param, grad, False)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        for out in (result, accumulated):
            self.assertEqual(out.placements, (Partial("sum"),))
            self.assertEqual(out.stride(), param.stride())
            self.assertEqual(out.full_tensor(), truth)


CloneObeyContractDTensorTestWithLocalTensor = create_local_tensor_test_class(
    CloneObeyContractDTensorTest
)


if __name__ == "__main__":
    run_tests()
