"""Right contraction rules stay accepted by the strategy validator (0040's exact check):
DTensor's registered rules for mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot, addr,
matmul, einsum, inner and tensordot on their OpInfo samples (6 each) and on adversarial
float64-built samples (rows of +-big pairs cancelling to 1e-3, alpha/beta, magnitudes
1e-6..1e6 mixed, a bias cancelling the product); the validator's per-sample path
(incorrect-only, every mitigation) with the exact contraction check on and off; prints the
reports per world size and dtype and any rule reported only with it ("NEW"). Overlay only:

    python -m tools.cli run -- python probes/strategy_validator_right_contractions.py \
        [float64,float32,bfloat16] [2,3,4]
"""

import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.distributed.tensor._ops.strategy_validation as sv

aten = torch.ops.aten
f64 = torch.float64
ORIG = sv._exact_contraction_key


def samples(dtype):
    out = []
    for name in (
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "addr",
        "matmul",
        "einsum",
        "inner",
        "tensordot",
    ):
        for o_i, opinfo in enumerate(sv.get_opinfo_by_name(name)):
            if not opinfo.supports_dtype(dtype, "cpu"):
                continue
            torch.manual_seed(zlib.crc32(f"{name}/{o_i}".encode()))
            try:
                ss = list(opinfo.sample_inputs("cpu", dtype))[:6]
            except Exception:
                continue
            for s in ss:
                tensors = sv.extract_tensors_from_sample(s)
                if not tensors or any(0 in t.shape for _, t in tensors):
                    continue
                cap = sv.get_aten_op_for_sample(opinfo.op, s, opinfo.name)
                sup = [c for c in cap.all_ops if sv._has_dtensor_support(c[0])]
                if len(sup) != 1:
                    continue
                func, args, kwargs, result = sup[0]
                out.append((f"opinfo {name}", func, args, kwargs))
    # adversarial: cancelling rows, wide magnitudes, a bias that cancels the product
    g = torch.Generator().manual_seed(1)

    def cancel(shape, big):
        x = (torch.rand(shape, generator=g, dtype=f64) + 0.5) * big
        x[..., 1::2] = -x[..., 0::2]
        x[..., 0] += 1e-3
        return x

    for big in (1e4, 1e9, 1e12):
        for K in (4, 16, 64):
            A = cancel((4, K), big).to(dtype)
            B = torch.randn(K, 4, generator=g, dtype=f64).to(dtype)
            ones = torch.ones(K, 4, dtype=dtype)
            bias = (torch.randn(4, 4, generator=g, dtype=f64) * 1e-4).to(dtype)
            out.append((f"adv mm cancel {big:g} K{K}", aten.mm.default, (A, ones), {}))
            out.append((f"adv mm cancel-randB {big:g} K{K}", aten.mm.default, (A, B), {}))
            out.append((f"adv addmm cancel {big:g} K{K}", aten.addmm.default, (bias, A, ones), {}))
            out.append(
                (
                    f"adv addmm ab {big:g} K{K}",
                    aten.addmm.default,
                    (bias, A, ones),
                    {"beta": 0.3, "alpha": -1.7},
                )
            )
            A3 = cancel((2, 4, K), big).to(dtype)
            out.append(
                (
                    f"adv bmm {big:g} K{K}",
                    aten.bmm.default,
                    (A3, torch.ones(2, K, 4, dtype=dtype)),
                    {},
                )
            )
            out.append(
                (
                    f"adv baddbmm {big:g} K{K}",
                    aten.baddbmm.default,
                    (
                        torch.full((2, 4, 4), 1e-4, dtype=dtype),
                        A3,
                        torch.ones(2, K, 4, dtype=dtype),
                    ),
                    {},
                )
            )
            out.append(
                (
                    f"adv addbmm {big:g} K{K}",
                    aten.addbmm.default,
                    (torch.full((4, 4), 1e-4, dtype=dtype), A3, torch.ones(2, K, 4, dtype=dtype)),
                    {},
                )
            )
            v = cancel((K,), big).to(dtype)
            out.append(
                (f"adv mv {big:g} K{K}", aten.mv.default, (A, torch.ones(K, dtype=dtype)), {})
            )
            out.append(
                (
                    f"adv addmv {big:g} K{K}",
                    aten.addmv.default,
                    (torch.full((4,), 1e-4, dtype=dtype), A, torch.ones(K, dtype=dtype)),
                    {},
                )
            )
            out.append(
                (f"adv dot {big:g} K{K}", aten.dot.default, (v, torch.ones(K, dtype=dtype)), {})
            )
        w = torch.randn(6, 6, generator=g, dtype=f64) * torch.pow(
            10.0, torch.randint(-6, 7, (6, 6), generator=g).double()
        )
        out.append(
            (
                f"adv mm wide {big:g}",
                aten.mm.default,
                (w.to(dtype), w.t().contiguous().to(dtype)),
                {},
            )
        )
        m = torch.randn(4, 6, generator=g, dtype=f64) * big
        p = m @ torch.ones(6, 4, dtype=f64)
        out.append(
            (
                f"adv addmm bias=-prod {big:g}",
                aten.addmm.default,
                ((-p + 1e-3).to(dtype), m.to(dtype), torch.ones(6, 4, dtype=dtype)),
                {},
            )
        )
        u = torch.randn(4, generator=g, dtype=f64) * big
        out.append(
            (
                f"adv addr {big:g}",
                aten.addr.default,
                ((-torch.outer(u, u)).to(dtype), u.to(dtype), u.to(dtype)),
                {},
            )
        )
    return out


def run(dtype, ws, on):
    sv._exact_contraction_key = ORIG if on else (lambda op: None)
    reported = {}
    checked = 0
    for name, func, args, kwargs in SAMPLES[dtype]:
        gt = sv._to_ground_truth(func(*args, **kwargs))
        stats = sv.ComparisonStats()
        try:
            sv._validate_aten_op_for_sample(func, args, kwargs, gt, ws, True, False, 0, "", stats)
        except Exception as e:
            print("ERR", name, e)
            continue
        checked += 1
        for fp in stats.false_positives:
            reported.setdefault(name, []).append(
                str(getattr(fp, "input_placements", fp))[:60]
                + "->"
                + str(getattr(fp, "output_placements", ""))[:30]
            )
    return checked, reported


dtypes = [
    getattr(torch, d)
    for d in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["float64", "float32", "bfloat16"])
]
SAMPLES = {d: samples(d) for d in dtypes}
for ws in [int(w) for w in sys.argv[2].split(",")] if len(sys.argv) > 2 else (2, 3, 4):
    dist.init_process_group("fake", rank=0, world_size=ws)
    try:
        for d in dtypes:
            res = {}
            for on in (False, True):
                t = time.process_time()
                checked, rep = run(d, ws, on)
                res[on] = rep
                print(
                    f"W={ws} {d} exact={'on' if on else 'off'}: samples {checked}, samples with a reported registered rule {len(rep)}, reports {sum(map(len, rep.values()))}, {time.process_time() - t:.1f} s",
                    flush=True,
                )
            new = {k: v for k, v in res[True].items() if res[False].get(k) != v}
            for k, v in new.items():
                print("   NEW with exact:", k, v[:4], "off:", res[False].get(k, [])[:4])
    finally:
        dist.destroy_process_group()
