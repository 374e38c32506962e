"""Probe: every op whose Partial("max"/"min") rules rest on arithmetic (add, sub, rsub,
neg: in-place, out= and foreach variants, alpha, 0-dim and Python-scalar operands) with
int8/uint8/int32/int64 operands whose per-rank values wrap, mixed integer dtypes, bool and
floating controls, and the integer Partial("avg") rows of the same ops (mul, div, neg,
positive, foreach) that "[DTensor] Reduce an integer or bool Partial(sum) DTensor before
an op that computes it in another dtype" reduces.

World size 2, simulated with LocalTensorMode over the fake process group; the truth is
the op on each input's full_tensor().

    python probes/partial_integer_max_min_siblings.py                        stock torch
    python -m tools.cli run -- python probes/partial_integer_max_min_siblings.py

Prints one line per row: name, ok / WRONG / ERROR, collectives, output placement, value;
then the totals.
"""
import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import DTensor, Partial, Replicate, init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

WS = 2
dist.init_process_group("fake", rank=0, world_size=WS)
mesh = init_device_mesh("cpu", (WS,))
mode = LocalTensorMode(frozenset(range(WS)))
aten = torch.ops.aten


def P(dtype, v0, v1, op):
    with mode:
        return DTensor.from_local(
            LocalTensor({0: torch.tensor([v0], dtype=dtype), 1: torch.tensor([v1], dtype=dtype)}),
            mesh, [Partial(op)], run_check=False)


def R(dtype, v):
    with mode:
        return DTensor.from_local(torch.tensor([v], dtype=dtype), mesh, [Replicate()], run_check=False)


def full(x):
    with mode:
        f = x.full_tensor()
    return f._local_tensors[0] if isinstance(f, LocalTensor) else f


def plain(a):
    if isinstance(a, DTensor):
        return full(a)
    if isinstance(a, list):
        return [plain(x) for x in a]
    if isinstance(a, torch.Tensor):
        return a.clone()
    return a


def outcome(res):
    if isinstance(res, (list, tuple)):
        res = res[0]
    return res


rows = []


def run(name, args, fn):
    truth = outcome(fn(*[plain(a) for a in args]))
    comm = CommDebugMode()
    try:
        with mode, comm:
            res = outcome(fn(*args))
        got = full(res)
        ok = torch.equal(got, truth) and got.dtype == truth.dtype
        v = "ok" if ok else "WRONG"
        line = f"{name:58s} {v:5s} coll={comm.get_total_counts()} {res.placements[0]!s:14s} got {got.tolist()} truth {truth.tolist()}"
    except Exception as e:
        v = "ERROR"
        line = f"{name:58s} ERROR {type(e).__name__}: {str(e).splitlines()[0][:70]}"
    rows.append(v)
    print(line)


i8, u8, i32, i64, b, f32 = torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.float32
# (dtype, P(max) locals, R value, P(min) locals, R value for sub) wrap-inducing
ADD = {
    i8: ((100, -100), 50, (-100, 100), 50),
    u8: ((250, 3), 10, (3, 200), 5),
    i32: ((2**31 - 10, -5), 20, (-(2**31) + 10, 5), 20),
    i64: ((2**63 - 10, -5), 20, (-(2**63) + 10, 5), 20),
}
for dt, (mx, rv, mn, sv) in ADD.items():
    n = str(dt).split(".")[1]
    pmax = lambda: P(dt, *mx, "max")
    pmin = lambda: P(dt, *mn, "min")
    run(f"{n} add(P(max), R)", [pmax(), R(dt, rv)], lambda a, c: a + c)
    run(f"{n} add(P(max), R, alpha=2)", [pmax(), R(dt, rv)], lambda a, c: torch.add(a, c, alpha=2))
    run(f"{n} add(P(max), 0-d tensor)", [pmax(), torch.tensor(rv, dtype=dt)], lambda a, c: a + c)
    run(f"{n} add(P(max), python scalar)", [pmax()], lambda a: a + rv)
    run(f"{n} sub(P(min), R)", [pmin(), R(dt, sv)], lambda a, c: a - c)
    run(f"{n} sub(P(max), R(-r))" if dt != u8 else f"{n} sub(P(max), R, alpha=-1)",
        [pmax(), R(dt, -rv if dt != u8 else rv)],
        (lambda a, c: a - c) if dt != u8 else (lambda a, c: torch.sub(a, c, alpha=-1)))
    run(f"{n} rsub(R, P(min)) = P(min) - R", [R(dt, sv), pmin()], lambda c, a: torch.rsub(c, a))
    run(f"{n} add_(P(max), R)", [pmax(), R(dt, rv)], lambda a, c: a.add_(c))
    run(f"{n} sub_(P(min), R)", [pmin(), R(dt, sv)], lambda a, c: a.sub_(c))
    run(f"{n} add(P(max), R, out=P(max))", [pmax(), R(dt, rv), P(dt, 0, 0, "max")], lambda a, c, o: torch.add(a, c, out=o))
    run(f"{n} sub(P(min), R, out=P(min))", [pmin(), R(dt, sv), P(dt, 0, 0, "min")], lambda a, c, o: torch.sub(a, c, out=o))
    run(f"{n} add(P(max), R, out=R)", [pmax(), R(dt, rv), R(dt, 0)], lambda a, c, o: torch.add(a, c, out=o))
    run(f"{n} rsub.Tensor_out(R, P(min))", [R(dt, sv), pmin(), P(dt, 0, 0, "min")], lambda c, a, o: aten.rsub.Tensor_out(c, a, out=o))
    run(f"{n} _foreach_add.List([P(max)], [R])", [[pmax()], [R(dt, rv)]], lambda a, c: torch._foreach_add(a, c))
    run(f"{n} _foreach_add_.List([P(max)], [R])", [[pmax()], [R(dt, rv)]], lambda a, c: torch._foreach_add_(a, c) or a)
    run(f"{n} _foreach_sub.List([P(min)], [R])", [[pmin()], [R(dt, sv)]], lambda a, c: torch._foreach_sub(a, c))
    run(f"{n} _foreach_sub_.List([P(min)], [R])", [[pmin()], [R(dt, sv)]], lambda a, c: torch._foreach_sub_(a, c) or a)
    run(f"{n} _foreach_add.Scalar([P(max)], r)", [[pmax()]], lambda a: torch._foreach_add(a, rv))
    run(f"{n} mul(P(max), 2)", [pmax()], lambda a: a * 2)
# neg
NEG = {i8: ((-128, 5), (5, -128)), u8: ((0, 1), (0, 1)), i32: ((-(2**31), 5), (5, -(2**31))), i64: ((-(2**63), 5), (5, -(2**63)))}
for dt, (mx, mn) in NEG.items():
    n = str(dt).split(".")[1]
    run(f"{n} neg(P(max))", [P(dt, *mx, "max")], lambda a: -a)
    run(f"{n} neg(P(min))", [P(dt, *mn, "min")], lambda a: torch.neg(a))
    run(f"{n} neg_(P(max))", [P(dt, *mx, "max")], lambda a: a.neg_())
    run(f"{n} neg(P(max), out=P(min))", [P(dt, *mx, "max"), P(dt, 0, 0, "min")], lambda a, o: torch.neg(a, out=o))
    run(f"{n} _foreach_neg([P(max)])", [[P(dt, *mx, "max")]], lambda a: torch._foreach_neg(a))
    run(f"{n} _foreach_neg_([P(max)])", [[P(dt, *mx, "max")]], lambda a: torch._foreach_neg_(a) or a)
# mixed dtypes
run("int8 P(max) + int32 R (int32 compute, no wrap)", [P(i8, 100, -100, "max"), R(i32, 50)], lambda a, c: a + c)
run("int8 P(max) + int16 R (int16 compute wraps)", [P(i8, 100, -100, "max"), R(torch.int16, 32700)], lambda a, c: a + c)
run("uint8 P(max) + int8 R (int16 compute)", [P(u8, 250, 3, "max"), R(i8, 10)], lambda a, c: a + c)
run("int32 P(max) + int64 R (int64 compute)", [P(i32, 2**31 - 10, -5, "max"), R(i64, 20)], lambda a, c: a + c)
run("int8 P(max) + float32 R (float compute)", [P(i8, 100, -100, "max"), R(f32, 50.0)], lambda a, c: a + c)
run("int8 P(max) + int8 R, out=int32 P(max)", [P(i8, 100, -100, "max"), R(i8, 50), P(i32, 0, 0, "max")], lambda a, c, o: torch.add(a, c, out=o))
# bool: add is logical or
for mx in ((True, False), (False, False)):
    for rv in (True, False):
        run(f"bool add(P(max) {mx}, R {rv})", [P(b, *mx, "max"), R(b, rv)], lambda a, c: a + c)
        run(f"bool add(P(min) {mx}, R {rv})", [P(b, *mx, "min"), R(b, rv)], lambda a, c: a + c)
        run(f"bool add_(P(max) {mx}, R {rv})", [P(b, *mx, "max"), R(b, rv)], lambda a, c: a.add_(c))
# float controls
run("float32 P(max) + R", [P(f32, 1.5, -3.0, "max"), R(f32, 2.0)], lambda a, c: a + c)
run("float32 P(min) - R", [P(f32, 1.5, -3.0, "min"), R(f32, 2.0)], lambda a, c: a - c)
run("float32 neg(P(max))", [P(f32, 1.5, -3.0, "max")], lambda a: -a)
run("float32 P(max).add_(R)", [P(f32, 1.5, -3.0, "max"), R(f32, 2.0)], lambda a, c: a.add_(c))
run("float32 _foreach_add_([P(max)],[R])", [[P(f32, 1.5, -3.0, "max")], [R(f32, 2.0)]], lambda a, c: torch._foreach_add_(a, c) or a)
run("float16 P(max) + R", [P(torch.float16, 1.5, -3.0, "max"), R(torch.float16, 2.0)], lambda a, c: a + c)
# integer avg
AVG = [i8, i32, i64]
for dt in AVG:
    n = str(dt).split(".")[1]
    run(f"{n} P(avg) + P(avg)", [P(dt, 1, 2, "avg"), P(dt, 1, 2, "avg")], lambda a, c: a + c)
    run(f"{n} P(avg) + R", [P(dt, -9, 4, "avg"), R(dt, 6)], lambda a, c: a + c)
    run(f"{n} R + P(avg)", [R(dt, 6), P(dt, -9, 4, "avg")], lambda c, a: c + a)
    run(f"{n} P(avg) - R", [P(dt, -9, 4, "avg"), R(dt, -6)], lambda a, c: a - c)
    run(f"{n} rsub(R, P(avg))", [R(dt, -6), P(dt, -9, 4, "avg")], lambda c, a: torch.rsub(c, a))
    run(f"{n} rsub(P(avg), R)", [P(dt, -9, 4, "avg"), R(dt, 1)], lambda a, c: torch.rsub(a, c))
    run(f"{n} P(avg) + 0-d", [P(dt, -9, 4, "avg"), torch.tensor(6, dtype=dt)], lambda a, c: a + c)
    run(f"{n} P(avg) + 6 scalar", [P(dt, -9, 4, "avg")], lambda a: a + 6)
    run(f"{n} P(avg) * 2", [P(dt, 1, 2, "avg")], lambda a: a * 2)
    run(f"{n} mul.Scalar(P(avg), 2)", [P(dt, 1, 2, "avg")], lambda a: aten.mul.Scalar(a, 2))
    run(f"{n} P(avg) * R(2)", [P(dt, 1, 2, "avg"), R(dt, 2)], lambda a, c: a * c)
    run(f"{n} R(2) * P(avg)", [R(dt, 2), P(dt, 1, 2, "avg")], lambda c, a: c * a)
    run(f"{n} P(avg).add_(R)", [P(dt, -9, 4, "avg"), R(dt, 6)], lambda a, c: a.add_(c))
    run(f"{n} P(avg).mul_(2)", [P(dt, 1, 2, "avg")], lambda a: a.mul_(2))
    run(f"{n} add(P(avg),R,out=P(avg))", [P(dt, -9, 4, "avg"), R(dt, 6), P(dt, 0, 0, "avg")], lambda a, c, o: torch.add(a, c, out=o))
    run(f"{n} neg(P(avg))", [P(dt, 1, 2, "avg")], lambda a: -a)
    run(f"{n} P(avg) / 2", [P(dt, 1, 2, "avg")], lambda a: a / 2)
    run(f"{n} P(avg) // 2 (floor_divide)", [P(dt, 1, 2, "avg")], lambda a: a // 2)
    run(f"{n} _foreach_add([P(avg)],[R])", [[P(dt, -9, 4, "avg")], [R(dt, 6)]], lambda a, c: torch._foreach_add(a, c))
    run(f"{n} _foreach_mul([P(avg)], 2)", [[P(dt, 1, 2, "avg")]], lambda a: torch._foreach_mul(a, 2))
    run(f"{n} _foreach_neg([P(avg)])", [[P(dt, 1, 2, "avg")]], lambda a: torch._foreach_neg(a))
    run(f"{n} positive(P(avg))", [P(dt, 1, 2, "avg")], lambda a: torch.positive(a))
print("TOTAL", len(rows), {k: rows.count(k) for k in ("ok", "WRONG", "ERROR")})
