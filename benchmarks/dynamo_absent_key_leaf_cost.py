"""What the C++ leaf DICT_NOT_CONTAINS_KEYS would cost in guard evaluation, estimated on a
wheel that cannot load it.

    python benchmarks/dynamo_absent_key_leaf_cost.py [--blocks 64] [--reps 2000] [--runs 7]
        [--per-block 64 8 2]

The source-only patch "[dynamo] One leaf for the absent-key checks of a dict:
DICT_NOT_CONTAINS_KEYS" changes torch/csrc/dynamo/guards.cpp, so a wheel cannot run it.
This script compiles the leaf class from the patch text into a small extension (as
test/tools/test_dict_not_contains_keys_leaf.py does), next to a copy of guards.cpp's
``DICT_CONTAINS`` leaf, and times, in C++, what a guard manager's leaf loop does for the
absent-key checks of the benchmark model of benchmarks/dynamo_module_guards.py (same
model, --blocks blocks): for every module ``__dict__`` and the names Dynamo checks absent
there (``forward`` and the names read through ``nn.Module.__getattr__``),

* stock: one ``DICT_CONTAINS(contains=False)`` leaf for ``forward`` only;
* per-name (the shadow PR on a wheel): one ``DICT_CONTAINS`` leaf per name;
* merged (with the C++ leaf): one ``DICT_NOT_CONTAINS_KEYS`` leaf holding all names,
  every name looked up on every check.

It times this for a whole-model compile (one cache entry: each leaf sees the same dict on
every call) and, with --per-block N..., for ``torch.compile`` applied to each block (one
cache entry of Block.forward serves N blocks: its leaves see block b's dicts on call b),
in ns per block call.

Each is a vector of ``shared_ptr<LeafGuard>`` run with virtual calls and an early exit, as
``GuardManager::check_leaf_guards_nopybind`` runs them; the time is the whole pass over all
module dicts (wall time of one thread, median of --runs runs), with warm caches (--reps
passes in a row) and with cold ones (--cold-reps passes, 64 MB evicted before each, as
guards.cpp's ``profile_guard_manager`` does). A real guard evaluation lies in between: its
other leaves (5000 on this model) and accessors evict part of what these leaves touch. It prints the differences,
which are what the leaves add to a guard evaluation; the leaf loop's surroundings (accessors,
the ``__dict__`` lookup, other leaves) are the same in all three and not timed. Compare the
per-name - stock difference with the measured guard-check difference of
benchmarks/dynamo_module_guards.py to see how far the estimate is off.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TIMING = r"""
// A copy of guards.cpp's DICT_CONTAINS leaf (torch 2.15.0), for the per-name layout.
class DICT_CONTAINS : public LeafGuard {
 public:
  DICT_CONTAINS(RootGuardManager* root_guard_manager, bool contains, py::object key,
                py::object verbose_code_parts, py::object user_stack)
      : LeafGuard(root_guard_manager, std::move(verbose_code_parts), std::move(user_stack)),
        _contains(contains ? 1 : 0), _key(std::move(key)) {}
  bool check_nopybind(PyObject* value) override {
    int result = PyDict_Check(value) && PyDict_Contains(value, _key.ptr());
    if (result == -1) {
      PyErr_Clear();
      return false;
    }
    return result == _contains;
  }

 private:
  int _contains;
  py::object _key;
};

#include <chrono>
#include <memory>

// layout: 0 stock (forward only), 1 one DICT_CONTAINS per name, 2 one merged leaf
std::vector<std::shared_ptr<LeafGuard>> make_leaves(py::list keys, int layout) {
  std::vector<std::shared_ptr<LeafGuard>> mine;
  std::shared_ptr<DICT_NOT_CONTAINS_KEYS> merged;
  for (auto key : keys) {
    py::object k = py::reinterpret_borrow<py::object>(key);
    if (layout == 0 && k.cast<std::string>() != "forward") {
      continue;
    }
    if (layout == 2) {
      if (merged) {
        merged->add_key(k, py::list(), py::none());
      } else {
        merged = std::make_shared<DICT_NOT_CONTAINS_KEYS>(nullptr, k, py::list(), py::none());
        mine.push_back(merged);
      }
    } else {
      mine.push_back(std::make_shared<DICT_CONTAINS>(
          nullptr, false, k, py::list(), py::none()));
    }
  }
  return mine;
}

// Whole-model compile: one cache entry, so one set of leaves per module __dict__, each
// seeing the same dict on every call.
double time_leaves(py::list dicts, py::list names, int layout, int reps, bool flush) {
  std::vector<PyObject*> values;
  std::vector<std::vector<std::shared_ptr<LeafGuard>>> leaves;
  for (size_t i = 0; i < dicts.size(); i++) {
    values.push_back(dicts[i].ptr());
    leaves.push_back(make_leaves(names[i].cast<py::list>(), layout));
  }
  int64_t fail_count = 0;
  std::vector<char> buffer(flush ? 64 * 1024 * 1024 : 0, 1);
  volatile char sink = 0;
  std::chrono::duration<double, std::nano> total{0};
  for (int r = 0; r < reps; r++) {
    // cold caches: evict everything the previous pass touched, as in
    // guards.cpp's profile_guard_manager; not timed
    for (size_t b = 0; b < buffer.size(); b += 64) {
      sink ^= buffer[b];
    }
    auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < values.size(); i++) {
      for (const auto& guard : leaves[i]) {
        if (!guard->check_nopybind(values[i])) {
          fail_count += 1;
          break;
        }
      }
    }
    total += std::chrono::steady_clock::now() - start;
  }
  (void)sink;
  TORCH_CHECK(fail_count == 0, "a check failed on the model's own dicts");
  return total.count() / reps;
}

// Per-block compile: torch.compile applied to each block, so one cache entry of
// Block.forward serves every block: one set of leaves per module position in a block,
// and call b checks block b's dicts. Returns ns per block call.
double time_per_block(py::list position_names, py::list dicts_by_block, int layout,
                      int reps) {
  std::vector<std::vector<std::shared_ptr<LeafGuard>>> leaves;
  for (auto keys : position_names) {
    leaves.push_back(make_leaves(keys.cast<py::list>(), layout));
  }
  std::vector<std::vector<PyObject*>> calls;
  for (auto block : dicts_by_block) {
    std::vector<PyObject*> dicts;
    for (auto d : block.cast<py::list>()) {
      dicts.push_back(d.ptr());
    }
    calls.push_back(std::move(dicts));
  }
  int64_t fail_count = 0;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; r++) {
    for (const auto& call : calls) {
      for (size_t p = 0; p < leaves.size(); p++) {
        for (const auto& guard : leaves[p]) {
          if (!guard->check_nopybind(call[p])) {
            fail_count += 1;
            break;
          }
        }
      }
    }
  }
  std::chrono::duration<double, std::nano> total = std::chrono::steady_clock::now() - start;
  TORCH_CHECK(fail_count == 0, "a check failed on the blocks' own dicts");
  return total.count() / reps / calls.size();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("time_leaves", &time_leaves);
  m.def("time_per_block", &time_per_block);
}
"""


def leaf_test_module():
    path = REPO / "test" / "tools" / "test_dict_not_contains_keys_leaf.py"
    spec = importlib.util.spec_from_file_location("leaf_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_extension():
    leaf = leaf_test_module()
    cls = leaf.added_class(leaf.the_patch(), "class DICT_NOT_CONTAINS_KEYS : public LeafGuard {")
    source = leaf.STAND_INS + "#include <c10/util/Exception.h>\n" + cls + TIMING
    return leaf.load_source(source, "absent_key_leaf_cost", "-O2")


def checked_dicts(blocks: int):
    """Each module __dict__ of the benchmark model with the names checked absent there,
    as a compile with the shadow PR installs them (read from its guards)."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    from dynamo_module_guards import build_model

    model = build_model(blocks)
    root = {"": model}
    root.update({name: m for name, m in model.named_modules() if name})
    # the names each module type's forward reads, `forward` for every called module
    reads = {
        "Model": ["layers", "norm", "output"],
        "ModuleList": ["__iter__"],
        "Block": ["forward", "attention_norm", "attention", "ffn_norm", "feed_forward"],
        "Attention": ["forward", "wq", "wk", "wv", "wo"],
        "FeedForward": ["forward", "w1", "w2", "w3"],
        "Linear": ["forward", "weight", "bias"],
        "RMSNorm": ["forward", "weight"],
    }
    del torch
    dicts, names = [], []
    for module in root.values():
        dicts.append(module.__dict__)
        names.append([str(n) for n in reads[type(module).__name__]])
    return dicts, names


def per_block_dicts(blocks: int):
    """Per-block compile (torch.compile applied to each block): the one cache entry of
    Block.forward checks, for each module position in a block, the names read there
    (the root block's own `forward` is the frame, not read through __getattr__), on
    block b's dicts on call b."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from dynamo_module_guards import build_model

    model = build_model(blocks)
    layers = list(model.layers)
    reads = {
        "Block": ["attention_norm", "attention", "ffn_norm", "feed_forward"],
        "Attention": ["forward", "wq", "wk", "wv", "wo"],
        "FeedForward": ["forward", "w1", "w2", "w3"],
        "Linear": ["forward", "weight", "bias"],
        "RMSNorm": ["forward", "weight"],
    }
    paths = [name for name, _ in layers[0].named_modules()]
    names = [
        [sys.intern(n) for n in reads[type(layers[0].get_submodule(p)).__name__]] for p in paths
    ]
    dicts = [[layer.get_submodule(p).__dict__ for p in paths] for layer in layers]
    return names, dicts, model


LAYOUTS = {"stock": 0, "per-name": 1, "merged": 2}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--cold-reps", type=int, default=100, help="passes with caches evicted before each"
    )
    parser.add_argument(
        "--per-block",
        type=int,
        nargs="*",
        default=[64, 8, 2],
        help="block counts for the per-block compile case",
    )
    args = parser.parse_args()
    ext = build_extension()
    dicts, names = checked_dicts(args.blocks)
    # Dynamo's keys are interned strs (hash cached), as in the guards it builds
    names = [[sys.intern(n) for n in keys] for keys in names]
    layouts = LAYOUTS
    leaves = {
        "stock": sum("forward" in n for n in names),
        "per-name": sum(len(n) for n in names),
        "merged": sum(1 for n in names if n),
    }
    print(
        f"whole-model compile, {args.blocks} blocks: {len(dicts)} module dicts, "
        f"{leaves['per-name']} names checked absent; us per pass over all of them, one "
        f"thread (median of {args.runs} runs)"
    )
    for caches, reps, flush in (("warm", args.reps, False), ("cold", args.cold_reps, True)):
        times: dict[str, list[float]] = {k: [] for k in layouts}
        for _ in range(args.runs):
            for label, layout in layouts.items():
                times[label].append(ext.time_leaves(dicts, names, layout, reps, flush) / 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{caches} caches ({reps} passes per run):")
        for label in layouts:
            print(
                f"  {label:12} {leaves[label]:5} leaves  {med[label]:8.1f} us"
                f"  ({med[label] - med['stock']:+.1f} us against stock)"
            )
    for n in args.per_block:
        position_names, block_dicts, _model = per_block_dicts(n)
        med = {}
        for label, layout in layouts.items():
            med[label] = statistics.median(
                ext.time_per_block(position_names, block_dicts, layout, max(1, 4000 // n))
                for _ in range(args.runs)
            )
        print(
            f"per-block compile, {n} blocks sharing one Block.forward entry "
            f"({len(position_names)} module dicts per block), ns per block call, warm: "
            + "  ".join(
                f"{label} {med[label]:.0f} ({med[label] - med['stock']:+.0f})" for label in layouts
            )
        )


if __name__ == "__main__":
    main()
