"""Re-ask the validator (stock or overlay, whichever runs this) about the fuzz's
candidates: recheck.py FILE.jsonl"""
import json
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import fuzz  # noqa: E402
from harness import verdict  # noqa: E402

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
by_ws = {}
for r in rows:
    by_ws.setdefault(r["ws"], []).append(r)
for ws, rs in by_ws.items():
    fuzz.WS = ws
    dist.init_process_group("fake", rank=0, world_size=ws)
    for r in rs:
        dtype = getattr(torch, r["dtype"])
        ops = {name: (func, args) for name, func, args in fuzz.ops_for(dtype)}
        func, args = ops[r["op"]]
        rule = (tuple(r["rule"][0]), tuple(r["rule"][1]))
        try:
            v, why = verdict(func, args, {}, rule, ws)
        except Exception as e:  # noqa: BLE001
            v, why = "error", str(e)[:80]
        print(f"W={ws} {r['dtype']} {r['op']} {rule}: {v} {why[:60]}", flush=True)
    dist.destroy_process_group()
