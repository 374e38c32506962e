# Owner(s): ["module: dynamo"]
# Upstream home: test/dynamo/test_modules.py (NNModuleTests); kept in its own file
# here because the project never edits upstream files.

import collections
import unittest

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch.nn.functional as F
from torch._C._dynamo.guards import GuardManager

from test_modules_dict_shadow import guard_managers  # the shadow guard PR's test file


DIM = 4
HAS_MERGED_LEAF = hasattr(GuardManager, "add_dict_not_contains_key_guard")


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = torch.nn.Linear(DIM, DIM)
        self.wk = torch.nn.Linear(DIM, DIM)
        self.wv = torch.nn.Linear(DIM, DIM)
        self.wo = torch.nn.Linear(DIM, DIM)

    def forward(self, x):
        scores = self.wq(x) @ self.wk(x).transpose(-2, -1)
        return self.wo(torch.softmax(scores, dim=-1) @ self.wv(x))


class FeedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Linear(DIM, 2 * DIM)
        self.w2 = torch.nn.Linear(2 * DIM, DIM)
        self.w3 = torch.nn.Linear(DIM, 2 * DIM)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = torch.nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = torch.nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Model(torch.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.norm = torch.nn.RMSNorm(DIM)
        self.output = torch.nn.Linear(DIM, DIM)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


# The names each module's forward reads through nn.Module.__getattr__, and
# `forward` for every module called from the frame (the root's forward is the
# frame itself; a ModuleList is iterated, not called).
EXPECTED_NAMES = {
    Model: {"layers", "norm", "output"},
    torch.nn.ModuleList: {"__iter__"},
    Block: {"forward", "attention_norm", "attention", "ffn_norm", "feed_forward"},
    Attention: {"forward", "wq", "wk", "wv", "wo"},
    FeedForward: {"forward", "w1", "w2", "w3"},
    torch.nn.Linear: {"forward", "weight", "bias"},
    torch.nn.RMSNorm: {"forward", "weight"},
}


def dict_contains_parts(fn, prefix):
    """(guard manager, leaf, names) for each leaf whose code parts start with
    ``prefix`` (a `___dict_contains(` check), the names being the keys checked."""
    for mgr in guard_managers(fn):
        for leaf in mgr.get_leaf_guards():
            names = [
                part.split("(", 1)[1].split(",", 1)[0].strip("'\"")
                for part in leaf.verbose_code_parts()
                if part.startswith(prefix)
            ]
            if names:
                yield mgr, leaf, names


def absent_key_checks(fn):
    """Leaves holding `not ___dict_contains(name, ...)` checks in the guards of fn's
    only cache entry: (guard manager source, leaf type, names) per leaf."""
    return [
        (mgr.get_source(), type(leaf).__name__, names)
        for mgr, leaf, names in dict_contains_parts(fn, "not ___dict_contains(")
    ]


def present_key_checks_on_module_dicts(fn):
    """`___dict_contains(name, <...>.__dict__)` leaves (a present key) in the guards
    of fn's only cache entry: (guard manager source, name) per check."""
    return [
        (mgr.get_source(), name)
        for mgr, _, names in dict_contains_parts(fn, "___dict_contains(")
        if mgr.get_source().endswith(".__dict__")
        for name in names
    ]


class _StandInCodeParts(list):
    """The code parts of a stand-in leaf, which also holds the names it checks."""

    def __init__(self):
        super().__init__()
        self.names = set()


def _stand_in_add_dict_not_contains_key_guard(mgr, key, verbose_code_parts, user_stack):
    """What the C++ binding does, with a LAMBDA leaf: one leaf per guard manager
    checks that none of the keys added to it is in the dict."""
    for leaf in mgr.get_leaf_guards():
        parts = leaf.verbose_code_parts()
        if isinstance(parts, _StandInCodeParts):
            parts.names.add(key)
            parts.extend(verbose_code_parts)
            return
    parts = _StandInCodeParts()
    parts.names.add(key)
    parts.extend(verbose_code_parts)
    mgr.add_lambda_guard(parts.names.isdisjoint, parts, user_stack)


class NNModuleDictGuardCountTests(torch._dynamo.test_case.TestCase):
    def _check_counts(self, blocks, leaf_type):
        model = Model(blocks)
        torch.compile(model, backend="eager")(torch.randn(2, 3, DIM))
        checks = absent_key_checks(Model.forward)
        modules = {f"L['self']{path}": m for path, m in self._sources(model)}
        names_by_dict = collections.defaultdict(list)
        for source, kind, names in checks:
            self.assertEqual(kind, leaf_type)
            names_by_dict[source].extend(names)
        # every module's __dict__ is checked, for exactly the names read
        self.assertEqual(len(names_by_dict), len(modules))
        for source, names in names_by_dict.items():
            module = modules[source.removesuffix(".__dict__")]
            self.assertEqual(len(names), len(set(names)))  # no duplicates
            self.assertEqual(set(names), EXPECTED_NAMES[type(module)], source)
        return checks, names_by_dict

    @staticmethod
    def _sources(model):
        # the guard source of each module, as Dynamo spells it
        yield "", model
        yield "._modules['layers']", model.layers
        yield "._modules['norm']", model.norm
        yield "._modules['output']", model.output
        for i, block in enumerate(model.layers):
            prefix = f"._modules['layers']._modules['{i}']"
            yield prefix, block
            for name, child in block.named_children():
                yield f"{prefix}._modules['{name}']", child
                for grandchild_name, grandchild in child.named_children():
                    yield (
                        f"{prefix}._modules['{name}']._modules['{grandchild_name}']",
                        grandchild,
                    )

    def test_absent_key_checks_one_leaf_per_module_dict(self):
        """A 64-block model: one absent-key leaf per called module when the guard
        manager can merge keys (DICT_NOT_CONTAINS_KEYS), one leaf per name read
        through __getattr__ where it cannot (torch without that leaf)."""
        blocks = 64
        if HAS_MERGED_LEAF:
            checks, names_by_dict = self._check_counts(blocks, "DICT_NOT_CONTAINS_KEYS")
            self.assertEqual(len(checks), len(names_by_dict))
        else:
            checks, names_by_dict = self._check_counts(blocks, "DICT_CONTAINS")
            self.assertEqual(
                len(checks), sum(len(names) for names in names_by_dict.values())
            )
        modules = 12 * blocks + 4
        self.assertEqual(len(names_by_dict), modules)

    @unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
    def test_checkpoint_wrapper_one_check_per_module_dict(self):
        """checkpoint_wrapper's __getattr__ calls super().__getattr__, so Dynamo
        inlines nn.Module.__getattr__, which tests `"_parameters" in self.__dict__`
        (and "_buffers", "_modules") before reading each: the read's guard already
        fails when the key is missing, so no present-key leaf is added for those
        tests, and every module __dict__ keeps one absent-key check."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
            CheckpointImpl,
        )

        blocks = 4
        model = Model(blocks)
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(
                block, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            )
        if not HAS_MERGED_LEAF:
            GuardManager.add_dict_not_contains_key_guard = (
                _stand_in_add_dict_not_contains_key_guard
            )
        try:
            x = torch.randn(2, 3, DIM)
            self.assertEqual(torch.compile(model, backend="eager")(x), model(x))
            checks = absent_key_checks(Model.forward)
        finally:
            if not HAS_MERGED_LEAF:
                del GuardManager.add_dict_not_contains_key_guard
        self.assertEqual(present_key_checks_on_module_dicts(Model.forward), [])
        sources = [source for source, _, _ in checks]
        self.assertEqual(len(sources), len(set(sources)))  # one leaf per dict
        # one per module __dict__: the modules of the plain model and one wrapper
        # per block; the wrapper's `name in _parameters` and `name in _buffers`
        # add one each on those dicts, as without the shadow guard
        dunder_dicts = [s for s in sources if s.endswith(".__dict__")]
        self.assertEqual(len(dunder_dicts), 12 * blocks + 4 + blocks)
        self.assertEqual(len(sources), len(dunder_dicts) + 2 * blocks)

    @unittest.skipIf(
        HAS_MERGED_LEAF,
        "the guard manager has the C++ binding; "
        "test_absent_key_checks_one_leaf_per_module_dict covers it",
    )
    def test_merged_leaf_semantics_with_a_stand_in_binding(self):
        """The Python side of the merged leaf, on a torch without it: given an
        add_dict_not_contains_key_guard binding (here a LAMBDA stand-in), every
        module __dict__ gets one leaf holding all its names, and the guards still
        recompile when a shadow appears and only then."""
        GuardManager.add_dict_not_contains_key_guard = (
            _stand_in_add_dict_not_contains_key_guard
        )
        try:
            checks, names_by_dict = self._check_counts(2, "LAMBDA_GUARD")
            self.assertEqual(len(checks), len(names_by_dict))
            self.assertEqual(len(checks), 12 * 2 + 4)

            torch._dynamo.reset()
            model = Model(2)
            cnt = torch._dynamo.testing.CompileCounter()
            opt_model = torch.compile(model, backend=cnt)
            x = torch.randn(2, 3, DIM)
            expected = model(x)
            for _ in range(3):
                self.assertEqual(opt_model(x), expected)
            self.assertEqual(cnt.frame_count, 1)
            linear = model.layers[1].feed_forward.w2
            linear.__dict__["bias"] = torch.ones(DIM)  # shadows the parameter
            shadowed = model(x)
            self.assertNotEqual(shadowed, expected)
            self.assertEqual(opt_model(x), shadowed)
            self.assertEqual(cnt.frame_count, 2)
            del linear.__dict__["bias"]
            self.assertEqual(opt_model(x), expected)
            self.assertEqual(cnt.frame_count, 2)
            model.layers[0].note = "unrelated"  # not read: no recompile
            self.assertEqual(opt_model(x), expected)
            self.assertEqual(cnt.frame_count, 2)
        finally:
            del GuardManager.add_dict_not_contains_key_guard

    def test_no_key_order_or_length_guard_on_module_dicts(self):
        """The 64-block model's frame reads attributes through __getattr__ (key
        reads) and never lists a module's __dict__: no __dict__ guard manager
        guards the order of its keys (a DictGuardManager) or their number. The
        order is guarded only where a frame lists the keys; see
        test_instance_dict_key_guards.py."""
        from torch._C._dynamo.guards import DictGuardManager

        model = Model(64)
        torch.compile(model, backend="eager")(torch.randn(2, 3, DIM))
        managers = {
            mgr.get_source(): mgr
            for mgr in guard_managers(Model.forward)
            if mgr.get_source().endswith(".__dict__")
        }
        self.assertEqual(len(managers), 12 * 64 + 4)
        for source, mgr in managers.items():
            self.assertNotIsInstance(mgr, DictGuardManager, source)
            kinds = {type(leaf).__name__ for leaf in mgr.get_leaf_guards()}
            self.assertFalse(kinds & {"DICT_LENGTH", "LENGTH_CHECK"}, source)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
