"""Probe: mul and div of a Partial("sum"/"avg") DTensor by a non-finite factor or a
zero divisor, with their siblings (true_divide, rounding modes, out=, addcmul/addcdiv
value=, xlogy, xlog1py, a factor held in a 0-d tensor, finite controls), in float32,
bfloat16 and complex64. Pieces hold a zero next to a nonzero value and values of
opposite signs, so a pending sum through x * inf reads nan where the sum times inf is
+-inf.

Ranks are simulated with LocalTensorMode over the fake process group (WORLD_SIZE 4: a
2 x 2 mesh with [Partial, Partial]); the truth is the op on the reduced plain tensor
(nan, inf and -inf compared as values).

    python probes/partial_scalar_factor_siblings.py [WORLD_SIZE]           stock torch
    python -m tools.cli run -- python probes/partial_scalar_factor_siblings.py [WORLD_SIZE]

Prints one line per row: dtype, reduce op, mesh, name, ok / WRONG / ERROR, placements,
collectives, value and truth. Rows marked [limit] are known not covered (the factor's
value is in a tensor).
"""

import math, sys, torch
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed._local_tensor import LocalTensorMode, LocalTensor
from torch.distributed.tensor.debug import CommDebugMode
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh

WS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WS)
inf, nan = math.inf, math.nan
P = [
    [0.0, -2.0, 4.0, 1.0],
    [5.0, 5.0, 0.0, 1.0],
    [0.0, 1.0, 0.0, 1.0],
    [2.0, -8.0, 0.0, 1.0],
]
aten = torch.ops.aten


def rows():
    f = lambda *a: a
    yield from [
        ("x*inf", lambda x: x * inf),
        ("x/0.", lambda x: x / 0.0),
        ("x/0", lambda x: x / 0),
        ("x*2.", lambda x: x * 2.0),
        ("x/2", lambda x: x / 2),
        ("div floor 0.", lambda x: torch.div(x, 0.0, rounding_mode="floor")),
        ("div trunc 0.", lambda x: torch.div(x, 0.0, rounding_mode="trunc")),
        ("true_divide 0.", lambda x: torch.true_divide(x, 0.0)),
        ("mul.out(inf) R out", "outR_mul"),
        ("mul.out(inf) P out", "outP_mul"),
        ("div.out(0.) R out", "outR_div"),
        ("addcmul value=inf", lambda x: torch.addcmul(x, x, x, value=inf)),
        ("addcdiv value=inf", lambda x: torch.addcdiv(x, x, x + 10, value=inf)),
        ("xlogy(x, inf)", lambda x: torch.xlogy(x, inf)),
        ("xlog1py(x, inf)", lambda x: torch.special.xlog1py(x, inf)),
        ("x * R0d(inf) [limit]", "r0d"),
        ("x * tensor(inf) [limit]", lambda x: x * torch.tensor(inf)),
        (
            "_foreach_mul(xs, tensor(inf)) [limit]",
            lambda x: torch._foreach_mul([x], torch.tensor(inf))[0],
        ),
        ("x*nan", lambda x: x * nan),
        ("x/inf", lambda x: x / inf),
    ]


def run(dtype, reduce_op, mesh_shape):
    mesh = init_device_mesh("cpu", mesh_shape)
    n = math.prod(mesh_shape)
    placements = [Partial(reduce_op)] * len(mesh_shape)

    def mk(dt=dtype):
        return DTensor.from_local(
            LocalTensor({r: torch.tensor(P[r], dtype=dt) for r in range(n)}),
            mesh,
            placements,
            run_check=False,
        )

    whole = torch.tensor(P[:n], dtype=torch.float64)
    whole = (whole.sum(0) if reduce_op == "sum" else whole.mean(0)).to(dtype)
    for name, fn in rows():
        x = mk()
        try:
            with CommDebugMode() as c:
                if fn == "outR_mul":
                    o = DTensor.from_local(
                        LocalTensor({r: torch.zeros(4, dtype=dtype) for r in range(n)}),
                        mesh,
                        [Replicate()] * len(mesh_shape),
                        run_check=False,
                    )
                    y = torch.mul(x, inf, out=o)
                    truth = whole * inf
                elif fn == "outP_mul":
                    o = mk()
                    y = torch.mul(x, inf, out=o)
                    truth = whole * inf
                elif fn == "outR_div":
                    o = DTensor.from_local(
                        LocalTensor({r: torch.zeros(4, dtype=dtype) for r in range(n)}),
                        mesh,
                        [Replicate()] * len(mesh_shape),
                        run_check=False,
                    )
                    y = torch.div(x, 0.0, out=o)
                    truth = whole / 0.0
                elif fn == "r0d":
                    t = DTensor.from_local(
                        LocalTensor(
                            {
                                r: torch.tensor(inf, dtype=torch.float64)
                                for r in range(n)
                            }
                        ),
                        mesh,
                        [Replicate()] * len(mesh_shape),
                        run_check=False,
                    )
                    y = x * t
                    truth = whole * torch.tensor(inf, dtype=torch.float64)
                else:
                    y = fn(x)
                    truth = fn(whole)
            full = y.full_tensor()
            full = full._local_tensors[0] if hasattr(full, "_local_tensors") else full
            ok = torch.equal(
                torch.nan_to_num(full.double(), nan=7.0, posinf=8, neginf=9),
                torch.nan_to_num(truth.double(), nan=7.0, posinf=8, neginf=9),
            )
            print(
                f"{str(dtype)[6:]:9} {reduce_op} {mesh_shape} {name:38} {'ok   ' if ok else 'WRONG'} {y.placements} colls={c.get_total_counts()} got={full.tolist()} truth={truth.tolist()}"
            )
        except Exception as e:
            print(
                f"{str(dtype)[6:]:9} {reduce_op} {mesh_shape} {name:38} ERROR {type(e).__name__}: {str(e).splitlines()[0][:90]}"
            )


with LocalTensorMode(WS):
    shapes = [(WS,)] if WS != 4 else [(2, 2)]
    for shape in shapes:
        for dtype in (torch.float32, torch.bfloat16, torch.complex64):
            for r in ("sum", "avg"):
                run(dtype, r, shape)
