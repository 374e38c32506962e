"""Fuzz: every rule (input placements x output placement) of small int/bool samples;
print the ones the validator accepts (not reported, untestable included) and that an
independent oracle (random splits, any prime for products) shows wrong on the sample.

usage: fuzz.py WORLD_SIZE GROUP [--only name,...]
Run under the overlay to find candidates; then recheck.py runs them on stock."""
import itertools
import json
import sys
import zlib

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, "/work/wt-rev25b")
from tools import mutations as M  # noqa: E402

aten = torch.ops.aten


def samples(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(6, 6, generator=g) > 0.5, torch.rand(6, 6, generator=g) > 0.5
    if dtype == torch.uint8:
        return (torch.randint(0, 256, (6, 6), generator=g).to(dtype),
                torch.randint(1, 256, (6, 6), generator=g).to(dtype))
    if dtype == torch.int8:
        x = torch.randint(-128, 128, (6, 6), generator=g).to(dtype)
        x[0, 0], x[0, 1] = -128, 127
        return x, torch.randint(-128, 128, (6, 6), generator=g).to(dtype)
    x = torch.randint(-40, 41, (6, 6), generator=g).to(dtype)
    x[1, 1] = 0
    x[2, 2] = 17 * 17
    return x, torch.randint(-40, 41, (6, 6), generator=g).to(dtype)


def ops_for(dtype):
    x, y = samples(dtype)
    b = dtype == torch.bool
    u = [
        ("clone", aten.clone.default, (x,)), ("sum", aten.sum.default, (x,)),
        ("sum.dim1", aten.sum.dim_IntList, (x, [1])), ("amax1", aten.amax.default, (x, [1])),
        ("amin1", aten.amin.default, (x, [1])), ("prod", aten.prod.default, (x,)),
        ("cnz", aten.count_nonzero.default, (x,)), ("eq0", aten.eq.Scalar, (x, 0)),
        ("ne0", aten.ne.Scalar, (x, 0)), ("all", aten.all.default, (x,)),
        ("any", aten.any.default, (x,)), ("any1", aten.any.dim, (x, 1)),
        ("all1", aten.all.dim, (x, 1)), ("cumsum1", aten.cumsum.default, (x, 1)),
        ("cumprod1", aten.cumprod.default, (x, 1)), ("logical_not", aten.logical_not.default, (x,)),
        ("bitwise_not", aten.bitwise_not.default, (x,)),
        ("band_s", aten.bitwise_and.Scalar, (x, 1 if b else 6)),
        ("bor_s", aten.bitwise_or.Scalar, (x, True if b else 5)),
        ("bxor_s", aten.bitwise_xor.Scalar, (x, True if b else 3)),
        ("max.dim", aten.max.dim, (x, 1)), ("min.dim", aten.min.dim, (x, 1)),
        ("argmax1", aten.argmax.default, (x, 1)),
        ("mul_t", aten.mul.Tensor, (x, y)), ("add_t", aten.add.Tensor, (x, y)),
        ("maximum", aten.maximum.default, (x, y)), ("minimum", aten.minimum.default, (x, y)),
        ("band", aten.bitwise_and.Tensor, (x, y)), ("bor", aten.bitwise_or.Tensor, (x, y)),
        ("bxor", aten.bitwise_xor.Tensor, (x, y)), ("eq", aten.eq.Tensor, (x, y)),
        ("lt", aten.lt.Tensor, (x, y)), ("logical_and", aten.logical_and.default, (x, y)),
        ("logical_or", aten.logical_or.default, (x, y)), ("logical_xor", aten.logical_xor.default, (x, y)),
    ]
    if not b:
        u += [
            ("neg", aten.neg.default, (x,)), ("abs", aten.abs.default, (x,)),
            ("sign", aten.sign.default, (x,)), ("square", aten.square.default, (x,)),
            ("mul3", aten.mul.Scalar, (x, 3)), ("add1", aten.add.Scalar, (x, 1)),
            ("rem3", aten.remainder.Scalar, (x, 3)), ("fdiv4", aten.floor_divide.Scalar, (x, 4)),
            ("lshift2", aten.__lshift__.Scalar, (x, 2)), ("rshift2", aten.__rshift__.Scalar, (x, 2)),
            ("clamp", aten.clamp.default, (x, -5, 5)), ("gcd", aten.gcd.default, (x, y)),
            ("sub_t", aten.sub.Tensor, (x, y)), ("mm", aten.mm.default, (x, y)),
            ("gt0", aten.gt.Scalar, (x, 0)), ("relu", aten.relu.default, (x,)),
        ]
    else:
        u += [("where", aten.where.self, (x, x, y)), ("sum_b", aten.sum.dim_IntList, (x, [0])),
              ("mul_b", aten.mul.Tensor, (x, y)), ("add_b", aten.add.Tensor, (x, y)),
              ("ne_t", aten.ne.Tensor, (x, y))]
    return u


def reduce_ops(dtype):
    if dtype == torch.bool:
        return ("sum", "product", "min", "max", "band", "bor", "bxor")
    return ("sum", "avg", "min", "max", "product", "band", "bor", "bxor")


def outputs_for(gt, dtype):
    outs = ["R"] + [f"S({d})" for d in range(gt.ndim) if gt.shape[d] % WS == 0 and gt.shape[d] > 1]
    outs += [f"P({r})" for r in ("sum", "avg", "min", "max", "product", "band", "bor", "bxor")]
    return outs


def divisors_split(x, n, gen):
    """product split: ranks 1.. hold random divisors (any prime), random sign."""
    rest, pieces = x.clone(), []
    for _ in range(n - 1):
        f = torch.ones_like(x)
        flat_rest = rest.flatten().tolist()
        fl = []
        for v in flat_rest:
            v = abs(int(v))
            if v == 0:
                fl.append(int(torch.randint(1, 5, (1,), generator=gen)))
                continue
            ds = [d for d in range(1, v + 1) if v % d == 0] if v < 5000 else [1]
            fl.append(ds[int(torch.randint(0, len(ds), (1,), generator=gen))])
        f = torch.tensor(fl, dtype=x.dtype).reshape(x.shape)
        if x.is_signed():
            f = torch.where(torch.rand(x.shape, generator=gen) > 0.5, f, -f)
        pieces.append(f)
        rest = torch.div(rest, f, rounding_mode="trunc")
    return [rest, *pieces]


_orig_split = M._split


def split(x, placement, world_size, gen):
    kind, arg = M._parse(placement)
    if kind == "P" and arg == "product" and not x.is_floating_point() and x.dtype != torch.bool:
        return divisors_split(x, world_size, gen)
    if kind == "P" and arg == "avg" and x.dtype == torch.bool:
        raise ValueError("no bool avg")
    if kind == "P" and arg in ("band", "bor", "bxor") and x.dtype == torch.bool:
        kind2 = {"band": "min", "bor": "max"}.get(arg, arg)
        return _orig_split(x, f"P({kind2})", world_size, gen)
    if kind == "P" and arg in ("band", "bor", "bxor") and x.dtype == torch.uint8:
        return _orig_split(x, placement, world_size, gen)
    return _orig_split(x, placement, world_size, gen)


M._split = split


def sample_witness(func, args, kwargs, rule, dtype, tries=40):
    """witness on the sample itself only (trial 0), many random splits."""
    ins, outs = rule
    tensors = M._tensor_leaves(args, kwargs)
    gen = torch.Generator().manual_seed(zlib.crc32(repr((str(func), rule)).encode()))
    truth = func(*args, **kwargs)
    truths = list(truth) if isinstance(truth, (list, tuple)) else [truth]
    for _ in range(tries):
        try:
            per_input = [split(v, p, WS, gen) for v, p in zip(tensors, ins)]
            per_rank = []
            for r in range(WS):
                a, k = M._replace(args, kwargs, [pieces[r] for pieces in per_input])
                res = func(*a, **k)
                per_rank.append(list(res) if isinstance(res, (list, tuple)) else [res])
        except Exception:
            return ""
        for j, (t, p) in enumerate(zip(truths, outs)):
            try:
                full = M._combine([per_rank[r][j] for r in range(WS)], p)
            except Exception:
                full = None
            if full is None:
                return f"output {j} {p}: ranks disagree on R"
            if full.shape != t.shape:
                return f"output {j} {p}: shape"
            if t.is_floating_point():
                bad = ~((t.double() - full.double()).abs() <= 1e-3 * (1 + t.double().abs()))
            else:
                bad = t != full
            if bool(bad.any()):
                i = int(bad.flatten().nonzero()[0])
                return (f"output {j} {p}: element {i} is {full.flatten()[i].item()!r}, should be "
                        f"{t.flatten()[i].item()!r}; ranks {[pr[j].flatten()[i].item() for pr in per_rank]}")
    return ""


def main():
    global WS
    WS = int(sys.argv[1])
    dtype = getattr(torch, sys.argv[2])
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    import torch.distributed.tensor._ops.strategy_validation as sv
    dist.init_process_group("fake", rank=0, world_size=WS)
    ins_opts = ["R", "S(0)"] + [f"P({r})" for r in reduce_ops(dtype)]
    for name, func, args in ops_for(dtype):
        if only and name not in only:
            continue
        kwargs = {}
        try:
            result = func(*args)
        except Exception as e:
            print(f"# {name}: {e}", file=sys.stderr)
            continue
        gt = sv._to_ground_truth(result)
        gts = gt if isinstance(gt, list) else [gt]
        tensors = sv.extract_tensors_from_args(args, kwargs)
        outs = outputs_for(gts[0], dtype)
        rules = set()
        for combo in itertools.product(ins_opts, repeat=len(tensors)):
            if all(c == "R" for c in combo):
                continue
            if len(tensors) == 2 and not (combo[1] in ("R", "S(0)") or combo[0] in ("R", "S(0)") or combo[0] == combo[1]):
                continue
            for o in outs:
                rules.add((tuple(combo), tuple(o for _ in gts)))
        original = sv._query_dtensor_rules
        sv._query_dtensor_rules = lambda *a, **k: set(rules)
        stats = sv.ComparisonStats()
        try:
            sv._validate_aten_op_for_sample(func, args, kwargs, gt, WS, True, False, 0, "", stats)
        finally:
            sv._query_dtensor_rules = original
        killed = {(tuple(d.input_placements), tuple(d.output_placements)) for d in stats.false_positives}
        accepted = rules - killed
        n_wrong = 0
        for rule in sorted(accepted):
            w = sample_witness(func, args, kwargs, rule, dtype)
            if w:
                n_wrong += 1
                print(json.dumps({"ws": WS, "dtype": sys.argv[2], "op": name, "rule": rule, "witness": w}), flush=True)
        print(f"# {name}: {len(rules)} rules, {len(killed)} killed, {len(accepted)} accepted, {n_wrong} wrong", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
