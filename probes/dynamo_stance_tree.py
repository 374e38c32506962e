"""Size of the guard tree that torch.compiler.set_stance(skip_guard_eval_unsafe=True)
evaluates (the diff guard tree) on the transformer-like model of
benchmarks/dynamo_module_guards.py, after a recompile for a new input shape.

    python probes/dynamo_stance_tree.py [BLOCKS]                        # stock torch
    python -m tools.cli run -- python probes/dynamo_stance_tree.py [BLOCKS]  # overlay

Prints, per cache entry, the leaf guards of the full tree and of the reduced tree. A
change that only adds diff-guard sources should leave the full tree as it is, and the
reduced tree small (only what tells the entries apart: here the input's shape).
"""

import sys
from pathlib import Path

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from dynamo_module_guards import build_model  # noqa: E402


def leaves(mgr) -> int:
    kids = list(mgr.get_child_managers())
    if hasattr(mgr, "get_key_value_managers"):
        for pair in mgr.get_key_value_managers().values():
            kids += [m for m in pair if m is not None]
    return len(mgr.get_leaf_guards()) + sum(leaves(k) for k in kids)


def main() -> None:
    model = build_model(int(sys.argv[1]) if sys.argv[1:] else 8)
    opt = torch.compile(model, backend="eager", dynamic=False)
    opt(torch.randn(2, 16))
    opt(torch.randn(3, 16))  # recompiles for the new shape
    for i, entry in enumerate(_debug_get_cache_entry_list(type(model).forward.__code__)):
        gm = entry.guard_manager
        print(
            f"entry {i}: full tree {leaves(gm.root)} leaves, "
            f"skip_guard_eval_unsafe tree {leaves(gm.diff_guard_root)} leaves"
        )


if __name__ == "__main__":
    main()
