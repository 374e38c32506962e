"""Probe: the additive family (the ops registered with add/sub's Partial rules, and
the ops that reach the same values: rsub, its out variant, foreach, alpha, in-place,
out=) with an integer Replicate operand (a DTensor or a 0-dim plain tensor) and a
float32/bfloat16 Partial("sum"/"avg") operand, plus rsub's controls.

Ranks are simulated with LocalTensorMode over the fake process group; each row starts
from cleared sharding caches; the truth is the op on each input's full_tensor().

    python probes/partial_additive_siblings.py [WORLD_SIZE]           stock torch
    python -m tools.cli run -- python probes/partial_additive_siblings.py [WORLD_SIZE]

Prints one line per row: name, ok / WRONG / ERROR, collectives, output placement, value.
"""

import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    init_device_mesh,
)
from torch.distributed.tensor.debug import CommDebugMode

warnings.filterwarnings("ignore")
WS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dist.init_process_group("fake", rank=0, world_size=WS)
MESH = init_device_mesh("cpu", (WS,))
MODE = LocalTensorMode(frozenset(range(WS)))


def dt(per_rank, placement, shape=None):
    local = LocalTensor({r: per_rank(r) for r in range(WS)})
    kw = {}
    if shape is not None:
        kw = dict(shape=torch.Size(shape), stride=torch.empty(shape).stride())
    with MODE:
        return DTensor.from_local(local, MESH, [placement], run_check=False, **kw)


def to_plain(t):
    if isinstance(t, (list, tuple)):
        return type(t)(to_plain(x) for x in t)
    if isinstance(t, DTensor):
        with MODE:
            t = t.full_tensor()
    if isinstance(t, LocalTensor):
        t = t._local_tensors[0]
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def same(v, t):
    if v.dtype != t.dtype or v.shape != t.shape:
        return False
    if torch.equal(v, t):
        return True
    return v.is_floating_point() and torch.allclose(
        v.double(), t.double(), equal_nan=True, rtol=1e-6, atol=0
    )


def check(name, make, op):
    torch._C._clear_DTensor_sharding_propagator_cache()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    truth = op(*to_plain(make()))
    comm = CommDebugMode()
    try:
        args = make()
        with MODE:
            with comm:
                res = op(*args)
            pl = "".join(str(p) for p in res.placements)
            val = to_plain(res)
    except Exception as e:  # noqa: BLE001
        msg = str(e).split("\n")[0][:110]
        print(f"{name[:60]:60s} ERROR {type(e).__name__}: {msg!r}", flush=True)
        return
    verdict = "ok   " if same(val, truth) else "WRONG"
    print(
        f"{name[:60]:60s} {verdict} comms={comm.get_total_counts()} pl={pl} "
        f"val={val.tolist()}:{str(val.dtype)[6:]}"
        + ("" if verdict == "ok   " else f" truth={truth.tolist()}"),
        flush=True,
    )


f32, bf16, i64, i32, u8 = torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.uint8
x2 = [[1.5, 2.0], [1.5, 4.0]]


def P(vs, dtype, pl=None):
    return dt(
        lambda r: torch.tensor(vs[r % len(vs)], dtype=torch.float64).to(dtype), pl or Partial()
    )


def R(v, dtype):
    return dt(lambda r: torch.tensor(v, dtype=torch.float64).to(dtype), Replicate())


A = Partial("avg")
aten = torch.ops.aten


def fe(f):
    return lambda x, y: f([x], [y])[0]


def fe_(f):
    def g(x, y):
        f([x], [y])
        return x

    return g


rows = []
for pname, pl in (("P", None), ("Pavg", A)):
    for dname, dtype in (("f32", f32), ("bf16", bf16)):
        for oname, mko in (
            ("i64 R", lambda: R([3, 5], i64)),
            ("u8 R", lambda: R([3, 5], u8)),
            ("0-d i64", lambda: torch.tensor(7)),
        ):

            def mk(mko=mko, dtype=dtype, pl=pl):
                return (P(x2, dtype, pl), mko())

            tag = f"{dname} {pname}, {oname}"
            rows += [
                (f"add.Tensor {tag}", mk, lambda x, y: x + y),
                (f"add.Tensor rev {tag}", mk, lambda x, y: y + x),
                (f"add.Tensor alpha=2 {tag}", mk, lambda x, y: torch.add(x, y, alpha=2)),
                (f"add_.Tensor {tag}", mk, lambda x, y: x.add_(y)),
                (f"add.out {tag}", mk, lambda x, y: torch.add(x, y, out=x)),
                (f"sub.Tensor {tag}", mk, lambda x, y: x - y),
                (f"sub.Tensor rev {tag}", mk, lambda x, y: y - x),
                (f"sub_.Tensor {tag}", mk, lambda x, y: x.sub_(y)),
                (f"sub.out {tag}", mk, lambda x, y: torch.sub(x, y, out=x)),
                (f"rsub.Tensor {tag}", mk, lambda x, y: torch.rsub(x, y)),
                (f"rsub.Tensor alpha=2 {tag}", mk, lambda x, y: torch.rsub(x, y, alpha=2)),
                (f"rsub.Tensor rev {tag}", mk, lambda x, y: torch.rsub(y, x)),
                (f"rsub.Tensor_out {tag}", mk, lambda x, y: aten.rsub.Tensor_out(x, y, out=x)),
                (f"rsub.Tensor_out rev {tag}", mk, lambda x, y: aten.rsub.Tensor_out(y, x, out=x)),
            ]
            if oname != "0-d i64":
                rows += [
                    (f"_foreach_add.List {tag}", mk, fe(torch._foreach_add)),
                    (f"_foreach_add_.List {tag}", mk, fe_(torch._foreach_add_)),
                    (f"_foreach_sub.List {tag}", mk, fe(torch._foreach_sub)),
                    (f"_foreach_sub_.List {tag}", mk, fe_(torch._foreach_sub_)),
                ]

        def mkf(dtype=dtype, pl=pl):
            return (P(x2, dtype, pl), R([3, 5], f32))

        rows += [
            (f"rsub.Scalar {dname} {pname} 2", mkf, lambda x, y: torch.rsub(x, 2)),
            (f"__rsub__ {dname} {pname} 2 - x", mkf, lambda x, y: 2 - x),
            (
                f"_foreach_add.Tensor {dname} {pname} 0-d",
                mkf,
                lambda x, y: torch._foreach_add([x], torch.tensor(3.0))[0],
            ),
            (
                f"addcmul {dname} {pname} i64 R",
                lambda dtype=dtype, pl=pl: (P(x2, dtype, pl), R([3, 5], i64)),
                lambda x, y: torch.addcmul(x, y, y),
            ),
            (f"addcdiv {dname} {pname} f32 R", mkf, lambda x, y: torch.addcdiv(x, y, y)),
            (
                f"lerp {dname} {pname} i64->self R",
                lambda dtype=dtype, pl=pl: (P(x2, dtype, pl), R([3, 5], dtype)),
                lambda x, y: torch.lerp(x, y, 0.5),
            ),
            (
                f"rsub.Tensor same dtype {dname} {pname}",
                lambda dtype=dtype, pl=pl: (P(x2, dtype, pl), R([3, 5], dtype)),
                lambda x, y: torch.rsub(x, y),
            ),
            (
                f"rsub.Tensor P P {dname} {pname}",
                lambda dtype=dtype, pl=pl: (P(x2, dtype, pl), P(x2, dtype, pl)),
                lambda x, y: torch.rsub(x, y),
            ),
            (
                f"rsub.Tensor f32 P i64 P {pname}",
                lambda pl=pl: (P(x2, f32, pl), P([[1, 2], [3, 4]], i64, pl)),
                lambda x, y: torch.rsub(x, y),
            ),
        ]
# max/min through rsub: P(max) other - R self
rows += [
    (
        "rsub.Tensor P(max) other, R self",
        lambda: (R([3, 5], f32), P(x2, f32, Partial("max"))),
        lambda x, y: torch.rsub(x, y),
    ),
    (
        "rsub.Tensor P(max) self, R other",
        lambda: (P(x2, f32, Partial("max")), R([3, 5], f32)),
        lambda x, y: torch.rsub(x, y),
    ),
    (
        "rsub.Tensor i8 P, i32 R",
        lambda: (P([[100, 70], [100, 70]], torch.int8), R([3, 5], i32)),
        lambda x, y: torch.rsub(x, y),
    ),
    (
        "rsub.Tensor i8 P, i8 R",
        lambda: (P([[100, 70], [100, 70]], torch.int8), R([3, 5], torch.int8)),
        lambda x, y: torch.rsub(x, y),
    ),
    (
        "rsub.Tensor S0, R",
        lambda: (
            dt(lambda r: torch.tensor([1.5, 2.0]), Shard(0), shape=(4,)),
            R([3, 5, 1, 2], i64),
        ),
        lambda x, y: torch.rsub(x, y),
    ),
]
for name, mk, f in rows:
    check(name, mk, f)
