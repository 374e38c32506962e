# Owner(s): ["module: tools"]
"""The leaf that the source-only patch "[dynamo] One leaf for the absent-key checks of a
dict: DICT_NOT_CONTAINS_KEYS" adds to torch/csrc/dynamo/guards.cpp, tested up to the
boundary a wheel allows.

The class is compiled from the patch text into a small extension, next to minimal
stand-ins for guards.cpp's ``LeafGuard`` and ``GuardDebugInfo`` (same constructors and
members the class uses), and compared with the wheel's own ``DICT_CONTAINS`` leaf with
``contains=False``, key by key: the merged leaf must pass exactly when every per-key leaf
passes, on dicts and non-dicts; a lookup that raises fails the check with the error
cleared (the wheel's ``DICT_CONTAINS`` fails it with the error left set); ``check_verbose``
must name the first key present, with that key's code parts and user stack; the leaf's
``verbose_code_parts()`` must be every key's, in order; every check must look every key
up (no state kept between checks: the class has no preprocessor branch and reads no dict
version), so a write to a dict (also an empty ``__dict__`` filled by ``update()``,
``dict.__init__`` or ``|=``), another dict, or a new dict at a freed address is seen, also
with many dicts in turn. The ``add_dict_not_contains_key_guard`` lambda is
compiled from the patch text too, against stand-ins of ``GuardManager`` and
``DictGuardManager`` (their members the lambda uses, copied): keys of one manager join
one leaf next to other leaves, another manager gets its own, a ``DictGuardManager``
permits it, and a clone (sharing leaf objects, as ``clone_common`` does) shares the leaf.
What this does not cover: guards.cpp's real GuardManager and accessors; the binding is
tested by
test/dynamo/test_guard_manager_dict_not_contains_keys.py in a source build.
"""

import hashlib
import shutil
from functools import cache
from pathlib import Path

from torch._C._dynamo.guards import DICT_CONTAINS
from torch.testing._internal.common_utils import TestCase, run_tests

from tools.base import read_patch, read_pin, source_only_series

REPO = Path(__file__).resolve().parents[2]
SUBJECT = "[dynamo] One leaf for the absent-key checks of a dict: DICT_NOT_CONTAINS_KEYS"

STAND_INS = r"""
#include <Python.h>
#include <torch/csrc/utils/python_compat.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
namespace py = pybind11;

class RootGuardManager;

// As in guards.cpp, reduced to what DICT_NOT_CONTAINS_KEYS uses.
struct GuardDebugInfo {
  GuardDebugInfo(bool result, py::list verbose_code_parts, int num_guards_executed,
                 py::object user_stack = py::none())
      : result(result), verbose_code_parts(std::move(verbose_code_parts)),
        num_guards_executed(num_guards_executed), user_stack(std::move(user_stack)) {}
  GuardDebugInfo(bool result, int num_guards_executed)
      : result(result), num_guards_executed(num_guards_executed), user_stack(py::none()) {}
  bool result;
  py::list verbose_code_parts;
  int num_guards_executed;
  py::object user_stack;
};

class LeafGuard {
 public:
  LeafGuard(RootGuardManager* root_guard_manager, py::object verbose_code_parts,
            py::object user_stack)
      : _root_guard_manager(root_guard_manager),
        _verbose_code_parts(std::move(verbose_code_parts)),
        _user_stack(std::move(user_stack)) {}
  bool check(py::handle value) { return check_nopybind(value.ptr()); }
  virtual GuardDebugInfo check_verbose_nopybind(PyObject* value) {
    bool result = check_nopybind(value);
    if (!result) {
      return GuardDebugInfo(result, _verbose_code_parts, 0, _user_stack);
    }
    return GuardDebugInfo(true, 0);
  }
  py::list verbose_code_parts() { return _verbose_code_parts; }
  virtual bool check_nopybind(PyObject* value) = 0;
  virtual ~LeafGuard() = default;

 protected:
  RootGuardManager* _root_guard_manager{nullptr};

 private:
  py::list _verbose_code_parts;
  py::object _user_stack;
};
"""

MANAGERS = r"""
// As guards.cpp's GuardManager and DictGuardManager, reduced to what the
// add_dict_not_contains_key_guard binding uses (same members, same bodies), plus the
// leaf part of clone_common (a clone shares the leaf objects) and the leaf loop of
// check_leaf_guards_nopybind.
class GuardManager {
 public:
  explicit GuardManager(RootGuardManager* root) : _root(root) {}
  virtual ~GuardManager() = default;
  RootGuardManager* get_root() { return _root; }
  virtual void add_leaf_guard(std::shared_ptr<LeafGuard> leaf_guard) {
    _leaf_guards.emplace_back(std::move(leaf_guard));
  }
  std::vector<LeafGuard*> get_leaf_guards() const {
    std::vector<LeafGuard*> ret;
    ret.reserve(_leaf_guards.size());
    for (const auto& guard : _leaf_guards) {
      ret.push_back(guard.get());
    }
    return ret;
  }
  void add_permitted_leaf_guard(std::shared_ptr<LeafGuard> leaf_guard) {
    GuardManager::add_leaf_guard(std::move(leaf_guard));
  }
  std::shared_ptr<GuardManager> clone_leaves() {
    auto cloned = std::make_shared<GuardManager>(_root);
    for (const auto& guard : _leaf_guards) {
      cloned->_leaf_guards.emplace_back(guard);
    }
    return cloned;
  }
  bool check(py::handle value) {
    for (const auto& guard : _leaf_guards) {
      if (!guard->check_nopybind(value.ptr())) {
        return false;
      }
    }
    return true;
  }
  std::vector<std::shared_ptr<LeafGuard>> _leaf_guards;

 private:
  RootGuardManager* _root;
};

class DictGuardManager : public GuardManager {
 public:
  using GuardManager::GuardManager;
  void add_leaf_guard(std::shared_ptr<LeafGuard> leaf_guard) override {
    TORCH_CHECK(false, "DictGuardManager does not support a leaf_guard");
  }
};

// Another leaf next to DICT_NOT_CONTAINS_KEYS: passes on a dict.
class IS_DICT : public LeafGuard {
 public:
  IS_DICT() : LeafGuard(nullptr, py::list(), py::none()) {}
  bool check_nopybind(PyObject* value) override {
    return PyDict_Check(value);
  }
};
"""

BINDINGS = r"""
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<DICT_NOT_CONTAINS_KEYS, std::shared_ptr<DICT_NOT_CONTAINS_KEYS>>(
      m, "DICT_NOT_CONTAINS_KEYS")
      .def(py::init([](py::object key, py::list parts, py::object stack) {
        return std::make_shared<DICT_NOT_CONTAINS_KEYS>(
            nullptr, std::move(key), std::move(parts), std::move(stack));
      }))
      .def("add_key", &DICT_NOT_CONTAINS_KEYS::add_key)
      .def("__call__", &DICT_NOT_CONTAINS_KEYS::check)
      .def("verbose_code_parts", &DICT_NOT_CONTAINS_KEYS::verbose_code_parts)
      .def("check_verbose", [](DICT_NOT_CONTAINS_KEYS& self, py::handle value) {
        GuardDebugInfo info = self.check_verbose_nopybind(value.ptr());
        return py::make_tuple(info.result, info.verbose_code_parts, info.user_stack);
      });
  py::class_<GuardManager, std::shared_ptr<GuardManager>>(m, "GuardManager")
      .def(py::init([]() { return std::make_shared<GuardManager>(nullptr); }))
      .def("add_dict_not_contains_key_guard", BINDING_LAMBDA)
      .def("add_is_dict_guard",
           [](GuardManager& self) { self.add_leaf_guard(std::make_shared<IS_DICT>()); })
      .def("clone", &GuardManager::clone_leaves)
      .def("check", &GuardManager::check)
      .def("leaves", [](GuardManager& self) {
        // each leaf: the DICT_NOT_CONTAINS_KEYS object, or the other leaf's name
        py::list out;
        for (const auto& guard : self._leaf_guards) {
          if (auto leaf = std::dynamic_pointer_cast<DICT_NOT_CONTAINS_KEYS>(guard)) {
            out.append(py::cast(leaf));
          } else {
            out.append("IS_DICT");
          }
        }
        return out;
      });
  py::class_<DictGuardManager, GuardManager, std::shared_ptr<DictGuardManager>>(
      m, "DictGuardManager")
      .def(py::init([]() { return std::make_shared<DictGuardManager>(nullptr); }));
}
"""


def the_patch() -> str:
    pin = read_pin(REPO)
    for name in source_only_series(REPO, pin):
        text = read_patch(REPO, name).decode()
        if SUBJECT.split(": ")[0] in text and "DICT_NOT_CONTAINS_KEYS" in text:
            return text
    raise AssertionError(f"no source-only patch '{SUBJECT}' in the series")


def added_class(patch: str, head: str) -> str:
    """The lines a patch adds for one class, from its head to its closing `};`."""
    added = [line[1:] for line in patch.splitlines() if line.startswith("+")]
    start = added.index(head)
    end = added.index("};", start)
    return "\n".join(added[start : end + 1]) + "\n"


def binding_lambda(patch: str) -> str:
    """The lambda the patch binds as GuardManager.add_dict_not_contains_key_guard."""
    added = [line[1:] for line in patch.splitlines() if line.startswith("+")]
    start = added.index('          "add_dict_not_contains_key_guard",') + 1
    end = added.index("          })", start)
    return "\n".join(added[start:end] + ["          }"]) + "\n"


def load_source(source: str, stem: str, opt: str = "-O1"):
    """Compile ``source`` into an extension under build/, named by its hash (so an edit to
    the patch rebuilds it and an unchanged one is reused), and import it."""
    from torch.utils import cpp_extension

    name = f"{stem}_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    build_dir = REPO / "build" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / f"{stem}.cpp").write_text(source)
    return cpp_extension.load(
        name=name,
        sources=[str(build_dir / f"{stem}.cpp")],
        extra_cflags=[opt],
        build_directory=str(build_dir),
        verbose=False,
    )


@cache
def extension():
    cls = added_class(the_patch(), "class DICT_NOT_CONTAINS_KEYS : public LeafGuard {")
    source = (
        STAND_INS + cls + MANAGERS + BINDINGS.replace("BINDING_LAMBDA", binding_lambda(the_patch()))
    )
    return load_source(source, "dict_not_contains_keys")


class RaisingKey:
    """Hashes like "weight" and raises when compared: PyDict_Contains fails."""

    def __hash__(self):
        return hash("weight")

    def __eq__(self, other):
        raise RuntimeError("no comparison")


class CountingKey:
    """Hashes like "weight", never equals it, and counts the comparisons: a dict that
    holds one is looked up for "weight" exactly when the count goes up."""

    calls = 0

    def __hash__(self):
        return hash("weight")

    def __eq__(self, other):
        CountingKey.calls += 1
        return False


def eq_calls_per_lookup() -> int:
    """Comparisons one lookup of "weight" makes in a dict holding one CountingKey: 1
    or 2, as the probe sequence of the hash (it varies with PYTHONHASHSEED) may come
    back to the CountingKey's slot before it reaches an empty one."""
    CountingKey.calls = 0
    _ = "weight" in {CountingKey(): 0}
    calls, CountingKey.calls = CountingKey.calls, 0
    return calls


class Obj:
    scale = 2.0  # a class attribute an instance __dict__ entry would shadow


class DictNotContainsKeysTest(TestCase):
    def setUp(self):
        super().setUp()
        if shutil.which("c++") is None:
            self.skipTest("no C++ compiler to build the leaf into an extension")
        self.ext = extension()

    @staticmethod
    def code(key):
        return f"not ___dict_contains({key!r}, L['self'].__dict__)"

    def merged(self, keys):
        leaf = None
        for i, key in enumerate(keys):
            if leaf is None:
                leaf = self.ext.DICT_NOT_CONTAINS_KEYS(key, [self.code(key)], f"stack{i}")
            else:
                leaf.add_key(key, [self.code(key)], f"stack{i}")
        return leaf

    def per_key(self, keys):
        return [DICT_CONTAINS(None, False, key, [self.code(key)], None) for key in keys]

    def test_agrees_with_the_per_key_leaves(self):
        keys = ["forward", "weight", "bias"]
        values = [
            {},
            {"training": True, "_parameters": {}},
            {"weight": 1},
            {"bias": 1, "in_features": 4},
            {"forward": None, "weight": 1, "bias": 2},
            {("weight",): 1},
            [],  # not a dict: DICT_CONTAINS(contains=False) passes
            "weight",
            type("M", (), {"weight": 1}).__dict__,  # a mappingproxy, not a dict
        ]
        for n in range(1, len(keys) + 1):
            merged, per_key = self.merged(keys[:n]), self.per_key(keys[:n])
            for value in values:
                expected = all(leaf(value) for leaf in per_key)
                self.assertEqual(merged(value), expected, (keys[:n], value))

    def test_a_lookup_that_raises_fails_the_check_and_clears_the_error(self):
        # What DICT_CONTAINS means to do on PyDict_Contains() == -1 (its `result == -1`
        # branch). The wheel's DICT_CONTAINS computes `PyDict_Check(value) &&
        # PyDict_Contains(...)`, which turns -1 into 1, so it returns False with the
        # error still set: called from Python, that is a SystemError.
        for keys, value in (
            (["forward", "weight"], {RaisingKey(): 1}),  # the comparison raises
            ([["weight"]], {"weight": 1}),  # an unhashable key
        ):
            self.assertFalse(self.merged(keys)(value))
            self.assertEqual(self.merged(keys).check_verbose(value)[0], False)
            with self.assertRaises(SystemError):
                self.per_key(keys[-1:])[0](value)
        self.assertTrue(self.merged([["weight"]])([]))

    def test_a_changed_or_other_dict_is_checked_again(self):
        # Every check looks the keys up: any write, or another dict, is seen.
        leaf = self.merged(["forward", "weight"])
        d = {"training": True}
        for _ in range(3):
            self.assertTrue(leaf(d))
        d["weight"] = 1
        self.assertFalse(leaf(d))
        del d["weight"]
        self.assertTrue(leaf(d))
        d["training"] = False  # an unrelated write: looked up again, still passes
        self.assertTrue(leaf(d))
        self.assertFalse(leaf({"forward": 1}))
        self.assertTrue(leaf(d))
        other = dict(d)
        self.assertTrue(leaf(other))
        other["forward"] = 2
        self.assertFalse(leaf(other))
        self.assertTrue(leaf(d))
        dict.__setitem__(d, "weight", 3)  # a write that bypasses any subclass hook
        self.assertFalse(leaf(d))
        d.clear()
        self.assertTrue(leaf(d))
        d.update(weight=4)
        self.assertFalse(leaf(d))

    def test_a_new_dict_at_a_freed_address_is_checked(self):
        leaf = self.merged(["weight"])
        for _ in range(200):
            self.assertTrue(leaf({"x": 1}))  # freed right after: addresses recur
            self.assertFalse(leaf({"weight": 1}))

    def test_verbose_reports_the_first_key_present(self):
        keys = ["forward", "weight", "bias"]
        leaf = self.merged(keys)
        self.assertEqual(leaf.verbose_code_parts(), [self.code(k) for k in keys])
        self.assertEqual(leaf.check_verbose({"x": 1}), (True, [], None))
        self.assertEqual(
            leaf.check_verbose({"bias": 1, "weight": 2}),
            (False, [self.code("weight")], "stack1"),
        )
        self.assertEqual(leaf.check_verbose({"bias": 1}), (False, [self.code("bias")], "stack2"))

    def test_many_dicts_in_turn_are_each_checked_again_after_a_write(self):
        # One cache entry serving many objects (torch.compile per block): the leaf sees
        # a different dict on each call.
        leaf = self.merged(["forward", "weight"])
        dicts = [{"training": True, "i": i} for i in range(300)]
        for _ in range(3):
            for d in dicts:
                self.assertTrue(leaf(d))
        for i in (0, 7, 299):
            dicts[i]["weight"] = 1
        for _ in range(2):
            for i, d in enumerate(dicts):
                self.assertEqual(leaf(d), i not in (0, 7, 299), i)
        del dicts[7]["weight"]
        self.assertTrue(leaf(dicts[7]))
        dicts[7]["forward"] = None
        self.assertFalse(leaf(dicts[7]))
        # a key added after a pass is checked from then on
        d = {"bias": 1}
        self.assertTrue(leaf(d))
        leaf.add_key("bias", [self.code("bias")], "stack2")
        self.assertFalse(leaf(d))

    def test_an_empty_instance_dict_filled_in_one_step_is_checked_again(self):
        # Python 3.12+'s dict watcher reports these writes to an empty dict as
        # PyDict_EVENT_CLONED, which upstream's dict_version_watch_callback does not
        # give a new version: a leaf that skipped its lookups on a version it passed on
        # would miss them. Each case: the leaf passes on the empty __dict__, then the
        # class attribute is shadowed by a write into it, and the check must fail.
        def fills(obj):
            yield lambda: obj.__dict__.update(scale=5.0)
            yield lambda: vars(obj).update({"scale": 5.0})
            yield lambda: dict.__init__(obj.__dict__, scale=5.0)
            yield lambda: obj.__dict__.__ior__({"scale": 5.0})
            yield lambda: obj.__dict__.update({"scale": 5.0}.items())

        makers = {"merged": lambda: self.merged(["scale"])}
        for form, make in makers.items():
            for i in range(len(list(fills(Obj())))):
                obj = Obj()
                leaf = make()
                self.assertTrue(leaf(obj.__dict__))
                self.assertTrue(leaf(obj.__dict__))
                list(fills(obj))[i]()
                self.assertEqual(obj.scale, 5.0)
                self.assertFalse(leaf(obj.__dict__), (form, i))
            # __dict__ replaced by a new empty dict after a pass, then filled
            obj = Obj()
            leaf = make()
            self.assertTrue(leaf(obj.__dict__))
            obj.__dict__ = {}
            self.assertTrue(leaf(obj.__dict__))
            obj.__dict__.update(scale=5.0)
            self.assertFalse(leaf(obj.__dict__), form)
            # and plain attribute stores
            obj = Obj()
            leaf = make()
            self.assertTrue(leaf(obj.__dict__))
            obj.scale = 5.0
            self.assertFalse(leaf(obj.__dict__), form)
            del obj.scale
            self.assertTrue(leaf(obj.__dict__))
            object.__setattr__(obj, "scale", 6.0)
            self.assertFalse(leaf(obj.__dict__), form)

    def test_every_check_looks_every_key_up(self):
        # No state is kept between checks: the class has no preprocessor branch and reads
        # no dict version, and each check of each of 300 dicts, a first pass or a later
        # one, looks every key up.
        cls = added_class(the_patch(), "class DICT_NOT_CONTAINS_KEYS : public LeafGuard {")
        self.assertNotIn("#if", cls)
        self.assertNotIn("version", cls)
        leaf = self.merged(["weight", "bias"])
        per_lookup = eq_calls_per_lookup()
        dicts = [{CountingKey(): i} for i in range(300)]
        for _ in range(3):
            CountingKey.calls = 0
            for d in dicts:
                self.assertTrue(leaf(d))
            self.assertEqual(CountingKey.calls, 300 * per_lookup)
        for i in (0, 255, 256, 299):
            dicts[i]["weight"] = 1
        for i, d in enumerate(dicts):
            self.assertEqual(leaf(d), i not in (0, 255, 256, 299), i)
        for value, expected in (({"bias": 1}, False), ({"x": 1}, True), ([], True)):
            self.assertEqual(leaf(value), expected)
            self.assertEqual(leaf.check_verbose(value)[0], expected)

    def test_the_binding_merges_the_keys_of_one_manager_into_one_leaf(self):
        # The add_dict_not_contains_key_guard lambda, compiled from the patch text,
        # against stand-ins of GuardManager and DictGuardManager.
        keys = ["forward", "weight", "bias"]
        manager = self.ext.GuardManager()
        manager.add_dict_not_contains_key_guard(keys[0], [self.code(keys[0])], "stack0")
        manager.add_is_dict_guard()
        for i, key in enumerate(keys[1:], 1):
            manager.add_dict_not_contains_key_guard(key, [self.code(key)], f"stack{i}")
        leaves = manager.leaves()
        self.assertEqual(len(leaves), 2)
        leaf, other = leaves
        self.assertEqual(other, "IS_DICT")
        self.assertEqual(leaf.verbose_code_parts(), [self.code(k) for k in keys])
        self.assertEqual(leaf.check_verbose({"bias": 1}), (False, [self.code("bias")], "stack2"))
        per_key = self.per_key(keys)
        for value in ({}, {"weight": 1}, {"bias": 2, "x": 3}, {"x": 1}):
            self.assertEqual(manager.check(value), all(g(value) for g in per_key), value)
        self.assertFalse(manager.check([]))  # the IS_DICT leaf, not the merged one

        # another manager gets its own leaf; the first one's keys stay its own
        second = self.ext.GuardManager()
        second.add_dict_not_contains_key_guard("weight", [self.code("weight")], "s")
        (leaf2,) = second.leaves()
        self.assertIsNot(leaf2, leaf)
        self.assertEqual(leaf2.verbose_code_parts(), [self.code("weight")])
        self.assertTrue(second.check({"forward": 1}))
        self.assertFalse(manager.check({"forward": 1}))

    def test_the_binding_is_permitted_on_a_dict_guard_manager(self):
        manager = self.ext.DictGuardManager()
        with self.assertRaisesRegex(RuntimeError, "does not support a leaf_guard"):
            manager.add_is_dict_guard()
        manager.add_dict_not_contains_key_guard("forward", [self.code("forward")], "s0")
        manager.add_dict_not_contains_key_guard("weight", [self.code("weight")], "s1")
        (leaf,) = manager.leaves()
        self.assertEqual(leaf.verbose_code_parts(), [self.code("forward"), self.code("weight")])
        self.assertTrue(manager.check({"x": 1}))
        self.assertFalse(manager.check({"weight": 1}))

    def test_a_clone_shares_the_leaf(self):
        manager = self.ext.GuardManager()
        for key in ("forward", "weight"):
            manager.add_dict_not_contains_key_guard(key, [self.code(key)], None)
        clone = manager.clone()
        (leaf,) = manager.leaves()
        (cloned_leaf,) = clone.leaves()
        self.assertIs(cloned_leaf, leaf)
        d = {"x": 1}
        self.assertTrue(clone.check(d))
        self.assertTrue(manager.check(d))
        d["weight"] = 1
        self.assertFalse(manager.check(d))
        self.assertFalse(clone.check(d))
        del d["weight"]
        self.assertTrue(manager.check(d))
        self.assertTrue(clone.check(d))


if __name__ == "__main__":
    run_tests()
