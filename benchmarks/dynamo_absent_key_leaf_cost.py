"""What the C++ leaf DICT_NOT_CONTAINS_KEYS would cost in guard evaluation, estimated on a
wheel that cannot load it.

    python benchmarks/dynamo_absent_key_leaf_cost.py [--blocks 64] [--reps 2000] [--runs 7]

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
* merged (with the C++ leaf): one ``DICT_NOT_CONTAINS_KEYS`` leaf holding all names, which
  on this Python (before 3.12) skips its lookups while the dict keeps the version tag it
  last passed with;
* merged-312: the same leaf compiled as for Python 3.12+, which looks every name up.

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
import hashlib
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

// layout: 0 stock (forward only), 1 one DICT_CONTAINS per name, 2 one merged leaf,
// 3 one merged leaf without the version-tag fast path (as on Python 3.12+)
double time_leaves(py::list dicts, py::list names, int layout, int reps, bool flush) {
  std::vector<PyObject*> values;
  std::vector<std::vector<std::shared_ptr<LeafGuard>>> leaves;
  py::list no_parts;
  for (size_t i = 0; i < dicts.size(); i++) {
    values.push_back(dicts[i].ptr());
    std::vector<std::shared_ptr<LeafGuard>> mine;
    py::list keys = names[i].cast<py::list>();
    std::shared_ptr<DICT_NOT_CONTAINS_KEYS> merged;
    std::shared_ptr<DICT_NOT_CONTAINS_KEYS_312> merged_312;
    for (auto key : keys) {
      py::object k = py::reinterpret_borrow<py::object>(key);
      if (layout == 0 && k.cast<std::string>() != "forward") {
        continue;
      }
      if (layout == 2) {
        if (merged) {
          merged->add_key(k, py::list(), py::none());
        } else {
          merged = std::make_shared<DICT_NOT_CONTAINS_KEYS>(
              nullptr, k, py::list(), py::none());
          mine.push_back(merged);
        }
      } else if (layout == 3) {
        if (merged_312) {
          merged_312->add_key(k, py::list(), py::none());
        } else {
          merged_312 = std::make_shared<DICT_NOT_CONTAINS_KEYS_312>(
              nullptr, k, py::list(), py::none());
          mine.push_back(merged_312);
        }
      } else {
        mine.push_back(std::make_shared<DICT_CONTAINS>(
            nullptr, false, k, py::list(), py::none()));
      }
    }
    leaves.push_back(std::move(mine));
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("time_leaves", &time_leaves);
}
"""


def leaf_test_module():
    path = REPO / "test" / "tools" / "test_dict_not_contains_keys_leaf.py"
    spec = importlib.util.spec_from_file_location("leaf_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_extension():
    from torch.utils import cpp_extension

    leaf = leaf_test_module()
    cls = leaf.added_class(leaf.the_patch(), "class DICT_NOT_CONTAINS_KEYS : public LeafGuard {")
    # The same class as Python 3.12+ compiles it (no version-tag fast path).
    lookups_only = (
        '#pragma push_macro("IS_PYTHON_3_12_PLUS")\n#undef IS_PYTHON_3_12_PLUS\n'
        "#define IS_PYTHON_3_12_PLUS 1\n"
        + cls.replace("DICT_NOT_CONTAINS_KEYS", "DICT_NOT_CONTAINS_KEYS_312")
        + '#pragma pop_macro("IS_PYTHON_3_12_PLUS")\n'
    )
    source = leaf.STAND_INS + "#include <c10/util/Exception.h>\n" + cls + lookups_only + TIMING
    name = f"absent_key_leaf_cost_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    build_dir = REPO / "build" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "cost.cpp").write_text(source)
    return cpp_extension.load(
        name=name,
        sources=[str(build_dir / "cost.cpp")],
        extra_cflags=["-O2"],
        build_directory=str(build_dir),
        verbose=False,
    )


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
    args = parser.parse_args()
    ext = build_extension()
    dicts, names = checked_dicts(args.blocks)
    # Dynamo's keys are interned strs (hash cached), as in the guards it builds
    names = [[sys.intern(n) for n in keys] for keys in names]
    layouts = {"stock": 0, "per-name": 1, "merged": 2, "merged-312": 3}
    leaves = {
        "stock": sum("forward" in n for n in names),
        "per-name": sum(len(n) for n in names),
        "merged": sum(1 for n in names if n),
        "merged-312": sum(1 for n in names if n),
    }
    print(
        f"{args.blocks} blocks: {len(dicts)} module dicts, {leaves['per-name']} names checked "
        f"absent; us per pass over all of them, one thread (median of {args.runs} runs)"
    )
    for caches, reps, flush in (("warm", args.reps, False), ("cold", args.cold_reps, True)):
        times: dict[str, list[float]] = {k: [] for k in layouts}
        for _ in range(args.runs):
            for label, layout in layouts.items():
                times[label].append(ext.time_leaves(dicts, names, layout, reps, flush) / 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{caches} caches ({reps} passes per run):")
        for label in layouts:
            print(f"  {label:9} {leaves[label]:5} leaves  {med[label]:8.1f} us")
        print(f"  per-name - stock: {med['per-name'] - med['stock']:+.1f} us")
        print(f"  merged   - stock: {med['merged'] - med['stock']:+.1f} us")
        print(f"  merged-312 - stock: {med['merged-312'] - med['stock']:+.1f} us")


if __name__ == "__main__":
    main()
