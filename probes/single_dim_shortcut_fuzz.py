"""Sharding propagation with vs without the single-dim shortcuts (inputs kept as they are when
they match a rule), random ops and placements on 1/2/3-D fake meshes: the output placements
and collectives must be the same. Run under `torch-overlay run -- python probes/single_dim_shortcut_fuzz.py SEED N`.
"""

import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.single_dim_strategy as sds
import torch.distributed.tensor._sharding_prop as sp
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from dtensor_propagation_miss import clear_caches  # noqa: E402

orig = sp._expand_single_dim_strategy_to_mesh

_keep = sds._strategy_keeping_inputs
hits = [0, 0]


def counting(*a, **k):
    r = _keep(*a, **k)
    hits[r is None] += 1
    return r


sds._strategy_keeping_inputs = counting


def no_shortcut(*a, **k):
    # neither shortcut: every combination of rules on every mesh dim
    k["inputs_as_they_are_if_matched"] = False
    k["leave_out_unreachable_partials"] = False
    return orig(*a, **k)


dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
mesh3 = init_device_mesh("cpu", (2, 2, 2))
meshes = {1: init_device_mesh("cpu", (8,)), 2: init_device_mesh("cpu", (2, 4)), 3: mesh3}
aten, prims = torch.ops.aten, torch.ops.prims
f32, bf16, i32, i64 = torch.float32, torch.bfloat16, torch.int32, torch.int64
PL = [
    Replicate(),
    Shard(0),
    Shard(1),
    Partial(),
    Partial("avg"),
    Partial("max"),
    Partial("min"),
    Partial("product"),
    Partial("bxor"),
]
OPS = [
    ("clone", 1, lambda x: x.clone()),
    ("t", 1, lambda x: x.t()),
    ("sel", 1, lambda x: x[:, 1]),
    ("row", 1, lambda x: x[1]),
    ("slice", 1, lambda x: x[:, 2:]),
    ("cat", 2, lambda x, y: torch.cat([x, y], 1)),
    ("split", 1, lambda x: x.split(4, 1)),
    ("unbind", 1, lambda x: x.unbind(1)),
    ("add", 2, lambda x, y: x + y),
    ("mul", 2, lambda x, y: x * y),
    ("muls", 1, lambda x: x * 0.5),
    ("sum", 1, lambda x: x.sum()),
    ("sum1", 1, lambda x: x.sum(1)),
    ("mean", 1, lambda x: x.mean()),
    ("mm", 2, lambda x, y: x @ y),
    ("relu", 1, lambda x: x.relu()),
    ("neg", 1, lambda x: -x),
    ("tobf16", 1, lambda x: x.to(bf16)),
    ("cet_bf16", 1, lambda x: prims.convert_element_type(x, bf16)),
    ("cet_f64", 1, lambda x: prims.convert_element_type(x, torch.float64)),
    ("view_i32", 1, lambda x: x.view(i32)),
    ("new_zeros", 1, lambda x: x.new_zeros((8, 8))),
    ("zeros_like", 1, lambda x: torch.zeros_like(x)),
    ("empty_like", 1, lambda x: torch.empty_like(x)),
    ("zero_", 1, lambda x: x.zero_()),
    ("fill_", 1, lambda x: x.fill_(1.5)),
    ("copy_", 2, lambda x, y: x.copy_(y)),
    ("add_", 2, lambda x, y: x.add_(y)),
    ("where", 2, lambda x, y: torch.where(x > 0, x, y)),
    ("cumsum", 1, lambda x: x.cumsum(1)),
    ("amax", 1, lambda x: x.amax(1)),
    ("softmax", 1, lambda x: x.softmax(1)),
    (
        "index_select",
        1,
        lambda x: x.index_select(
            0,
            DTensor.from_local(
                torch.tensor([1, 0]),
                x.device_mesh,
                [Replicate()] * x.device_mesh.ndim,
                run_check=False,
            ),
        ),
    ),
    ("contig", 1, lambda x: x.contiguous()),
    ("detach", 1, lambda x: x.detach()),
    ("transpose", 1, lambda x: x.transpose(0, 1)),
    ("sub", 2, lambda x, y: x - y),
    ("div", 2, lambda x, y: x / y),
    ("max2", 2, lambda x, y: torch.maximum(x, y)),
    ("addcmul_", 2, lambda x, y: x.addcmul_(y, y, value=0.5)),
    ("i_and", 2, lambda x, y: x.int() & y.int()),
]


def mk(mesh, pl, dtype):
    shape = [8, 8]
    for k, p in enumerate(pl):
        if isinstance(p, Shard):
            shape[p.dim] //= mesh.size(k)
    return DTensor.from_local(
        torch.rand(shape).mul(4).to(dtype),
        mesh,
        pl,
        run_check=False,
        shape=torch.Size((8, 8)),
        stride=(8, 1),
    )


def outcome(fn, xs):
    clear_caches()
    try:
        with CommDebugMode() as c:
            out = fn(*[x.detach().clone() if False else x for x in xs])
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return (
            "ok",
            tuple(tuple(o.placements) if isinstance(o, DTensor) else type(o) for o in outs),
            c.get_total_counts(),
        )
    except Exception as e:
        return ("err", type(e).__name__, str(e)[:80])


random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
diffs = cases = 0
for _ in range(N):
    nd = random.choice([1, 2, 3])
    mesh = meshes[nd]
    name, nin, fn = random.choice(OPS)
    dtype = i64 if name.startswith("i_") else random.choice([f32, f32, bf16])

    def one(nd=nd):
        partial = random.choice(PL[3:])
        return [random.choice([*PL[:3], partial]) for _ in range(nd)]

    pls = [one() for _ in range(nin)]

    def xs(mesh=mesh, pls=pls, dtype=dtype):
        return [mk(mesh, p, dtype) for p in pls]  # fresh inputs each (in-place ops)

    a = outcome(fn, xs())
    sp._expand_single_dim_strategy_to_mesh = no_shortcut
    b = outcome(fn, xs())
    sp._expand_single_dim_strategy_to_mesh = orig
    cases += 1
    if a != b:
        diffs += 1
        print("DIFF", name, nd, pls, dtype, "\n  with   ", a, "\n  without", b)
print(f"cases {cases} diffs {diffs}; shortcut taken {hits[0]}, declined {hits[1]}")
