# Owner(s): ["module: dynamo"]
# Upstream home: test/dynamo/test_misc.py (next to the other instance __dict__
# tests); kept in its own file here because the project never edits upstream files.

import contextlib
import dataclasses
import os
import tempfile
import types

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.testing import CompileCounter


def _value_of(first):
    # The first key listed (or its (key, value) item, or its value), as a value
    # that tells them apart.
    if isinstance(first, tuple):
        first = first[0]
    return first if isinstance(first, float) else {"a": 2.0, "b": 3.0}[first]


class InstanceDictKeyGuardTests(torch._dynamo.test_case.TestCase):
    # Whether a key is in an object's __dict__ when the frame starts is an input
    # of the frame: a compiled `name in obj.__dict__`, `obj.__dict__.get(name)` or
    # `obj.__dict__.pop(name, default)` must recompile when the answer changes.

    def _compile_twice(self, mod, add):
        cnt = CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt)
        x = torch.ones(2)
        self.assertEqual(opt_mod(x), mod(x))
        add(mod)
        compiled = opt_mod(x)
        add(mod)
        self.assertEqual(compiled, mod(x))
        return cnt

    def test_dict_get_of_missing_key(self):
        class Mod(torch.nn.Module):
            def forward(self, x):
                return x * self.__dict__.get("scale", 1.0)

        cnt = self._compile_twice(Mod(), lambda m: m.__dict__.update(scale=7.0))
        self.assertEqual(cnt.frame_count, 2)

    def test_dict_pop_of_missing_key(self):
        class Mod(torch.nn.Module):
            def forward(self, x):
                return x * self.__dict__.pop("scale", 3.0)

        cnt = self._compile_twice(Mod(), lambda m: m.__dict__.update(scale=5.0))
        self.assertEqual(cnt.frame_count, 2)

    def test_dict_get_on_plain_object(self):
        class Obj:
            pass

        obj = Obj()

        @torch.compile(backend="eager", fullgraph=True)
        def fn(x):
            return x * obj.__dict__.get("scale", 1.0)

        x = torch.ones(2)
        self.assertEqual(fn(x), x)
        obj.scale = 4.0
        self.assertEqual(fn(x), x * 4.0)

    def test_dict_pop_shadow_then_graph_break(self):
        # The frame removes a stale shadow of a parameter, breaks the graph, then
        # reads the parameter: with a shadow present on a later call, the first
        # frame must recompile so that its pop runs and the parameter is used,
        # as in eager.
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(2))

            def forward(self, x):
                self.__dict__.pop("weight", None)
                torch._dynamo.graph_break()
                return x * self.weight

        mod = Mod()
        opt_mod = torch.compile(mod, backend="eager")
        x = torch.ones(2)
        with torch.no_grad():
            self.assertEqual(opt_mod(x), x)
            mod.__dict__["weight"] = torch.full((2,), 5.0)
            self.assertEqual(opt_mod(x), x)
            self.assertNotIn("weight", mod.__dict__)

    def test_dict_popitem_shadow_then_graph_break(self):
        # A forward that removes a parameter's shadow with popitem() (the shadow
        # is the last key written), breaks the graph and reads the parameter.
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(2))

            def forward(self, x):
                d = self.__dict__
                if next(reversed(d)) == "weight":
                    d.popitem()
                torch._dynamo.graph_break()
                return x * self.weight

        mod = Mod()
        opt_mod = torch.compile(mod, backend="eager")
        x = torch.ones(2)
        with torch.no_grad():
            for shadow in (False, True, False, True):
                if shadow:
                    mod.__dict__["weight"] = torch.full((2,), 5.0)
                self.assertEqual(opt_mod(x), x)
                self.assertNotIn("weight", mod.__dict__)
                self.assertIn("training", mod.__dict__)

    def test_dict_contains_of_present_key(self):
        # A present key is guarded whether or not the frame reads its value:
        # where it does, the guard on the value fails when the key goes; where
        # it does not, a membership leaf does.
        class Flag(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = 3.0

            def forward(self, x):
                if "scale" in self.__dict__:
                    return x + 1
                return x

        class Read(Flag):
            def forward(self, x):
                if "scale" in self.__dict__:
                    return x * self.__dict__["scale"]
                return x

        for cls in (Flag, Read):
            with self.subTest(cls.__name__):
                mod = cls()
                cnt = CompileCounter()
                opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
                x = torch.ones(2)
                self.assertEqual(opt_mod(x), mod(x))
                del mod.scale
                self.assertEqual(opt_mod(x), x)
                mod.scale = 3.0  # the first graph again
                self.assertEqual(opt_mod(x), mod(x))
                self.assertEqual(cnt.frame_count, 2)

    def test_dict_contains_of_present_key_skip_guard_eval_unsafe(self):
        # Where the value read stands in for the membership leaf, its accessor
        # must stay in the guards that skip_guard_eval_unsafe evaluates.
        class Obj:
            pass

        def fn(obj, x):
            d = obj.__dict__
            if "k" in d:
                return x * d["k"]
            return x - 1

        obj = Obj()
        x = torch.ones(2)
        opt_fn = torch.compile(fn, backend="eager", fullgraph=True)
        obj.k = 5.0
        self.assertEqual(opt_fn(obj, x), fn(obj, x))
        del obj.k
        self.assertEqual(opt_fn(obj, x), fn(obj, x))
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            obj.k = 5.0
            self.assertEqual(opt_fn(obj, x), fn(obj, x))
            del obj.k
            self.assertEqual(opt_fn(obj, x), fn(obj, x))

    def test_dict_key_read_of_present_and_absent_key_skip_guard_eval_unsafe(self):
        # Under skip_guard_eval_unsafe only the guards that tell the cache entries
        # apart run. The entry for the absent key has its leaf on obj.__dict__;
        # the entry for the present key reads the value through obj.__dict__[k],
        # whose accessor failing on a missing key is its only such check.
        class Obj:
            pass

        def get_then_use(obj, x):
            v = obj.__dict__.get("k")
            return x - 1 if v is None else x * v

        def get_default(obj, x):
            return x * obj.__dict__.get("k", 1.0)

        def getitem_try(obj, x):
            try:
                v = obj.__dict__["k"]
            except KeyError:
                v = 1.0
            return x * v

        def set_k(obj):
            obj.k = 5.0

        def del_k(obj):
            obj.__dict__.pop("k", None)

        x = torch.ones(2)
        for fn in (get_then_use, get_default, getitem_try):
            for first_present in (False, True):
                with self.subTest(fn.__name__, first_present=first_present):
                    torch._dynamo.reset()
                    obj = Obj()
                    cnt = CompileCounter()
                    opt_fn = torch.compile(fn, backend=cnt, fullgraph=True)
                    for i in range(6):
                        (set_k if (i % 2 == 0) == first_present else del_k)(obj)
                        if i < 2:
                            self.assertEqual(opt_fn(obj, x), fn(obj, x))
                        else:
                            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                                self.assertEqual(opt_fn(obj, x), fn(obj, x))
                    self.assertEqual(cnt.frame_count, 2)

    def test_dict_key_written_by_frame_needs_no_guard(self):
        class Mod(torch.nn.Module):
            def forward(self, x):
                self.__dict__["scale"] = 2.0
                return x * self.__dict__.get("scale", 1.0)

        mod = Mod()
        cnt = CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.ones(2)
        self.assertEqual(opt_mod(x), x * 2)
        # the key is now present on entry; the frame's answer does not depend on it
        self.assertEqual(opt_mod(x), x * 2)
        self.assertEqual(cnt.frame_count, 1)

    def test_dict_iterate_to_remove_shadows_then_graph_break(self):
        # Like the pop above, but the frame finds the shadows by iterating
        # __dict__: the keys it iterates over are guarded, so a later call with a
        # shadow present recompiles the first frame and removes it, as in eager.
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(2))

            def forward(self, x):
                for k in [k for k in self.__dict__ if k in self._parameters]:
                    del self.__dict__[k]
                torch._dynamo.graph_break()
                return x * self.weight

        mod = Mod()
        opt_mod = torch.compile(mod, backend="eager")
        x = torch.ones(2)
        with torch.no_grad():
            self.assertEqual(opt_mod(x), x)
            mod.__dict__["weight"] = torch.full((2,), 5.0)
            self.assertEqual(opt_mod(x), x)
            self.assertNotIn("weight", mod.__dict__)

    # Every way of listing the keys of __dict__: the ones that build a list, a
    # set or a dict from it read the keys without a for loop over the dict.
    _ENUMERATIONS = {
        "comprehension": lambda self: [
            k for k in self.__dict__ if k in self._parameters
        ],
        "list(d)": lambda self: [
            k for k in list(self.__dict__) if k in self._parameters
        ],
        "[*d]": lambda self: [k for k in [*self.__dict__] if k in self._parameters],
        "list(vars(self))": lambda self: [
            k for k in list(vars(self)) if k in self._parameters
        ],
        "set(d) & set(params)": lambda self: set(self.__dict__) & set(self._parameters),
        "params.keys() & set(d)": lambda self: (
            self._parameters.keys() & set(self.__dict__)
        ),
        "frozenset(d)": lambda self: [
            k for k in frozenset(self.__dict__) if k in self._parameters
        ],
        "{*d}": lambda self: [k for k in {*self.__dict__} if k in self._parameters],
        "dict.fromkeys(d)": lambda self: [
            k for k in dict.fromkeys(self.__dict__) if k in self._parameters
        ],
    }

    def test_dict_enumerate_to_remove_shadows_then_graph_break(self):
        # The iterate-and-delete cleanup written with each way of listing the
        # keys. Variant "grows": the shadow is added. Variant "same length": the
        # shadow is added while another attribute goes, so only a guard on the
        # keys themselves (not the length) sees it.
        for form, select in self._ENUMERATIONS.items():
            for same_length in (False, True):
                with self.subTest(form=form, same_length=same_length):
                    torch._dynamo.reset()

                    class Mod(torch.nn.Module):
                        def __init__(self):
                            super().__init__()
                            self.weight = torch.nn.Parameter(torch.ones(2))
                            self.tmp = 0

                        def forward(self, x):
                            for k in select(self):
                                del self.__dict__[k]
                            torch._dynamo.graph_break()
                            return x * self.weight

                    mod = Mod()
                    cnt = CompileCounter()
                    opt_mod = torch.compile(mod, backend=cnt)
                    x = torch.ones(2)
                    with torch.no_grad():
                        self.assertEqual(opt_mod(x), x)
                        if same_length:
                            del mod.__dict__["tmp"]
                        mod.__dict__["weight"] = torch.full((2,), 5.0)
                        self.assertEqual(opt_mod(x), x)
                        self.assertNotIn("weight", mod.__dict__)
                        if same_length:
                            mod.__dict__["tmp"] = 0
                        self.assertEqual(opt_mod(x), x)
                    # one graph (the frame after the break); the frame before it
                    # has no tensor op
                    self.assertEqual(cnt.frame_count, 1)

    def test_dict_enumerate_recompiles_only_when_keys_change(self):
        # A frame that lists an object's keys is guarded on them: a new key
        # recompiles, a new value of an existing key or a repeated call does not.
        class Obj:
            pass

        reads = {
            "list(d)": lambda d: len(list(d)),
            "[*d]": lambda d: len([*d]),
            "set(d)": lambda d: len(set(d)),
            "frozenset(d)": lambda d: len(frozenset(d)),
            "{*d}": lambda d: len({*d}),
            "dict.fromkeys(d)": lambda d: len(dict.fromkeys(d)),
            "keys() & set(d)": lambda d: len(d.keys() & set(d)),
        }
        for form, read in reads.items():
            with self.subTest(form=form):
                torch._dynamo.reset()
                obj = Obj()
                obj.a = 1
                cnt = CompileCounter()

                @torch.compile(backend=cnt, fullgraph=True)
                def fn(x):
                    return x * read(obj.__dict__)

                x = torch.ones(1)
                self.assertEqual(fn(x), x * 1)
                obj.a = 2
                self.assertEqual(fn(x), x * 1)
                self.assertEqual(cnt.frame_count, 1)
                obj.b = 3
                self.assertEqual(fn(x), x * 2)
                self.assertEqual(cnt.frame_count, 2)

    # Same keys, another order: what code outside the frame does with
    # `v = obj.a; del obj.a; obj.a = v` (reparametrizing a module, functional_call).
    # Each form lists the keys (or a value) of d; the first one listed decides
    # the result.
    ORDER_FORMS = {
        "list(d)": lambda d: list(d),
        "next(iter(d))": lambda d: [next(iter(d))],
        "next(reversed(d))": lambda d: [next(reversed(d))],
        "list(d.keys())": lambda d: list(d.keys()),
        "comprehension": lambda d: [str(k) for k in d],
        "[*d]": lambda d: [*d],
        "tuple(d)": lambda d: tuple(d),
        "list(d.items())": lambda d: list(d.items()),
        "list(d.values())": lambda d: list(d.values()),
        "d.copy()": lambda d: list(d.copy()),
        "dict(d)": lambda d: list(dict(d)),
        "dict.fromkeys(d)": lambda d: list(dict.fromkeys(d)),
        "str(list(d.keys()))": lambda d: str(list(d.keys()))[2:],
        "d.popitem()": lambda d: d.popitem(),
    }

    def test_dict_enumerate_follows_key_order(self):
        # Listing the keys, or popping the last one, answers in the order the
        # keys have when the frame starts: a reorder with the same keys must
        # not reuse the graph traced for the old order.
        class Obj:
            pass

        def reorder(obj):
            v = obj.a
            del obj.a
            obj.a = v

        for form, read in self.ORDER_FORMS.items():
            with self.subTest(form=form):
                torch._dynamo.reset()
                cnt = CompileCounter()

                def fn(obj, x):
                    return x * _value_of(read(vars(obj))[0])

                opt_fn = torch.compile(fn, backend=cnt, fullgraph=True)
                eager_obj, compiled_obj = Obj(), Obj()
                x = torch.ones(1)
                for call in range(3):
                    for obj in (eager_obj, compiled_obj):
                        obj.__dict__.setdefault("a", 2.0)  # back after popitem
                        obj.__dict__.setdefault("b", 3.0)
                        if call == 1:
                            reorder(obj)
                    self.assertEqual(
                        opt_fn(compiled_obj, x), fn(eager_obj, x), f"call {call}"
                    )
                    self.assertEqual(list(vars(compiled_obj)), list(vars(eager_obj)))
                self.assertEqual(cnt.frame_count, 2)

    def test_dict_module_lists_its_keys_after_reparametrize(self):
        # A module whose forward lists its own __dict__, with an attribute
        # deleted and set again outside (the reparametrize idiom).
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.first_scale = 2.0
                self.second_scale = 3.0

            def forward(self, x):
                scales = [v for k, v in self.__dict__.items() if k.endswith("scale")]
                return x * scales[0]

        mod = Mod()
        cnt = CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.ones(2)
        self.assertEqual(opt_mod(x), x * 2)
        v = mod.first_scale
        del mod.first_scale
        mod.first_scale = v
        self.assertEqual(mod(x), x * 3)
        self.assertEqual(opt_mod(x), x * 3)
        self.assertEqual(cnt.frame_count, 2)

    def test_dict_order_free_reads_do_not_guard_the_order(self):
        # Pins what guards the order and what does not. Key reads (`in`, get,
        # `[name]`) and len() do not depend on the order and do not recompile
        # on a reorder. sorted(d) does not depend on it either, but it lists
        # the keys like the order-dependent forms and recompiles once (a known
        # limit: the tracker of __dict__ cannot tell which consumer keeps the
        # order).
        class Obj:
            pass

        reads = {
            "in": (lambda d: 2.0 if "a" in d else 0.0, 1),
            "get": (lambda d: d.get("a", 0.0) + d.get("c", 0.0), 1),
            "getitem": (lambda d: d["b"], 1),
            "len(d)": (lambda d: float(len(d)), 1),
            "sorted(d)": (lambda d: _value_of("".join(sorted(d))[0]), 2),
        }
        for form, (read, frames) in reads.items():
            with self.subTest(form=form):
                torch._dynamo.reset()
                obj = Obj()
                obj.a, obj.b = 2.0, 3.0
                cnt = CompileCounter()

                @torch.compile(backend=cnt, fullgraph=True)
                def fn(x):
                    return x * read(obj.__dict__)

                x = torch.ones(1)
                expected = x * read(obj.__dict__)
                self.assertEqual(fn(x), expected)
                v = obj.a
                del obj.a
                obj.a = v
                self.assertEqual(fn(x), expected)
                self.assertEqual(fn(x), expected)
                self.assertEqual(cnt.frame_count, frames)

    def test_dict_key_order_guarded_only_where_keys_are_listed(self):
        # Only a frame that lists the keys guards their order: its __dict__
        # guard manager becomes a DictGuardManager, with one key manager per
        # key. Key reads (`in`, get, `[name]`) and len() add no leaf for it.
        from torch._C._dynamo.guards import DictGuardManager
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        def dunder_dict_manager(fn):
            [entry] = _debug_get_cache_entry_list(fn.__code__)
            stack, found = [entry.guard_manager.root], []
            while stack:
                mgr = stack.pop()
                stack.extend(mgr.get_child_managers())
                if mgr.get_source().endswith(".__dict__"):
                    found.append(mgr)
            [mgr] = found
            return mgr

        class Obj:
            pass

        obj = Obj()
        obj.a, obj.b = 2.0, 3.0

        def reads_keys(x):
            scale = obj.__dict__["b"] + obj.__dict__.get("c", 0.0)
            return x * scale if "a" in obj.__dict__ else x

        def counts_keys(x):
            return x * len(obj.__dict__)

        def lists_keys(x):
            keys = list(obj.__dict__)
            return x * obj.__dict__[keys[0]]

        for fn, ordered, leaves in (
            # one leaf, for the absent key "c" (the present keys are checked
            # by the accessors of their values)
            (reads_keys, False, ["DICT_CONTAINS"]),
            # the length
            (counts_keys, False, ["DICT_LENGTH"]),
            (lists_keys, True, None),
        ):
            with self.subTest(fn.__name__):
                torch._dynamo.reset()
                torch.compile(fn, backend="eager", fullgraph=True)(torch.ones(1))
                mgr = dunder_dict_manager(fn)
                self.assertEqual(isinstance(mgr, DictGuardManager), ordered)
                if leaves is not None:
                    kinds = sorted(
                        type(leaf).__name__ for leaf in mgr.get_leaf_guards()
                    )
                    self.assertEqual(kinds, leaves)
                if ordered:
                    # a key manager per key, in the order seen
                    self.assertEqual(len(mgr.get_key_value_managers()), 2)

    def test_dict_getitem_of_missing_key_in_try(self):
        # `obj.__dict__[name]` of a missing key raises KeyError; the frame that
        # catches it must recompile once the key is there.
        class Obj:
            pass

        obj = Obj()
        cnt = CompileCounter()

        @torch.compile(backend=cnt, fullgraph=True)
        def fn(x):
            try:
                return x * obj.__dict__["scale"]
            except KeyError:
                return x

        x = torch.ones(1)
        self.assertEqual(fn(x), x)
        self.assertEqual(fn(x), x)
        self.assertEqual(cnt.frame_count, 1)
        obj.scale = 7.0
        self.assertEqual(fn(x), x * 7)
        self.assertEqual(cnt.frame_count, 2)

    def test_dict_keys_items_and_len(self):
        class Obj:
            pass

        for read in (
            lambda d: len(d),
            lambda d: len(list(d.keys())),
            lambda d: len([v for _, v in d.items()]),
            lambda d: len(d.copy()),
        ):
            obj = Obj()
            cnt = CompileCounter()
            fn = torch.compile(
                lambda x: x * read(obj.__dict__), backend=cnt, fullgraph=True
            )
            x = torch.ones(1)
            self.assertEqual(fn(x), x * 0)
            obj.scale = 7.0
            self.assertEqual(fn(x), x * 1)
            self.assertEqual(cnt.frame_count, 2)

    def test_dict_setdefault(self):
        # setdefault returns the value present on entry, or writes the default:
        # it must not keep writing the default over a value set later.
        class Obj:
            pass

        obj = Obj()
        cnt = CompileCounter()

        @torch.compile(backend=cnt, fullgraph=True)
        def fn(x):
            return x * obj.__dict__.setdefault("scale", 2.0)

        x = torch.ones(1)
        self.assertEqual(fn(x), x * 2)
        obj.scale = 7.0
        self.assertEqual(fn(x), x * 7)
        self.assertEqual(obj.scale, 7.0)
        self.assertEqual(fn(x), x * 7)
        self.assertEqual(cnt.frame_count, 2)

    def test_dict_store_needs_no_keys_guard(self):
        # A store into __dict__ does not depend on the keys already there: adding
        # an unrelated attribute must not recompile.
        class Mod(torch.nn.Module):
            def forward(self, x):
                self.__dict__["scale"] = 2.0
                self.__dict__.update(offset=1.0)
                return x * self.scale + self.offset

        mod = Mod()
        cnt = CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.ones(2)
        self.assertEqual(opt_mod(x), x * 2 + 1)
        mod.unrelated = 1
        self.assertEqual(opt_mod(x), x * 2 + 1)
        self.assertEqual(cnt.frame_count, 1)

    def test_key_guard_with_hasattr_of_property_over_lazy_key(self):
        """`"_x" in o.__dict__` and `o.__dict__.get("_x", d)` guard the key
        absent; `hasattr(o, "px")`, a property over `_x` that __getattr__
        computes and stores, is guarded by running the property for real as the
        guards are built, which stores `_x`. Fresh objects: eager's values."""

        class C:
            def __getattr__(self, name):
                if name == "_x":
                    self._x = 3.0
                    return 3.0
                raise AttributeError(name)

            @property
            def px(self):
                return self._x + 1.0

        def f_in(x, o):
            return (
                x
                + (1.0 if "_x" in o.__dict__ else 0.0)
                + (1.0 if hasattr(o, "px") else -1.0)
            )

        def f_get(x, o):
            return x + o.__dict__.get("_x", 10.0) + (1.0 if hasattr(o, "px") else -1.0)

        def run(fn):
            out = []
            for _ in range(3):
                o = C()
                out.append((fn(torch.ones(1), o).item(), sorted(o.__dict__)))
            return out

        for fn in (f_in, f_get):
            for backend in ("eager", "aot_eager"):
                with self.subTest(fn=fn.__name__, backend=backend):
                    expected = run(fn)
                    torch._dynamo.reset()
                    self.assertEqual(
                        run(torch.compile(fn, backend=backend, fullgraph=True)),
                        expected,
                    )

    def test_key_guard_with_hasattr_of_property_that_stores_outside_compile(self):
        """A property that stores `_x` into `__dict__` only when not compiling:
        the traced frame stores nothing and guards the keys it read (`in`,
        `get`, `len()`, a caught `KeyError`); `hasattr(o, "x")` and
        `getattr(o, "x", None)` must not run the property as the guards are
        built or checked, which would store `_x` and fail those guards (on the
        frame that built them, or on the next call, recompiling for the state
        the guard created). Fresh objects: eager's values on every call."""

        def read_in(o, t):
            return t + 10 if "_x" in o.__dict__ else t

        def read_get(o, t):
            return t + o.__dict__.get("_x", 10)

        def read_len(o, t):
            return t + len(o.__dict__)

        def read_keyerror(o, t):
            try:
                return t + o.__dict__["_x"]
            except KeyError:
                return t + 10

        def make_class(compiling):
            class C:
                @property
                def x(self):
                    if not compiling():
                        self.__dict__["_x"] = 1
                    return 2

            return C

        for compiling in (
            torch.compiler.is_compiling,
            torch.compiler.is_dynamo_compiling,
        ):
            for read in (read_in, read_get, read_len, read_keyerror):
                for form in ("hasattr", "getattr"):

                    def fn(o, t, read=read, form=form):
                        t = read(o, t)
                        if form == "hasattr":
                            return t * o.x if hasattr(o, "x") else t
                        v = getattr(o, "x", None)
                        return t * (3 if v is None else v)

                    def run(f, C):
                        return [f(C(), torch.ones(1)).item() for _ in range(3)]

                    with self.subTest(
                        compiling=compiling.__name__, read=read.__name__, form=form
                    ):
                        C = make_class(compiling)
                        expected = run(fn, C)
                        torch._dynamo.reset()
                        self.assertEqual(
                            run(torch.compile(fn, backend="eager"), C), expected
                        )

    def test_hasattr_guards_the_class_lookup_of_a_name_the_frame_wrote(self):
        """The frame writes `k` into `__dict__` and asks `hasattr(o, "k")`;
        the class has `__getattr__` and a plain attribute or method `k`. A
        property raising AttributeError set on the class before the third call
        is found before `__dict__`: eager answers False from then on."""

        def raising(self):
            raise AttributeError("k")

        for kind in ("value", "method"):

            def make():
                class C:
                    def __getattr__(self, name):
                        raise AttributeError(name)

                C.k = 7 if kind == "value" else (lambda self: 7)
                return C

            def fn(o, t):
                o.__dict__["k"] = 2
                return t * (2 if hasattr(o, "k") else 0)

            def run(f):
                C = make()
                o = C()
                out = []
                for i in range(4):
                    if i == 2:
                        C.k = property(raising)
                    out.append(f(o, torch.ones(1)).item())
                return out

            with self.subTest(kind=kind):
                expected = run(fn)
                self.assertEqual(expected, [2.0, 2.0, 0.0, 0.0])
                torch._dynamo.reset()
                self.assertEqual(run(torch.compile(fn, backend="eager")), expected)

    def test_hasattr_guards_the_code_of_getattr(self):
        """`hasattr(o, "a")` and `getattr(o, "a", 0)` of a name that
        `__getattr__` supplies; its `__code__` replaced (a hot reload) by one
        that raises before the third call: eager answers False / 0."""

        def other(self, name):
            raise AttributeError(name)

        for form in ("hasattr", "getattr"):

            def fn(o, t, form=form):
                if form == "hasattr":
                    return t * (2 if hasattr(o, "a") else 0)
                return t * getattr(o, "a", 0)

            def run(f):
                class C:
                    def __getattr__(self, name):
                        if name == "a":
                            return 2
                        raise AttributeError(name)

                saved = C.__getattr__.__code__
                o = C()
                out = []
                for i in range(4):
                    if i == 2:
                        C.__getattr__.__code__ = other.__code__
                    out.append(f(o, torch.ones(1)).item())
                C.__getattr__.__code__ = saved
                return out

            with self.subTest(form=form):
                expected = run(fn)
                self.assertEqual(expected, [2.0, 2.0, 0.0, 0.0])
                torch._dynamo.reset()
                self.assertEqual(run(torch.compile(fn, backend="eager")), expected)


class _MemoizingProperty:
    @property
    def p(self):
        self.__dict__.setdefault("_memo", 1)
        return 2


class _WithMethod:
    def m(self):
        return 2


def _memo_key_and_hasattr(x, o):
    r = 3.0 if "_memo" in o.__dict__ else 5.0
    return x * r * (2.0 if hasattr(o, "p") else 1.0)


def _memo_key_and_method_hasattr(x, o):
    r = 3.0 if "_memo" in o.__dict__ else 5.0
    return x * r * (2.0 if hasattr(o, "m") else 1.0)


class _LazyList(list):
    # Records in its owner's __dict__ that it was measured (LENGTH_CHECK
    # calls this __len__ when the guards are built and checked).
    def __init__(self, owner, *args):
        super().__init__(*args)
        self._owner = owner

    def __len__(self):
        self._owner.__dict__["_materialized"] = True
        return super().__len__()


class _LazyListOwner:
    def __init__(self):
        self.items = _LazyList(self, [2.0, 3.0])


def _materialized_key_and_list_index(x, o):
    r = 3.0 if "_materialized" in o.__dict__ else 5.0
    return x * r * o.items[0]


class _TensorWithProperty(torch.Tensor):
    @property
    def tag(self):
        return 1.0


class HasattrUserCodeKeyGuardTests(torch._dynamo.test_case.TestCase):
    """HASATTR runs the real lookup when the guards are built and checked. In
    a frame where that lookup may run user code, the frame gets no guard on
    the keys of an instance __dict__ (as without them); elsewhere it does."""

    @staticmethod
    def _key_leaves(fn):
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        kinds = []
        for entry in _debug_get_cache_entry_list(fn.__code__):
            stack = [entry.guard_manager.root]
            while stack:
                mgr = stack.pop()
                stack.extend(mgr.get_child_managers())
                if mgr.get_source().endswith(".__dict__"):
                    kinds.extend(type(leaf).__name__ for leaf in mgr.get_leaf_guards())
        return sorted(kinds)

    def _check_calls(self, fn, make_state, calls=5, fullgraph=False):
        def run(f):
            out = []
            for i in range(calls):
                o = make_state(i)
                out.append(f(o, torch.ones(1)).item())
            return out

        expected = run(fn)
        torch._dynamo.reset()
        self.assertEqual(
            run(torch.compile(fn, backend="eager", fullgraph=fullgraph)), expected
        )

    def test_a_user_getattr_counts_where_this_object_holds_the_name(self):
        # The first object holds "cfg" in its __dict__, so hasattr answers
        # from it; the guard is checked on later objects of the class, which
        # lack it: there HASATTR runs __getattr__, which memoizes "cfg"
        # before the keys of __dict__ would be checked.
        class Cfg:
            def __getattr__(self, name):
                if name == "cfg":
                    self.__dict__["cfg"] = 1.0
                    return 1.0
                raise AttributeError(name)

        def make_state(i):
            o = Cfg()
            o.a = 1.0
            if i == 0:
                o.cfg = 1.0
            else:
                o.b = 1.0
            return o

        def with_hasattr(o, t):
            return t * len(o.__dict__) * (2.0 if hasattr(o, "cfg") else 1.0)

        self._check_calls(with_hasattr, make_state, calls=4)

    def test_nn_module_getattr_over_a_parameters_dict_subclass(self):
        # nn.Module.__getattr__ reads _parameters; a dict subclass with
        # Python methods there (ZeRO-3 style gathering) runs user code that
        # records the access in the module's __dict__.
        class Tracking(dict):
            def __init__(self, owner_dict, *args):
                super().__init__(*args)
                self._owner_dict = owner_dict

            def __contains__(self, key):
                self._owner_dict["_gathered"] = True
                return super().__contains__(key)

        def make_state(i):
            m = torch.nn.Linear(1, 1)
            m._parameters = Tracking(m.__dict__, m._parameters)
            return m

        def fn(m, t):
            r = 3.0 if "_gathered" in m.__dict__ else 5.0
            return t * r * (2.0 if hasattr(m, "weight") else 1.0)

        self._check_calls(fn, make_state, calls=4)

    def test_key_guards_only_without_user_code_in_hasattr(self):
        class C:
            def m(self):
                return 1.0

            @property
            def p(self):
                return 1.0

        class WithGetattr:
            def __getattr__(self, name):
                if name == "z":
                    return 1.0
                raise AttributeError(name)

        class Meta(type):
            pass

        class K(metaclass=Meta):
            pass

        t = torch.ones(1)
        t.tp_flag = True
        param = torch.nn.Parameter(torch.ones(1))
        param.tp_flag = True
        sub = torch.ones(1).as_subclass(_TensorWithProperty)
        sub.other = 1.0

        for obj, name, has_key_guard in (
            (C(), "m", True),
            (C(), "missing", True),
            (C, "m", True),
            # read on the class, a property is returned, not run
            (C, "p", True),
            (C(), "p", False),
            (WithGetattr(), "z", False),
            (K, "anything", False),
            # a Python attribute of a tensor is read from its __dict__
            (t, "tp_flag", True),
            (t, "missing", True),
            (param, "tp_flag", True),
            (sub, "other", True),
            # a property of a tensor subclass is Python code
            (sub, "tag", False),
        ):
            c = C()

            def fn(x, obj=obj, name=name, c=c):
                return (
                    (x + 1.0 if "k" in WithGetattr.__dict__ else x)
                    + (2.0 if "_x" in c.__dict__ else 0.0)
                    + (1.0 if hasattr(obj, name) else 0.0)
                )

            with self.subTest(obj=obj, name=name):
                torch._dynamo.reset()
                torch.compile(fn, backend="eager", fullgraph=True)(torch.ones(1))
                leaves = self._key_leaves(fn)
                self.assertEqual("DICT_CONTAINS" in leaves, has_key_guard, leaves)

    def test_no_same_frame_failure_when_hasattr_stores_a_guarded_key(self):
        # A memoizing property read through hasattr stores the key that the
        # frame reads with `in`, get() and len(); fresh objects each call.
        class C:
            @property
            def x(self):
                self.__dict__["_x"] = 1.0
                return 2.0

        for read in (
            lambda o, t: t + 10 if "_x" in o.__dict__ else t,
            lambda o, t: t + o.__dict__.get("_x", 10.0),
            lambda o, t: t + len(o.__dict__),
        ):

            def fn(o, t, read=read):
                t = read(o, t)
                return t * o.x if hasattr(o, "x") else t

            with self.subTest(read=read):
                self._check_calls(fn, lambda i: C())

    def test_hasattr_through_delegating_getattr(self):
        # hasattr of a name a wrapper's __getattr__ finds on another object,
        # set there after the first call.
        class Backend:
            pass

        class Wrapper:
            def __init__(self):
                self._b = Backend()

            def __getattr__(self, n):
                return getattr(self._b, n)

        w = Wrapper()

        def state(i):
            if i == 2:
                w._b.foo = 1
            if i == 4:
                del w._b.foo
            return w

        def fn(o, t):
            return t * (3 if hasattr(o, "foo") else 5)

        self._check_calls(fn, state, fullgraph=True)

    def test_hasattr_true_through_a_caught_miss(self):
        # __getattr__ answers from a caught AttributeError of another object.
        class Inner:
            pass

        class Outer:
            def __init__(self):
                self._b = Inner()

            def __getattr__(self, n):
                if n == "flag":
                    try:
                        _ = self._b.disabled
                    except AttributeError:
                        return 7
                raise AttributeError(n)

        o = Outer()

        def state(i):
            if i == 2:
                o._b.disabled = True
            if i == 4:
                del o._b.disabled
            return o

        def fn(o, t):
            return t * (3 if hasattr(o, "flag") else 5)

        self._check_calls(fn, state)

    def test_peft_style_wrapper_with_a_later_buffer(self):
        class Base(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(1, 1)

        class Peft(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = Base()

            def __getattr__(self, name):
                try:
                    return super().__getattr__(name)
                except AttributeError:
                    if name == "model":
                        raise
                    return getattr(self.model, name)

        peft = Peft()

        def state(i):
            if i == 2:
                peft.model.register_buffer("scale", torch.tensor(7.0))
            if i == 4:
                del peft.model.scale
            return peft

        for form in ("hasattr", "getattr"):

            def fn(o, t, form=form):
                if form == "hasattr":
                    return t * (3 if hasattr(o, "scale") else 5)
                v = getattr(o, "scale", None)
                return t * (5 if v is None else v)

            with self.subTest(form=form):
                self._check_calls(fn, state)

    def test_aot_compile_drops_key_guards_with_user_code_hasattr(self):
        # aot_compile builds the guards from the guards state dumped after
        # tracing; the memoizing property runs when they are built, so with
        # the key guard of `"_memo" in o.__dict__` kept the frame fails its
        # own guards. A fresh object every call.
        expected = [_memo_key_and_hasattr(torch.ones(1), _MemoizingProperty())]
        compiled = torch.compile(
            _memo_key_and_hasattr, fullgraph=True, backend="eager"
        ).aot_compile(((torch.ones(1), _MemoizingProperty()), {}))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "fn.bin")
            compiled.save_compiled_function(path)
            with open(path, "rb") as f:
                loaded = torch.compiler.load_compiled_function(f)
        for fn in (compiled, loaded):
            for _ in range(3):
                self.assertEqual(fn(torch.ones(1), _MemoizingProperty()), expected[0])

    def test_aot_compile_rebuilds_without_key_guards_when_a_list_len_stores(self):
        # The list's __len__ stores the key the frame read when the guards
        # are built; aot_compile's guards are built again without the key
        # guards, and the saved guards state holds the guard set without them.
        expected = _materialized_key_and_list_index(torch.ones(1), _LazyListOwner())
        compiled = torch.compile(
            _materialized_key_and_list_index, fullgraph=True, backend="eager"
        ).aot_compile(((torch.ones(1), _LazyListOwner()), {}))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "fn.bin")
            compiled.save_compiled_function(path)
            with open(path, "rb") as f:
                loaded = torch.compiler.load_compiled_function(f)
        for fn in (compiled, loaded):
            for _ in range(3):
                self.assertEqual(fn(torch.ones(1), _LazyListOwner()), expected)

    def test_aot_compile_keeps_key_guards_without_user_code(self):
        # A hasattr that meets a method runs no user code: the key guard
        # stays, and a call with the key added fails the guards instead of
        # returning the compiled branch.
        compiled = torch.compile(
            _memo_key_and_method_hasattr, fullgraph=True, backend="eager"
        ).aot_compile(((torch.ones(1), _WithMethod()), {}))
        self.assertEqual(compiled(torch.ones(1), _WithMethod()), torch.tensor([10.0]))
        o = _WithMethod()
        o._memo = 1
        with self.assertRaisesRegex(RuntimeError, "check failed"):
            compiled(torch.ones(1), o)

    def test_parameter_attribute_read_keeps_the_key_guards(self):
        # A Python attribute read on a parameter (Megatron's
        # `sequence_parallel`, a TP flag) installs HASATTR on the parameter.
        # Its lookup reads the tensor's __dict__ and runs no user code, so the
        # frame keeps the guard on whether the module's __dict__ has "scale"
        # (set, kept, removed and set again between calls).
        for form in ("getattr_default", "hasattr", "attribute"):

            class M(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.weight = torch.nn.Parameter(torch.full((1, 1), 2.0))
                    self.weight.tp_flag = True

                def forward(self, x, form=form):
                    r = 3.0 if "scale" in self.__dict__ else 5.0
                    if form == "getattr_default":
                        k = 1.0 if getattr(self.weight, "tp_flag", False) else 0.5
                    elif form == "hasattr":
                        k = 1.0 if hasattr(self.weight, "tp_flag") else 0.5
                    else:
                        k = 1.0 if self.weight.tp_flag else 0.5
                    return (x.view(1, 1) @ self.weight).view(1) * r * k

            mods = []

            def state(i):
                if i == 0:
                    mods[:] = [M()]
                m = mods[0]
                if i in (1, 4):
                    m.__dict__["scale"] = 1.0
                if i == 3:
                    del m.__dict__["scale"]
                return m

            with self.subTest(form=form):
                self._check_calls(lambda m, t: m(t), state)

    def test_hasattr_on_a_subclass_with_its_own_torch_function(self):
        # Dynamo calls a subclass's own __torch_function__ while it traces the
        # tensor; this one records that it ran in the registry whose __dict__
        # keys the frame read first, so the hasattr of a name the subclass
        # lacks counts as user code and the frame drops its key guards.
        class Registry:
            pass

        registry = Registry()

        class Recording(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                registry.__dict__["seen"] = 1
                return super().__torch_function__(func, types, args, kwargs or {})

        t = torch.ones(1).as_subclass(Recording)

        def fn(state, x):
            r = 3.0 if "seen" in registry.__dict__ else 5.0
            return x * r * (2.0 if hasattr(state, "tag") else 1.0)

        def state(i):
            registry.__dict__.pop("seen", None)
            return t

        self._check_calls(fn, state, calls=3)

    def test_hasattr_on_a_wrapper_subclass_with_its_own_tensor_flatten(self):
        # Dynamo calls a traceable wrapper subclass's __tensor_flatten__ while
        # it traces the tensor; this one records that it ran in the registry
        # whose __dict__ keys the frame read first, so the hasattr counts as
        # user code (DTensor's own __tensor_flatten__ does not).
        from torch.testing._internal.two_tensor import TwoTensor

        class Registry:
            pass

        registry = Registry()

        class Recording(TwoTensor):
            def __tensor_flatten__(self):
                registry.__dict__["seen"] = 1
                return super().__tensor_flatten__()

            @staticmethod
            def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
                return Recording(inner["a"], inner["b"])

        t = Recording(torch.ones(1), torch.ones(1))

        def fn(state, x):
            r = 3.0 if "seen" in registry.__dict__ else 5.0
            return x * r * (2.0 if hasattr(state, "tag") else 1.0)

        def state(i):
            registry.__dict__.pop("seen", None)
            return t

        self._check_calls(fn, state, calls=3)

    def test_no_same_frame_failure_when_a_list_len_stores_a_guarded_key(self):
        # LENGTH_CHECK calls a list subclass's Python __len__ when the guards
        # are built and checked; this lazily materialized list records that
        # in its owner's __dict__, whose keys the frame read first. The frame
        # has no hasattr: its guards are built again without the key guards.
        class LazyList(list):
            def __init__(self, owner, *args):
                super().__init__(*args)
                self._owner = owner

            def __len__(self):
                self._owner.__dict__["_materialized"] = True
                return super().__len__()

        class Owner:
            def __init__(self):
                self.items = LazyList(self, [2.0, 3.0])

        owner = Owner()

        def state(i):
            owner.__dict__.pop("_materialized", None)
            return owner

        for form, read in (
            ("in", lambda o: 3.0 if "_materialized" in o.__dict__ else 5.0),
            ("get", lambda o: 3.0 if o.__dict__.get("_materialized") else 5.0),
        ):
            for use in ("index", "iterate"):

                def fn(o, t, read=read, use=use):
                    r = read(o)
                    s = o.items[0] if use == "index" else sum(x for x in o.items)
                    return t * r * s

                with self.subTest(read=form, use=use):
                    self._check_calls(fn, state)

    def test_no_same_frame_failure_when_a_metaclass_property_stores_a_guarded_key(
        self,
    ):
        # `type(obj).scale` is guarded through GetAttrGuardAccessor, which runs
        # the metaclass property on every check; it records its use in a
        # registry whose __dict__ keys the frame read first.
        class Registry:
            pass

        registry = Registry()

        class Meta(type):
            @property
            def scale(cls):
                registry.__dict__["seen"] = True
                return 2.0

        class C(metaclass=Meta):
            pass

        def state(i):
            registry.__dict__.pop("seen", None)
            return C()

        for form, read in (
            ("in", lambda: 3.0 if "seen" in registry.__dict__ else 5.0),
            ("get", lambda: 3.0 if registry.__dict__.get("seen") else 5.0),
        ):

            def fn(obj, t, read=read):
                r = read()
                return t * r * type(obj).scale

            with self.subTest(read=form):
                self._check_calls(fn, state)

    def test_key_guards_stay_when_a_list_len_stores_nothing(self):
        # The rebuild is only for guards that fail on the frame that built
        # them: with a list subclass whose __len__ stores nothing, the key
        # guard stays and a key added later recompiles.
        class QuietList(list):
            def __len__(self):
                return super().__len__()

        class Owner:
            def __init__(self):
                self.items = QuietList([2.0, 3.0])

        owner = Owner()

        def state(i):
            if i == 0:
                owner.__dict__.pop("_materialized", None)
            if i == 2:
                owner.__dict__["_materialized"] = True
            return owner

        def fn(o, t):
            r = 3.0 if "_materialized" in o.__dict__ else 5.0
            return t * r * o.items[0]

        self._check_calls(fn, state, calls=4)
        self.assertIn("DICT_CONTAINS", self._key_leaves(fn))

    def test_a_value_guard_failing_on_its_frame_still_raises_with_key_guards(self):
        # A metaclass property that returns 1.0 on its first two runs and 2.0
        # afterwards stores nothing: its EQUALS_MATCH guard fails on the frame
        # that built it. Building the guards again would take 2.0 as the
        # expected value and reuse the graph traced with 1.0, so the frame
        # raises as before, although it reads an instance __dict__ key.
        runs = {"n": 0}

        class Meta(type):
            @property
            def scale(cls):
                runs["n"] += 1
                return 1.0 if runs["n"] <= 2 else 2.0

        class C(metaclass=Meta):
            pass

        class Other:
            pass

        other = Other()

        def fn(obj, t):
            q = 7.0 if "k" in other.__dict__ else 1.0
            return t * q * type(obj).scale

        compiled = torch.compile(fn, backend="eager")
        t = torch.ones(1)
        with self.assertRaisesRegex(AssertionError, "same frame it was created"):
            compiled(C(), t)
        for _ in range(3):
            self.assertEqual(compiled(C(), t), fn(C(), t))
            self.assertEqual(compiled(C(), t), t * 2.0)

    def test_a_key_guard_and_a_value_guard_failing_together_still_raise(self):
        # The guards' user code (two metaclass properties, on their build-time
        # check) stores a key the frame read and changes a value another guard
        # checks. check_verbose reports the key guard, but guards built again
        # would take the changed value (cfg.scale 2.0) as expected and reuse
        # the graph traced with 1.0, so the frame raises as before.
        runs = {"s1": 0, "s2": 0}

        class Box:
            pass

        reg, cfg = Box(), Box()
        cfg.scale = 1.0

        class StoresKey(type):
            @property
            def s1(cls):
                runs["s1"] += 1
                if runs["s1"] == 3:
                    reg.__dict__["a_k"] = True
                return 1.0

        class ChangesValue(type):
            @property
            def s2(cls):
                runs["s2"] += 1
                if runs["s2"] == 3:
                    cfg.scale = 2.0
                return 1.0

        class C(metaclass=StoresKey):
            pass

        class D(metaclass=ChangesValue):
            pass

        def fn(a_m, W_a_m, c, d, t):
            q = 3.0 if "a_k" in a_m.__dict__ else 5.0
            return t * q * type(c).s1 * type(d).s2 * W_a_m.scale

        compiled = torch.compile(fn, backend="eager")
        t = torch.ones(1)
        with self.assertRaisesRegex(AssertionError, "same frame it was created"):
            compiled(reg, cfg, C(), D(), t)
        for _ in range(3):
            self.assertEqual(compiled(reg, cfg, C(), D(), t), t * 6.0)


class _AlwaysMaterializingList(list):
    # LENGTH_CHECK calls this __len__ on every check of the guards; it records
    # the call in its owner's __dict__, whose keys the frame reads.
    def __init__(self, owner, *args):
        super().__init__(*args)
        self._owner = owner

    def __len__(self):
        self._owner.__dict__["_m"] = True
        return super().__len__()


class _MaterializedOwner:
    pass


def _materialized_key_times_item(o, t):
    r = 3.0 if "_m" in o.__dict__ else 5.0
    return t * r * o.items[0]


def _key_and_string(c, d, t):
    # Reads the globals `keys_owner` and `values_owner` of the namespace it is
    # rebound to.
    q = 3.0 if "k" in keys_owner.__dict__ else 5.0  # noqa: F821
    r = 1.0 if values_owner.v == "x #1" else 1.2  # noqa: F821
    return t * q * type(c).s1 * type(d).s2 * r


def _key_and_constant(c, d, t):
    q = 3.0 if "k" in keys_owner.__dict__ else 5.0  # noqa: F821
    return t * q * type(c).s1 * type(d).s2 * values_owner.cfg.scale  # noqa: F821


def _with_globals(fn, **names):
    namespace = {"__builtins__": __builtins__, "torch": torch, **names}
    return types.FunctionType(fn.__code__, namespace, fn.__name__)


class KeyGuardFallbackTests(torch._dynamo.test_case.TestCase):
    """A frame whose guards fail on the frame that built them after guard
    code stored a key the frame read falls back to the guards of the same build
    without the instance __dict__ key guards. Those keep the expected values
    taken before the check ran the guard code: a value that guard code changed
    as well fails them (the same-frame AssertionError, as before key guards),
    whatever the guard printout shows, and a frame where nothing else changed
    keeps its graph."""

    def _key_and_value_writers(self, value_attr, old, new):
        # Metaclass properties read through GetAttrGuardAccessor: on their
        # third run (the check of the guards when they are built) P stores the
        # key the frame read and Q replaces a value another guard checks.
        runs = {"p": 0, "q": 0}

        class Box:
            pass

        reg, cfg = Box(), Box()
        setattr(cfg, value_attr, old)

        class StoresKey(type):
            @property
            def s1(cls):
                runs["p"] += 1
                if runs["p"] == 3:
                    reg.__dict__["k"] = True
                return 1.0

        class ChangesValue(type):
            @property
            def s2(cls):
                runs["q"] += 1
                if runs["q"] == 3:
                    setattr(cfg, value_attr, new)
                return 1.0

        class C(metaclass=StoresKey):
            pass

        class D(metaclass=ChangesValue):
            pass

        return reg, cfg, C, D

    def _raises_then_equals_eager(self, fn, args, dynamic=None):
        compiled = torch.compile(fn, backend="eager", dynamic=dynamic)
        with self.assertRaisesRegex(AssertionError, "same frame it was created"):
            compiled(*args())
        for _ in range(3):
            self.assertEqual(compiled(*args()), fn(*args()))

    def test_changed_string_with_a_hash_sign_raises(self):
        # EQUALS_MATCH prints 'x #1' and 'x #2'; a comparison of the guard
        # printouts cut at " #" took them for the same guard.
        reg, cfg, C, D = self._key_and_value_writers("v", "x #1", "x #2")
        fn = _with_globals(_key_and_string, keys_owner=reg, values_owner=cfg)
        self._raises_then_equals_eager(fn, lambda: (C(), D(), torch.ones(1)))

    def _check_constant_with_repr(self, cfg_cls):
        torch.utils._pytree.register_constant(cfg_cls)
        reg, cfg, C, D = self._key_and_value_writers(
            "cfg", cfg_cls("c", 1.0), cfg_cls("c", 2.0)
        )
        fn = _with_globals(_key_and_constant, keys_owner=reg, values_owner=cfg)
        self._raises_then_equals_eager(
            fn, lambda: (C(), D(), torch.ones(1)), dynamic=True
        )

    def test_changed_constant_whose_repr_hides_the_field_raises(self):
        # A pytree constant compared by EQUALS_MATCH whose repr leaves out a
        # field its __eq__ compares: both expected values print the same.
        @dataclasses.dataclass(frozen=True, slots=True)
        class Cfg:
            name: str
            scale: float = dataclasses.field(default=1.0, repr=False)

        self._check_constant_with_repr(Cfg)

    def test_changed_constant_with_a_two_line_repr_raises(self):
        @dataclasses.dataclass(frozen=True, slots=True)
        class Cfg:
            name: str
            scale: float = 1.0

            def __repr__(self):
                return f"Cfg(name={self.name!r},\n    scale={self.scale!r})"

        self._check_constant_with_repr(Cfg)

    def _check_key_stored_by_len(self, make_tensor, value_of):
        # Eager never calls len(): the key is never there. The guards' own
        # write must not change the compiled results.
        for backend in ("eager", "aot_eager"):
            for dynamic in (False, True):
                with self.subTest(backend=backend, dynamic=dynamic):
                    torch._dynamo.reset()
                    o = _MaterializedOwner()
                    o.items = _AlwaysMaterializingList(o, [2.0])
                    compiled = torch.compile(
                        _materialized_key_times_item, backend=backend, dynamic=dynamic
                    )
                    for i in range(4):
                        if i == 2:
                            o.__dict__.pop("_m", None)
                        out = compiled(o, make_tensor())
                        self.assertEqual(value_of(out), torch.full((2,), 10.0))

    def test_key_stored_by_len_with_a_tensor_subclass_input(self):
        # TENSOR_SUBCLASS_METADATA_MATCH is a lambda leaf made anew on every
        # build (its printout names the closure by id).
        from torch.testing._internal.two_tensor import TwoTensor

        self._check_key_stored_by_len(
            lambda: TwoTensor(torch.ones(2), torch.ones(2)), lambda out: out.a
        )

    def test_key_stored_by_len_with_a_dtensor_input(self):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import distribute_tensor, Replicate
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        self.addCleanup(dist.destroy_process_group)
        mesh = init_device_mesh("cpu", (2,))
        self._check_key_stored_by_len(
            lambda: distribute_tensor(torch.ones(2), mesh, [Replicate()]),
            lambda out: out.to_local(),
        )

    def test_key_stored_by_len_with_dispatch_key_changes_between_calls(self):
        # The key guards fail on every build here (the key is popped before
        # each call). The tensor guards of the entry that is installed must
        # read the dispatch keys of the call that checks them: calls under
        # autocast or inference_mode and calls outside alternate, and each
        # kind keeps its own entry.
        def fn(o, t):
            r = 3.0 if "_m" in o.__dict__ else 5.0
            s = 2.0 if torch.is_autocast_enabled("cpu") else 1.0
            return t * r * o.items[0] * s

        contexts = {
            "autocast": lambda: torch.autocast("cpu"),
            "inference_mode": torch.inference_mode,
        }
        for name, context in contexts.items():
            for dynamic in (False, True):
                with self.subTest(context=name, dynamic=dynamic):
                    torch._dynamo.reset()
                    cnt = CompileCounter()
                    compiled = torch.compile(fn, backend=cnt, dynamic=dynamic)
                    o = _MaterializedOwner()
                    o.items = _AlwaysMaterializingList(o, [2.0])
                    eager_o = _MaterializedOwner()
                    eager_o.items = _AlwaysMaterializingList(eager_o, [2.0])
                    for inside in (False, True, False, True, False, False):
                        o.__dict__.pop("_m", None)
                        eager_o.__dict__.pop("_m", None)
                        with context() if inside else contextlib.nullcontext():
                            out = compiled(o, torch.ones(2))
                            expected = fn(eager_o, torch.ones(2))
                        self.assertEqual(out, expected)
                    self.assertEqual(cnt.frame_count, 2)

    def test_aot_compile_key_stored_by_len_with_a_tensor_subclass_input(self):
        from torch.testing._internal.two_tensor import TwoTensor

        def fn(t, o):
            return _materialized_key_times_item(o, t)

        o = _MaterializedOwner()
        o.items = _AlwaysMaterializingList(o, [2.0])

        def make():
            return TwoTensor(torch.ones(2), torch.ones(2))

        compiled = torch.compile(fn, fullgraph=True, backend="eager").aot_compile(
            ((make(), o), {})
        )
        for _ in range(3):
            self.assertEqual(compiled(make(), o).a, torch.full((2,), 10.0))

    # Guard code that moves a guarded value back and forth within one compile
    # (v1, v2, v1, v2 over its runs): the guards built again without the key
    # guards read v2, and a check of the first build's values and one of the
    # second build's, run one after the other, can each see the value it
    # expects. The second build must be kept only if its guards expect what
    # the first build's expected; each call raises the same-frame
    # AssertionError or returns eager's value, and later calls match eager.

    def _check_toggled_value(self, compiled, eager, calls=4):
        for i in range(calls):
            try:
                out = compiled()
            except AssertionError as e:
                self.assertIn("same frame it was created", str(e))
                self.assertLess(i, 2)
                continue
            self.assertEqual(out, eager())

    def test_value_toggled_by_len_within_one_compile(self):
        class KeyList(list):
            def __init__(self, owner, *args):
                super().__init__(*args)
                self.owner = owner

            def __len__(self):
                if arm["on"]:
                    self.owner.__dict__["_m"] = True
                return super().__len__()

        class ValList(list):
            def __init__(self, owner, *args):
                super().__init__(*args)
                self.owner = owner
                self.n = 0

            def __len__(self):
                if arm["on"]:
                    self.n += 1
                    if self.n in (2, 4, 5):
                        o = self.owner
                        o.mode = "x2" if o.mode == "x1" else "x1"
                return super().__len__()

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mode = "x1"
                self.a = KeyList(self, [2.0])
                self.b = ValList(self, [1.0])

            def forward(self, x):
                q = 3.0 if "_m" in self.__dict__ else 5.0
                r = 1.0 if self.mode == "x1" else 1.2
                return x * q * r * self.a[0] * self.b[0]

        for dynamic in (False, True):
            with self.subTest(dynamic=dynamic):
                torch._dynamo.reset()
                arm = {"on": True}
                m = M()
                compiled = torch.compile(m, backend="eager", dynamic=dynamic)

                def eager():
                    arm["on"] = False
                    try:
                        return m(torch.ones(1))
                    finally:
                        arm["on"] = True

                self._check_toggled_value(lambda: compiled(torch.ones(1)), eager)
                self.assertEqual(m.mode, "x2")
                self.assertEqual(compiled(torch.ones(1)), torch.full((1,), 7.2))

    def test_aliasing_made_by_guard_code_next_to_a_key_guard(self):
        # A list subclass's __len__ (LENGTH_CHECK), on its run in the check
        # made when the guards are built, makes d.w the tensor b.w is and
        # stores the key the frame read from c.__dict__. The key guard fails
        # first, and the aliasing guard of b.w and d.w has a member (b.w)
        # checked before the key guard: the fallback must still see the
        # aliasing, and not run the graph traced with two tensors on one.
        arm = {"on": True, "runs": 0}

        class Obj:
            pass

        b, c, d = Obj(), Obj(), Obj()
        b.w, d.w = torch.ones(2), torch.full((2,), 10.0)

        class StoresOnSecondLen(list):
            def __len__(self):
                if arm["on"]:
                    arm["runs"] += 1
                    if arm["runs"] == 2:
                        d.w = b.w
                        c.__dict__["_m"] = True
                return super().__len__()

        def fn(x, a, b, c, d):
            b.w.add_(1.0)
            q = 3.0 if "_m" in c.__dict__ else 5.0
            return x * d.w * q * a[0]

        a = StoresOnSecondLen([1.0])
        compiled = torch.compile(fn, backend="aot_eager")
        for call in range(3):
            with self.subTest(call=call):
                try:
                    out = compiled(torch.ones(2), a, b, c, d)
                except AssertionError as e:
                    # The same-frame guard failure, as without key guards.
                    self.assertEqual(call, 0)
                    self.assertIn("Guard failed on the same frame", str(e))
                    continue
                # The state after the call: b.w was incremented once (d.w is
                # b.w), and the key is present.
                self.assertIs(d.w, b.w)
                self.assertEqual(out, b.w * 3.0)

    def test_dict_entry_changed_by_guard_code_next_to_a_key_guard(self):
        # As above, but the value guard code changes is an entry of a dict the
        # frame iterates (its guards sit on the dict guard's entries, which
        # are not among its child managers): the fallback must check them.
        arm = {"on": True, "runs": 0}

        class Obj:
            pass

        c = Obj()
        e = {"k": 1.0, "t": torch.ones(2)}

        class StoresOnSecondLen(list):
            def __len__(self):
                if arm["on"]:
                    arm["runs"] += 1
                    if arm["runs"] == 2:
                        e["k"] = 2.0
                        e["t"] = torch.full((2,), 10.0)
                        c.__dict__["_m"] = True
                return super().__len__()

        def fn(a, c, e):
            q = 3.0 if "_m" in c.__dict__ else 5.0
            s = 0.0
            for k, v in e.items():
                if k == "k":
                    s = s + v
            return e["t"] * s * q * a[0]

        a = StoresOnSecondLen([1.0])
        compiled = torch.compile(fn, backend="eager")
        for call in range(3):
            with self.subTest(call=call):
                try:
                    out = compiled(a, c, e)
                except AssertionError as err:
                    # The same-frame guard failure, as without key guards.
                    self.assertEqual(call, 0)
                    self.assertIn("Guard failed on the same frame", str(err))
                    continue
                arm["on"] = False
                try:
                    self.assertEqual(out, fn(a, c, e))
                finally:
                    arm["on"] = True

    def test_value_toggled_by_every_third_len_with_key_guards(self):
        # The frame reads a key of its __dict__ (a key guard) that nothing
        # stores, and a value that a list subclass's __len__ (LENGTH_CHECK)
        # flips on its runs 2, 5, 8, ...: on each compile, the run of the
        # check made when the guards are built. That check reads the flipped
        # value only where it would without key guards; the key guards must
        # not make the guard code run once more or read other values there.
        class ValList(list):
            def __init__(self, owner, *args):
                super().__init__(*args)
                self.owner = owner
                self.n = 0

            def __len__(self):
                if arm["on"]:
                    self.n += 1
                    if self.n % 3 == 2:
                        o = self.owner
                        o.mode = "x2" if o.mode == "x1" else "x1"
                return super().__len__()

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mode = "x1"
                self.a = [2.0]
                self.b = ValList(self, [1.0])

            def forward(self, x):
                q = 3.0 if "_m" in self.__dict__ else 5.0
                r = 1.0 if self.mode == "x1" else 1.2
                return x * q * r * self.a[0] * self.b[0]

        for dynamic in (False, True):
            with self.subTest(dynamic=dynamic):
                torch._dynamo.reset()
                arm = {"on": True}
                m = M()
                cnt = CompileCounter()
                compiled = torch.compile(m, backend=cnt, dynamic=dynamic)
                for _ in range(6):
                    arm["on"] = False
                    try:
                        expected = m(torch.ones(1))
                    finally:
                        arm["on"] = True
                    self.assertEqual(compiled(torch.ones(1)), expected)
                self.assertEqual(cnt.frame_count, 2)

    def test_value_toggled_by_a_metaclass_property_within_one_compile(self):
        runs = {"p": 0, "q": 0}
        arm = {"on": True}

        class Box:
            pass

        reg, cfg = Box(), Box()
        cfg.v = "x1"

        class StoresKey(type):
            @property
            def s1(cls):
                if arm["on"]:
                    reg.__dict__["k"] = True
                return 1.0

        class TogglesValue(type):
            @property
            def s2(cls):
                if arm["on"]:
                    runs["q"] += 1
                    if runs["q"] in (3, 5, 6):
                        cfg.v = "x2" if cfg.v == "x1" else "x1"
                return 1.0

        class C(metaclass=StoresKey):
            pass

        class D(metaclass=TogglesValue):
            pass

        def fn(c, d, t):
            q = 3.0 if "k" in keys_owner.__dict__ else 5.0  # noqa: F821
            r = 1.0 if values_owner.v == "x1" else 1.2  # noqa: F821
            return t * q * type(c).s1 * type(d).s2 * r

        fn = _with_globals(fn, keys_owner=reg, values_owner=cfg)
        compiled = torch.compile(fn, backend="eager")

        def eager():
            arm["on"] = False
            try:
                return fn(C(), D(), torch.ones(1))
            finally:
                arm["on"] = True

        self._check_toggled_value(lambda: compiled(C(), D(), torch.ones(1)), eager)
        self.assertEqual(cfg.v, "x2")
        self.assertEqual(compiled(C(), D(), torch.ones(1)), torch.full((1,), 3.6))

    def test_aot_compile_value_toggled_by_len_within_one_compile(self):
        arm = {"on": True}

        class KeyList(list):
            def __len__(self):
                if arm["on"]:
                    o.__dict__["_m"] = True
                return super().__len__()

        class ValList(list):
            n = 0

            def __len__(self):
                if arm["on"]:
                    self.n += 1
                    if self.n in (3, 5, 6):
                        o.mode = "x2" if o.mode == "x1" else "x1"
                return super().__len__()

        def fn(t, o):
            q = 3.0 if "_m" in o.__dict__ else 5.0
            r = 1.0 if o.mode == "x1" else 1.2
            return t * q * r * o.a[0] * o.b[0]

        o = _MaterializedOwner()
        o.mode = "x1"
        o.a = KeyList([2.0])
        o.b = ValList([1.0])

        def eager():
            arm["on"] = False
            try:
                return fn(torch.ones(1), o)
            finally:
                arm["on"] = True

        try:
            compiled = torch.compile(fn, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(1), o), {})
            )
        except AssertionError as e:
            self.assertIn("same frame it was created", str(e))
            return
        for _ in range(3):
            try:
                out = compiled(torch.ones(1), o)
            except RuntimeError as e:
                self.assertIn("GuardManager check failed", str(e))
                continue
            self.assertEqual(out, eager())


def _inner_with_key_guard(t, o):
    return t * o.__dict__.get("s", 2.0)


def _inner_without_key_guard(t, o):
    return t * 2.0


class KeyGuardNestedBuildTests(torch._dynamo.test_case.TestCase):
    """A guard build runs user code (a list subclass's __len__ under
    LENGTH_CHECK) that may call another compiled function: that frame is
    compiled, and its guards built, within the guard build of the first
    frame. Each build keeps to its own guards, with or without instance
    __dict__ key guards on either frame."""

    def _check_nested_build(self, inner_fn, stores_key):
        arm = {"on": True}
        inner_obj = _MaterializedOwner()
        inner = torch.compile(inner_fn, backend="eager")
        inner_outs = []

        class CallsCompiled(list):
            def __init__(self, owner, *args):
                super().__init__(*args)
                self.owner = owner

            def __len__(self):
                if arm["on"]:
                    inner_outs.append(inner(torch.ones(1), inner_obj))
                    if stores_key:
                        self.owner.__dict__["_m"] = True
                return super().__len__()

        def fn(o, t):
            r = 3.0 if "_m" in o.__dict__ else 5.0
            return t * r * o.__dict__.get("scale", 1.0) * o.items[0]

        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        o = _MaterializedOwner()
        o.items = CallsCompiled(o, [2.0])
        for _ in range(3):
            o.__dict__.pop("_m", None)
            out = compiled(o, torch.ones(1))
            arm["on"] = False
            try:
                o.__dict__.pop("_m", None)
                self.assertEqual(out, fn(o, torch.ones(1)))
                expected_inner = inner_fn(torch.ones(1), inner_obj)
            finally:
                arm["on"] = True
            self.assertTrue(inner_outs)
            for inner_out in inner_outs:
                self.assertEqual(inner_out, expected_inner)
            inner_outs.clear()
        # The frame is compiled once: its key guards pass, or fail only
        # through the key its own guards stored, and are built again without
        # them. The guards of the frame compiled within its build are not its
        # own: they do not make the two builds differ.
        self.assertEqual(cnt.frame_count, 1)
        if stores_key:
            (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(fn.__code__)
            self.assertNotIn("___dict_contains('_m'", str(entry.guard_manager))

    def test_nested_build_of_a_frame_with_key_guards(self):
        for stores_key in (False, True):
            with self.subTest(stores_key=stores_key):
                torch._dynamo.reset()
                self._check_nested_build(_inner_with_key_guard, stores_key)

    def test_nested_build_of_a_frame_without_key_guards(self):
        for stores_key in (False, True):
            with self.subTest(stores_key=stores_key):
                torch._dynamo.reset()
                self._check_nested_build(_inner_without_key_guard, stores_key)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
