# Owner(s): ["module: dynamo"]
# Upstream home: test/dynamo/test_guard_manager.py (GuardManagerTests); kept in its own
# file here because the project never edits upstream files.

import unittest

import torch._dynamo.test_case
from torch._C._dynamo.guards import GuardManager, RootGuardManager


HAS_MERGED_LEAF = hasattr(GuardManager, "add_dict_not_contains_key_guard")


def code(key):
    return f"not ___dict_contains({key!r}, L['x'].__dict__)"


@unittest.skipIf(not HAS_MERGED_LEAF, "torch without the DICT_NOT_CONTAINS_KEYS leaf")
class DictNotContainsKeysGuardTests(torch._dynamo.test_case.TestCase):
    def _add(self, mgr, *keys):
        for key in keys:
            mgr.add_dict_not_contains_key_guard(key, [code(key)], None)

    def test_keys_of_one_manager_share_one_leaf(self):
        root = RootGuardManager()
        self._add(root, "forward", "weight")
        root.add_dict_contains_guard(True, "training", [code("training")], None)
        self._add(root, "bias")
        leaves = root.get_leaf_guards()
        self.assertEqual(
            [type(leaf).__name__ for leaf in leaves],
            ["DICT_NOT_CONTAINS_KEYS", "DICT_CONTAINS"],
        )
        self.assertEqual(
            leaves[0].verbose_code_parts(),
            [code("forward"), code("weight"), code("bias")],
        )

    def test_check_matches_one_dict_contains_leaf_per_key(self):
        keys = ("forward", "weight", "bias")
        merged = RootGuardManager()
        self._add(merged, *keys)
        per_key = RootGuardManager()
        for key in keys:
            per_key.add_dict_contains_guard(False, key, [code(key)], None)
        for value in (
            {},
            {"training": True},
            {"weight": 1},
            {"bias": 1, "x": 2},
            {"forward": 1, "weight": 2, "bias": 3},
            [],
            "weight",
        ):
            self.assertEqual(merged.check(value), per_key.check(value), value)

    def test_failure_names_the_key_present(self):
        root = RootGuardManager()
        self._add(root, "forward", "weight", "bias")
        self.assertTrue(root.check({"training": True}))
        info = root.check_verbose({"bias": 1, "weight": 2})
        self.assertFalse(info.result)
        self.assertEqual(info.verbose_code_parts, [code("weight")])

    def test_many_dicts_in_turn_see_a_write(self):
        # One cache entry serving many objects (torch.compile per block): the leaf
        # must see a write to any of the dicts, whichever it checked last.
        root = RootGuardManager()
        self._add(root, "forward", "weight")
        dicts = [{"training": True, "i": i} for i in range(300)]
        for _ in range(2):
            self.assertTrue(all(root.check(d) for d in dicts))
        dicts[5]["weight"] = 1
        dicts[250]["forward"] = None
        self.assertEqual(
            [i for i, d in enumerate(dicts) if not root.check(d)], [5, 250]
        )
        del dicts[5]["weight"]
        self.assertTrue(root.check(dicts[5]))
        info = root.check_verbose(dicts[250])
        self.assertEqual(info.verbose_code_parts, [code("forward")])

    def test_six_hundred_dicts_in_turn_see_a_write(self):
        # More dicts than a cache of passed dict versions would hold (a fast path
        # this leaf leaves out): a write to any of them is seen.
        root = RootGuardManager()
        self._add(root, "weight")
        dicts = [{"i": i} for i in range(600)]
        for _ in range(3):
            self.assertTrue(all(root.check(d) for d in dicts))
        for i in (0, 255, 256, 599):
            dicts[i]["weight"] = 1
        self.assertEqual(
            [i for i, d in enumerate(dicts) if not root.check(d)], [0, 255, 256, 599]
        )

    def test_an_empty_instance_dict_filled_in_one_step_fails_the_check(self):
        # Python 3.12+ reports these writes to an empty dict as PyDict_EVENT_CLONED,
        # which does not give the dict a new watcher version; on 3.13.0 a plain
        # attribute store into inline values fires no event (gh-125608). The leaf,
        # which looks its keys up on every check, must see the shadowing key.
        class Cfg:
            scale = 2.0

        def fill_update(obj):
            obj.__dict__.update(scale=5.0)

        def fill_vars(obj):
            vars(obj).update({"scale": 5.0})

        def fill_init(obj):
            dict.__init__(obj.__dict__, scale=5.0)

        def fill_ior(obj):
            d = obj.__dict__
            d |= {"scale": 5.0}

        def reassign_then_update(obj):
            obj.__dict__ = {}
            obj.__dict__.update(scale=5.0)

        def setattr_(obj):
            obj.scale = 5.0

        for fill in (
            fill_update,
            fill_vars,
            fill_init,
            fill_ior,
            reassign_then_update,
            setattr_,
        ):
            obj = Cfg()
            root = RootGuardManager()
            dict_mgr = root.getitem_manager(
                "obj",
                "L['obj']",
                obj,
                torch._dynamo.guards.GuardManagerType.GUARD_MANAGER,
            ).get_generic_dict_manager(
                "L['obj'].__dict__",
                obj.__dict__,
                torch._dynamo.guards.GuardManagerType.GUARD_MANAGER,
            )
            self._add(dict_mgr, "scale")
            for _ in range(2):
                self.assertTrue(root.check({"obj": obj}))
            fill(obj)
            self.assertEqual(obj.scale, 5.0)
            self.assertFalse(root.check({"obj": obj}), fill.__name__)
            self.assertFalse(root.check_verbose({"obj": obj}).result, fill.__name__)

    def test_separate_managers_get_separate_leaves(self):
        class Mod:
            pass

        a, b = Mod(), Mod()
        root = RootGuardManager()
        managers = []
        for name, obj in (("a", a), ("b", b)):
            obj_mgr = root.getitem_manager(
                name,
                f"L[{name!r}]",
                obj,
                torch._dynamo.guards.GuardManagerType.GUARD_MANAGER,
            )
            dict_mgr = obj_mgr.get_generic_dict_manager(
                f"L[{name!r}].__dict__",
                obj.__dict__,
                torch._dynamo.guards.GuardManagerType.GUARD_MANAGER,
            )
            self._add(dict_mgr, "weight")
            managers.append(dict_mgr)
        self.assertEqual([len(m.get_leaf_guards()) for m in managers], [1, 1])
        self.assertTrue(root.check({"a": a, "b": b}))
        b.weight = 1
        self.assertFalse(root.check({"a": a, "b": b}))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
