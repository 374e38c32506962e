# Owner(s): ["oncall: distributed"]
"""The dtype argument of a reduction is part of its sharding cache key.

Sharding propagation computes the output's TensorMeta, dtype included, and caches
the plan by the op's schema. Reductions whose output dtype is a kwarg (``sum``,
``prod``, ``nansum``, ``mean``, ``cumsum``, ``cumprod``, ``linalg.vector_norm``)
left that kwarg out of the key: ``x.sum()`` then
``x.sum(dtype=torch.float32)`` served the first plan, whose output dtype is the
input's, to the second, so the DTensor's dtype disagreed with its local tensor's
and a later op could raise. No Partial is involved: the inputs are Shard(0).
"""

import torch
from torch.distributed.tensor import distribute_tensor, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorContinuousTestBase,
    LocalDTensorContinuousTestBase,
)


INT = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [2, 1, 3]])
FLOAT = torch.tensor(
    [[1.5, 2.5, 0.5], [3.5, 0.5, 1.0], [2.0, 1.0, 4.0], [0.5, 1.5, 2.5]]
)

# (name, input, op(x, dtype) where dtype None leaves the kwarg out, dtypes in call order)
CASES = [
    ("sum", INT, lambda x, d: x.sum(dtype=d), (torch.float32, torch.float64)),
    ("sum.dim_IntList", INT, lambda x, d: x.sum(1, dtype=d), (torch.float32,)),
    ("nansum", FLOAT, lambda x, d: x.nansum(dtype=d), (torch.float64,)),
    ("prod", INT, lambda x, d: x.prod(dtype=d), (torch.float32,)),
    ("prod.dim_int", INT, lambda x, d: x.prod(1, dtype=d), (torch.float64,)),
    ("mean.dim", FLOAT, lambda x, d: x.mean(1, dtype=d), (torch.float64,)),
    ("cumsum", INT, lambda x, d: x.cumsum(1, dtype=d), (torch.float32,)),
    ("cumprod", FLOAT, lambda x, d: x.cumprod(1, dtype=d), (torch.float64,)),
    (
        "linalg.vector_norm",
        FLOAT,
        lambda x, d: torch.linalg.vector_norm(x, 2, dtype=d),
        (torch.float64,),
    ),
    (
        "linalg.norm",
        FLOAT,
        lambda x, d: torch.linalg.norm(x, dtype=d),
        (torch.float64,),
    ),
]


class DistReductionDtypeCacheKeyTest(DTensorContinuousTestBase):
    world_size = 2

    def test_a_dtype_argument_gets_its_own_plan(self):
        mesh = self.build_device_mesh()
        for name, plain, fn, dtypes in CASES:
            x = distribute_tensor(plain, mesh, [Shard(0)])
            # The first call caches the plan without the kwarg; each dtype
            # after it must get its own.
            first = fn(x, None)
            for dtype in dtypes:
                with self.subTest(f"{name}(dtype={dtype})"):
                    truth = fn(plain, dtype)
                    comm_mode = CommDebugMode()
                    with comm_mode:
                        out = fn(x, dtype)
                    self.assertEqual(comm_mode.get_total_counts(), 0)
                    self.assertEqual(out.placements, first.placements)
                    # The spec's dtype (what sharding propagation computed),
                    # not only the local tensor's.
                    self.assertEqual(out._spec.tensor_meta.dtype, truth.dtype)
                    self.assertEqual(out.to_local().dtype, truth.dtype)
                    # A later op reads the DTensor's dtype (the mean of an
                    # integer-typed spec raised).
                    self.assertEqual(out.full_tensor(), truth)
                    self.assertEqual(out.reshape(-1).mean().full_tensor(), truth.mean())


DistReductionDtypeCacheKeyTestWithLocalTensor = create_local_tensor_test_class(
    DistReductionDtypeCacheKeyTest, base_class=LocalDTensorContinuousTestBase
)


if __name__ == "__main__":
    run_tests()
