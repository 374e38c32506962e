# Owner(s): ["module: dynamo"]
# Upstream home: test/dynamo/test_modules.py (NNModuleTests); kept in its own file
# here because the project never edits upstream files.

import collections
import functools

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch.nn.functional as F
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


def guard_managers(fn):
    """Every guard manager in the guards of fn's only cache entry, depth first
    (test_module_dict_guard_count.py imports it from here)."""
    [entry] = _debug_get_cache_entry_list(fn.__code__)
    stack = [entry.guard_manager.root]
    while stack:
        mgr = stack.pop()
        yield mgr
        stack.extend(mgr.get_child_managers())
        if hasattr(mgr, "get_key_value_managers"):
            for pair in mgr.get_key_value_managers().values():
                stack.extend(m for m in pair if m is not None)


class NNModuleInstanceDictShadowTests(torch._dynamo.test_case.TestCase):
    # An entry in a module's instance __dict__ named like a registered parameter,
    # buffer or submodule shadows it in eager: Python finds __dict__ before
    # nn.Module.__getattr__. A module compiled before the entry appeared has to
    # recompile and use it too (pytorch/pytorch#197859).

    class _ShadowModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 4))
            self.register_buffer("scale", torch.full((4,), 2.0))
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(F.linear(x, self.weight) * self.scale)

    def _check_dict_shadow_recompiles(self, mod, name, shadow):
        cnt = torch._dynamo.testing.CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.randn(2, 4)
        self.assertEqual(opt_mod(x), mod(x))
        self.assertEqual(cnt.frame_count, 1)

        object.__setattr__(mod, name, shadow)  # lands in mod.__dict__
        self.assertIs(getattr(mod, name), shadow)
        self.assertEqual(opt_mod(x), mod(x))
        self.assertEqual(cnt.frame_count, 2)

    def test_instance_dict_shadows_parameter(self):
        self._check_dict_shadow_recompiles(
            self._ShadowModule(), "weight", torch.zeros(4, 4)
        )

    def test_instance_dict_shadows_buffer(self):
        self._check_dict_shadow_recompiles(
            self._ShadowModule(), "scale", torch.full((4,), -1.0)
        )

    def test_instance_dict_shadows_submodule(self):
        self._check_dict_shadow_recompiles(
            self._ShadowModule(), "inner", torch.nn.Identity()
        )

    def test_instance_dict_shadows_builtin_module_parameter(self):
        self._check_dict_shadow_recompiles(
            torch.nn.Linear(4, 4), "weight", torch.zeros(4, 4)
        )

    def test_instance_dict_shadows_parameter_next_to_a_pure_hasattr(self):
        # A Python attribute read on a parameter (`getattr(p, name, default)`,
        # `hasattr`, a plain read) and `hasattr` of a property on the class run
        # no user code in their HASATTR guard: the frame keeps the guard that
        # `weight` is not shadowed in the module's __dict__.
        for form in ("getattr_default", "hasattr", "attribute", "class_property"):

            class M(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.weight = torch.nn.Parameter(torch.randn(4, 4))
                    self.weight.tp_flag = True

                @property
                def local(self):
                    return False

                def forward(self, x, form=form):
                    if form == "getattr_default":
                        k = 1.0 if getattr(self.weight, "tp_flag", False) else 0.5
                    elif form == "hasattr":
                        k = 1.0 if hasattr(self.weight, "tp_flag") else 0.5
                    elif form == "attribute":
                        k = 1.0 if self.weight.tp_flag else 0.5
                    else:
                        k = 1.0 if hasattr(type(self), "local") else 0.5
                    return F.linear(x, self.weight) * k

            shadow = torch.zeros(4, 4)
            shadow.tp_flag = False
            with self.subTest(form=form):
                self._check_dict_shadow_recompiles(M(), "weight", shadow)

    # Every __getattr__ runs only after the instance __dict__ missed, so the
    # shadow is checked for whichever __getattr__ found the attribute, not only
    # for the stock nn.Module.__getattr__ with plain-dict _parameters.

    def test_instance_dict_shadows_parameter_with_getattr_override(self):
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(4, 4))

            def __getattr__(self, name):
                return super().__getattr__(name)

            def forward(self, x):
                return F.linear(x, self.weight)

        self._check_dict_shadow_recompiles(Mod(), "weight", torch.zeros(4, 4))

    def test_instance_dict_shadows_attribute_of_delegating_getattr(self):
        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = torch.nn.Linear(4, 4)

            def __getattr__(self, name):
                try:
                    return super().__getattr__(name)
                except AttributeError:
                    return getattr(self.inner, name)

            def forward(self, x):
                return x + self.bias  # found on self.inner

        self._check_dict_shadow_recompiles(Mod(), "bias", torch.zeros(4))

    def test_instance_dict_shadows_parameter_in_ordered_dict_parameters(self):
        # Modules unpickled from old checkpoints keep OrderedDict _parameters,
        # which Dynamo traces through nn.Module.__getattr__ itself.
        mod = self._ShadowModule()
        mod._parameters = collections.OrderedDict(mod._parameters)
        self._check_dict_shadow_recompiles(mod, "weight", torch.zeros(4, 4))

    def test_instance_dict_shadows_attribute_of_plain_object_getattr(self):
        class Config:
            def __init__(self):
                self._store = {"scale": torch.ones(4)}

            def __getattr__(self, name):
                try:
                    return self.__dict__["_store"][name]
                except KeyError:
                    raise AttributeError(name) from None

        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.cfg = Config()

            def forward(self, x):
                return x * self.cfg.scale

        mod = Mod()
        cnt = torch._dynamo.testing.CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.randn(2, 4)
        self.assertEqual(opt_mod(x), mod(x))
        mod.cfg.scale = torch.full((4,), 5.0)  # lands in cfg.__dict__
        self.assertEqual(opt_mod(x), x * 5)
        self.assertEqual(cnt.frame_count, 2)

    def test_instance_dict_shadow_of_plain_object_getattr_skip_guard_eval_unsafe(
        self,
    ):
        # Under skip_guard_eval_unsafe only the guards that tell the cache entries
        # apart run: the entry compiled with the shadow reads it as obj.s, and
        # that value check must stay next to the other entry's absent-key leaf.
        class Obj:
            def __getattr__(self, name):
                if name == "s":
                    return 2.0
                raise AttributeError(name)

        def fn(obj, x):
            return x * obj.s

        def shadow(obj):
            obj.__dict__["s"] = 7.0

        def unshadow(obj):
            obj.__dict__.pop("s", None)

        x = torch.ones(2)
        for first_shadowed in (False, True):
            with self.subTest(first_shadowed=first_shadowed):
                torch._dynamo.reset()
                obj = Obj()
                cnt = torch._dynamo.testing.CompileCounter()
                opt_fn = torch.compile(fn, backend=cnt, fullgraph=True)
                for i in range(6):
                    (shadow if (i % 2 == 0) == first_shadowed else unshadow)(obj)
                    if i < 2:
                        self.assertEqual(opt_fn(obj, x), fn(obj, x))
                    else:
                        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                            self.assertEqual(opt_fn(obj, x), fn(obj, x))
                self.assertEqual(cnt.frame_count, 2)

    def test_instance_dict_entry_for_a_name_getattr_did_not_find(self):
        # getattr(self, name, default) of a name nn.Module.__getattr__ does not
        # find returns the default; an entry added to __dict__ later is found.
        class Mod(torch.nn.Module):
            def forward(self, x):
                return x * getattr(self, "scale", 1.0)

        mod = Mod()
        cnt = torch._dynamo.testing.CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.ones(2)
        self.assertEqual(opt_mod(x), x)
        self.assertEqual(opt_mod(x), x)
        self.assertEqual(cnt.frame_count, 1)
        mod.__dict__["scale"] = 3.0
        self.assertEqual(opt_mod(x), x * 3)
        self.assertEqual(cnt.frame_count, 2)

    def test_instance_dict_shadow_removed_reuses_first_graph(self):
        mod = self._ShadowModule()
        cnt = torch._dynamo.testing.CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.randn(2, 4)
        expected = mod(x)
        self.assertEqual(opt_mod(x), expected)

        mod.__dict__["weight"] = torch.zeros(4, 4)
        self.assertEqual(opt_mod(x), mod(x))
        self.assertNotEqual(mod(x), expected)
        self.assertEqual(cnt.frame_count, 2)

        del mod.__dict__["weight"]
        self.assertEqual(opt_mod(x), expected)
        mod.__dict__["weight"] = torch.zeros(4, 4)
        self.assertEqual(opt_mod(x), mod(x))
        # both graphs stay cached: no compile for the second round
        self.assertEqual(cnt.frame_count, 2)

    def test_instance_dict_shadow_guard_no_recompile(self):
        """Passes on stock torch as well: the __dict__ guards of a module whose
        parameters, buffers and submodules are read through __getattr__ must not
        recompile it while nothing is shadowed, whatever else changes between
        calls (new inputs, in-place parameter updates, unrelated attributes)."""

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = torch.nn.LayerNorm(4)
                self.proj = torch.nn.Linear(4, 4)
                self.register_buffer("bias", torch.zeros(4))

            def forward(self, x):
                return self.proj(self.norm(x)) + self.bias

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
                self.head = torch.nn.Linear(4, 2)

            def forward(self, x):
                for block in self.blocks:
                    x = x + block(x)
                return self.head(x)

        mod = Model()
        cnt = torch._dynamo.testing.CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        for step in range(5):
            x = torch.randn(2, 4)
            self.assertEqual(opt_mod(x), mod(x))
            with torch.no_grad():
                for p in mod.parameters():
                    p.add_(0.1)
            mod.step = step  # an instance attribute no forward reads
            mod.blocks[0].note = "unrelated"
        self.assertEqual(cnt.frame_count, 1)

    def test_instance_dict_shadow_guards_one_dict_per_module(self):
        """The absent-key checks of a module sit on that module's one __dict__
        guard manager, one check per name read through __getattr__ (and `forward`),
        with no duplicates: a deep model gets exactly the (module, name) pairs it
        reads."""

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = torch.nn.RMSNorm(4)
                self.proj = torch.nn.Linear(4, 4)

            def forward(self, x):
                return x + self.proj(self.norm(x))

        class Model(torch.nn.Module):
            def __init__(self, n):
                super().__init__()
                self.layers = torch.nn.ModuleList(Block() for _ in range(n))

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        blocks = 8
        mod = Model(blocks)
        torch.compile(mod, backend="eager")(torch.randn(2, 4))
        checks = {}  # __dict__ manager source -> names checked absent
        for mgr in guard_managers(Model.forward):
            for leaf in mgr.get_leaf_guards():
                # one leaf per name, or one leaf holding all of them where the
                # guard manager merges them (DICT_NOT_CONTAINS_KEYS)
                for part in leaf.verbose_code_parts():
                    if not part.startswith("not ___dict_contains("):
                        continue
                    name = part.split("(", 1)[1].split(",", 1)[0].strip("'\"")
                    names = checks.setdefault(mgr.get_source(), [])
                    self.assertNotIn(name, names)  # no duplicate check
                    names.append(name)
        # one __dict__ with checks per module: the root (whose forward is the
        # frame itself), layers, and per block the block, norm and proj
        self.assertEqual(len(checks), 2 + 3 * blocks)
        by_kind = collections.Counter(tuple(sorted(names)) for names in checks.values())
        self.assertEqual(
            by_kind,
            {
                ("layers",): 1,  # the root
                ("__iter__",): 1,  # layers: ModuleList, iterated
                ("forward", "norm", "proj"): blocks,
                ("forward", "weight"): blocks,  # RMSNorm
                ("bias", "forward", "weight"): blocks,  # Linear
            },
        )

    def test_instance_dict_shadow_removed_inside_forward(self):
        """Passes on stock torch as well: when the compiled frame itself removes a
        stale __dict__ entry before reading the parameter, the read does not depend
        on the entry, and no guard may require the entry to be absent on entry (it
        would fail on the frame that installed it)."""

        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(4, 4))

            def forward(self, x):
                self.__dict__.pop("weight", None)
                return F.linear(x, self.weight)

        mod = Mod()
        cnt = torch._dynamo.testing.CompileCounter()
        opt_mod = torch.compile(mod, backend=cnt, fullgraph=True)
        x = torch.randn(2, 4)
        expected = F.linear(x, mod._parameters["weight"])
        for _ in range(3):
            mod.__dict__["weight"] = torch.zeros(4, 4)
            self.assertEqual(opt_mod(x), expected)
            self.assertNotIn("weight", mod.__dict__)
        self.assertEqual(cnt.frame_count, 1)

    def test_instance_dict_key_written_then_deleted_both_start_states(self):
        """A frame writes a key into __dict__ and then deletes it, without testing
        whether the key was there. Its replayed delete must not need the key: the
        recompile for a start state that has the key (the shadow guard) must not
        raise KeyError on a later call that lacks it, and the reverse."""

        class Obj:
            def __init__(self):
                self.inner_scale = 3.0

            def __getattr__(self, name):
                if name == "scale":
                    return self.inner_scale
                raise AttributeError(name)

        def fn(x, o):
            o.scale = 7.0
            a = o.scale
            del o.scale
            return x * a + o.scale

        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(1))

            def forward(self, x):
                self.__dict__["weight"] = self._parameters["weight"] * 7
                y = x * self.weight
                del self.__dict__["weight"]
                return y + x * self.weight

        def run(make, key, shadow, pattern, compiled):
            torch._dynamo.reset()
            obj = make()
            if isinstance(obj, torch.nn.Module):
                f = torch.compile(obj, backend="eager") if compiled else obj
                call = lambda: f(torch.ones(1))  # noqa: E731
            else:
                f = torch.compile(fn, backend="eager") if compiled else fn
                call = lambda: f(torch.ones(1), obj)  # noqa: E731
            outs = []
            for present in pattern:
                if present:
                    obj.__dict__[key] = shadow
                else:
                    obj.__dict__.pop(key, None)
                outs.append(call())
                outs.append(key in obj.__dict__)
            return outs

        cases = [(Obj, "scale", 10.0), (Mod, "weight", torch.full((1,), 5.0))]
        for make, key, shadow in cases:
            for pattern in ((0, 1, 0, 1), (1, 0, 1, 0)):
                with self.subTest(cls=make.__name__, pattern=pattern):
                    expected = run(make, key, shadow, pattern, False)
                    self.assertEqual(run(make, key, shadow, pattern, True), expected)

    def test_instance_dict_key_deleted_without_a_write_needs_it(self):
        """A frame deletes a key of __dict__ that it did not write. On a later call
        without the key, eager's `del` raises AttributeError: the compiled frame
        must not replay the delete as a no-op on code traced with the key
        present (a DICT_CONTAINS guard recompiles it)."""

        class Obj:
            pass

        def plain_del(x, o):
            del o.a
            return x + 1

        def run(fn, pattern, compiled):
            torch._dynamo.reset()
            f = torch.compile(fn, backend="eager") if compiled else fn
            outs = []
            for present in pattern:
                o = Obj()
                if present:
                    o.a = 3.0
                try:
                    outs.append(f(torch.ones(1), o))
                except AttributeError:
                    outs.append("AttributeError")
                outs.append(sorted(o.__dict__))
            return outs

        for pattern in ((1, 0, 0, 1), (1, 0, 1, 0), (0, 1, 0, 1)):
            with self.subTest(pattern=pattern):
                expected = run(plain_del, pattern, False)
                self.assertEqual(run(plain_del, pattern, True), expected)

    def test_instance_dict_key_deleted_in_try_both_start_states(self):
        """`try: del o.a` / `except AttributeError` takes one branch when the key is
        there and the other when it is not. Each cache entry has to guard its own
        start state: the entry traced without the key raises in its trace, and
        must not run for a later call with the key (eager deletes it and takes
        the other branch), whichever state compiles first."""

        class Obj:
            pass

        class WithGetattr:
            def __getattr__(self, name):
                if name == "a":
                    return 100.0
                raise AttributeError(name)

        def del_in_try(x, o):
            try:
                del o.a
            except AttributeError:
                return x - 1
            return x + 1

        def run(cls, backend, pattern, compiled):
            torch._dynamo.reset()
            f = torch.compile(del_in_try, backend=backend) if compiled else del_in_try
            outs = []
            for present in pattern:
                o = cls()
                if present:
                    o.a = 3.0
                outs.append(f(torch.ones(1), o))
                outs.append(sorted(o.__dict__))
            return outs

        patterns = (
            (1, 0, 0, 1),
            (1, 0, 1, 0),
            (1, 1, 0, 0),
            (0, 0, 1, 1),
            (0, 1, 0, 1),
        )
        for cls in (Obj, WithGetattr):
            for backend in ("eager", "aot_eager"):
                for pattern in patterns:
                    with self.subTest(
                        cls=cls.__name__, backend=backend, pattern=pattern
                    ):
                        expected = run(cls, backend, pattern, False)
                        self.assertEqual(run(cls, backend, pattern, True), expected)

    def test_instance_dict_key_deleted_from_a_replaced_dict(self):
        """A frame that replaces o.__dict__ and deletes a key of the new dict does
        not depend on the key being in the old one: no guard on it, and every
        later call, whatever the old dict held, ends with eager's dict."""

        class Obj:
            pass

        def replace_and_del(x, o):
            o.__dict__ = {"a": 1.0, "b": 2.0}
            del o.a
            return x + len(o.__dict__)

        def run(backend, compiled):
            torch._dynamo.reset()
            f = (
                torch.compile(replace_and_del, backend=backend)
                if compiled
                else replace_and_del
            )
            outs = []
            for present in (1, 0, 1, 0):
                o = Obj()
                if present:
                    o.a = 3.0
                outs.append(f(torch.ones(1), o))
                outs.append(dict(o.__dict__))
            return outs

        for backend in ("eager", "aot_eager"):
            with self.subTest(backend=backend):
                self.assertEqual(run(backend, True), run(backend, False))

    def test_cached_property_invalidated_in_compiled_step(self):
        """The usual invalidation of a functools.cached_property inside a step:
        `try: del c.scale` / `except AttributeError: pass`. A step run while no
        value is cached must not stop later steps from dropping one."""

        class Cfg:
            def __init__(self):
                self.base = 1.0

            @functools.cached_property
            def scale(self):
                return self.base * 3

        def step(x, c):
            try:
                del c.scale
            except AttributeError:
                pass
            return x + 1

        def run(f):
            c = Cfg()
            seen = []
            for k, read in enumerate((1, 0, 1, 0, 1)):
                c.base = float(k + 1)
                if read:
                    seen.append(c.scale)
                f(torch.ones(1), c)
            return seen

        expected = run(step)
        self.assertEqual(expected, [3.0, 9.0, 15.0])
        for backend in ("eager", "aot_eager"):
            with self.subTest(backend=backend):
                torch._dynamo.reset()
                self.assertEqual(run(torch.compile(step, backend=backend)), expected)

    def test_lazily_computed_attribute_through_hasattr_and_getattr_default(self):
        """A __getattr__ that stores what it computes in __dict__ (a lazily
        computed attribute), read through hasattr, getattr with a default and
        a plain read: a fresh object on each call, one object with the key
        removed and set again, and two names stored by one lookup."""

        class Lazy:
            def __init__(self, k):
                self.k = k

            def __getattr__(self, name):
                if name in ("a", "b"):
                    self.__dict__["a"] = self.k * 10.0
                    self.__dict__["b"] = self.k * 100.0
                    return self.__dict__[name]
                raise AttributeError(name)

        def f_hasattr(x, o):
            return x + (o.a if hasattr(o, "a") else -2.0)

        def f_getattr_default(x, o):
            return x + getattr(o, "a", -1.0)

        def f_read(x, o):
            return x + o.a

        def f_other_name_then_hasattr(x, o):
            return x + o.b + (o.a if hasattr(o, "a") else -2.0)

        def fresh_objects():
            return [Lazy(float(i)) for i in range(4)]

        def one_object_key_toggled():
            o = Lazy(1.0)

            def toggle(value):
                def set_state():
                    o.__dict__.pop("a", None)
                    o.__dict__.pop("b", None)
                    if value is not None:
                        o.__dict__["a"] = value
                    return o

                return set_state

            return [toggle(v) for v in (None, None, 3.0, 3.0, None)]

        def run(fn, states):
            out = []
            for state in states:
                o = state() if callable(state) else state
                out.append((fn(torch.ones(1), o).item(), dict(o.__dict__)))
            return out

        for fn in (f_hasattr, f_getattr_default, f_read, f_other_name_then_hasattr):
            for make_states in (fresh_objects, one_object_key_toggled):
                if make_states is one_object_key_toggled and fn in (
                    f_hasattr,
                    f_getattr_default,
                ):
                    # hasattr runs this __getattr__ (user code), so the frame
                    # guards key presence as without the key guards: the stored
                    # "b" is not guarded (not covered here).
                    continue
                for backend in ("eager", "aot_eager"):
                    with self.subTest(
                        fn=fn.__name__, states=make_states.__name__, backend=backend
                    ):
                        expected = run(fn, make_states())
                        torch._dynamo.reset()
                        opt_fn = torch.compile(fn, backend=backend, fullgraph=True)
                        self.assertEqual(run(opt_fn, make_states()), expected)

    def test_hasattr_and_getattr_default_follow_class_lookup_changes(self):
        """hasattr and getattr with a default of a name supplied by __getattr__,
        when the class's lookup changes between calls: __getattr__ replaced or
        deleted (on the class or on its base), __getattribute__ added, a class
        property added."""

        def raising_getattr(self, name):
            raise AttributeError(name)

        def getattribute_nine(self, name):
            if name == "a":
                return 9.0
            return object.__getattribute__(self, name)

        def getattribute_refusing(self, name):
            if name == "a":
                raise AttributeError(name)
            return object.__getattribute__(self, name)

        def supplying_getattr(self, name):
            if name == "a":
                return 5.0
            raise AttributeError(name)

        def replace_getattr(C):
            C.__getattr__ = raising_getattr

        def delete_getattr(C):
            del C.__getattr__

        def replace_base_getattr(C):
            C.__bases__[0].__getattr__ = raising_getattr

        def add_getattribute(C):
            C.__getattribute__ = getattribute_nine

        def add_refusing_getattribute(C):
            C.__getattribute__ = getattribute_refusing
            C.__getattr__ = raising_getattr

        def add_class_property(C):
            C.a = property(lambda self: 7.0)

        def make_class(on_base):
            class Base:
                pass

            class C(Base):
                pass

            (Base if on_base else C).__getattr__ = supplying_getattr
            return C

        def f_hasattr(x, o):
            return x + (10.0 if hasattr(o, "a") else -10.0)

        def f_getattr_default(x, o):
            return x + getattr(o, "a", -1.0)

        def run(fn, change, on_base):
            C = make_class(on_base)
            o = C()
            out = []
            for i in range(4):
                if i == 2:
                    change(C)
                out.append(fn(torch.ones(1), o).item())
            return out

        for change, on_base in (
            (replace_getattr, False),
            (delete_getattr, False),
            (replace_base_getattr, True),
            (add_getattribute, False),
            (add_refusing_getattribute, False),
            (add_class_property, False),
        ):
            for fn in (f_hasattr, f_getattr_default):
                if fn is f_getattr_default and change in (
                    add_getattribute,
                    add_class_property,
                ):
                    # The name is found before and after the change, so
                    # HASATTR passes and the graph of the traced __getattr__
                    # is reused, as without the key guards (not covered here).
                    continue
                for backend in ("eager", "aot_eager"):
                    with self.subTest(
                        change=change.__name__, fn=fn.__name__, backend=backend
                    ):
                        expected = run(fn, change, on_base)
                        torch._dynamo.reset()
                        opt_fn = torch.compile(fn, backend=backend, fullgraph=True)
                        self.assertEqual(run(opt_fn, change, on_base), expected)

    @staticmethod
    def _outcomes(fn, states):
        """fn's value (or the type of what it raised) and the object's
        __dict__ keys after each call, one call per state."""
        out = []
        for state in states:
            o = state()
            try:
                value = fn(torch.ones(1), o).item()
            except Exception as e:
                value = type(e).__name__
            out.append((value, sorted(o.__dict__)))
        return out

    def _check_against_eager(self, fn, make_states, backends=("eager", "aot_eager")):
        expected = self._outcomes(fn, make_states())
        for backend in backends:
            with self.subTest(backend=backend):
                torch._dynamo.reset()
                opt_fn = torch.compile(fn, backend=backend)
                self.assertEqual(self._outcomes(opt_fn, make_states()), expected)

    def test_lazily_computed_attribute_read_by_another_hasattr_guard(self):
        """A name that a memoizing __getattr__ stores in __dict__, read by
        code that another hasattr guard of the frame runs for real as the
        guards are built: a property over the lazily computed field (each way
        of storing it), a lazy config asked for a present and a missing name,
        a wrapper without __getattr__ whose property reads an inner object's
        lazy field, and an nn.Module whose __getattr__ caches what
        nn.Module.__getattr__ returns, under a property. Fresh objects, and
        one object whose stored field is removed before every other call."""

        def store(form, o, name, value):
            if form == "dict":
                o.__dict__[name] = value
            elif form == "setattr":
                setattr(o, name, value)
            else:
                object.__setattr__(o, name, value)

        def make_prop_over_lazy(form):
            class C:
                def __getattr__(self, name):
                    if name == "_x":
                        store(form, self, "_x", 3.0)
                        return 3.0
                    raise AttributeError(name)

                @property
                def px(self):
                    return self._x + 1.0

            return C, "px", "_x"

        def make_lazy_config(name):
            class C:
                def __getattr__(self, n):
                    if n == "_cfg":
                        self.__dict__["_cfg"] = {"k": 4.0}
                        return self.__dict__["_cfg"]
                    if n in self._cfg:
                        return self._cfg[n]
                    raise AttributeError(n)

            return C, name, "_cfg"

        def make_wrapper():
            class Inner:
                def __getattr__(self, name):
                    if name == "lazy":
                        self.__dict__["lazy"] = 2.0
                        return 2.0
                    raise AttributeError(name)

            class W:
                def __init__(self):
                    self.inner = Inner()

                @property
                def a(self):
                    return self.inner.lazy

            return W, "a", None

        def make_caching_module():
            class M(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("b", torch.full((1,), 2.0))

                def __getattr__(self, name):
                    value = super().__getattr__(name)
                    self.__dict__[name] = value
                    return value

                @property
                def p(self):
                    return self.b * 3

            return M, "p", "b"

        cases = {
            **{
                f"prop_over_lazy_{f}": (make_prop_over_lazy, f)
                for f in ("dict", "setattr", "object_setattr")
            },
            "lazy_config_present": (make_lazy_config, "k"),
            "lazy_config_missing": (make_lazy_config, "missing"),
            "wrapper_property": (make_wrapper,),
            "caching_module_property": (make_caching_module,),
        }
        for case, (make, *args) in cases.items():
            cls, name, stored = make(*args)

            def f_hasattr(x, o, name=name):
                return x + (1.0 if hasattr(o, name) else -1.0)

            def f_getattr_default(x, o, name=name):
                return x + getattr(o, name, -1.0)

            def fresh_objects(cls=cls):
                return [cls] * 4

            def one_object(cls=cls, stored=stored):
                o = cls()

                def same():
                    return o

                def removed():
                    o.__dict__.pop(stored, None)
                    return o

                return [same, removed, same, removed]

            for fn in (f_hasattr, f_getattr_default):
                for make_states in (fresh_objects, one_object):
                    if make_states is one_object and stored is None:
                        continue
                    with self.subTest(
                        case=case, fn=fn.__name__, states=make_states.__name__
                    ):
                        self._check_against_eager(fn, make_states)

    def test_class_lookup_guard_reads_the_mro_not_the_metaclass(self):
        """hasattr and getattr with a default of a name that the instance's
        __getattr__ supplies and the metaclass also supplies at class level
        (its __getattr__ or a property): a property added to the class later
        (here on its base) is found by the instance lookup, which never
        consults the metaclass."""

        def boom(self):
            raise RuntimeError("boom")

        def make(form):
            if form == "metaclass_getattr":

                class M(type):
                    def __getattr__(cls, name):
                        if name == "a":
                            return 9.0
                        raise AttributeError(name)

            else:

                class M(type):
                    @property
                    def a(cls):
                        return 9.0

            class Base:
                pass

            class C(Base, metaclass=M):
                def __getattr__(self, name):
                    if name == "a":
                        return 5.0
                    raise AttributeError(name)

            o = C()

            def same():
                return o

            def class_changed():
                Base.a = property(boom)
                return o

            return [same, same, class_changed, same]

        def f_hasattr(x, o):
            return x + (1.0 if hasattr(o, "a") else -1.0)

        def f_getattr_default(x, o):
            return x + getattr(o, "a", -1.0)

        for form in ("metaclass_getattr", "metaclass_property"):
            for fn in (f_hasattr, f_getattr_default):
                with self.subTest(form=form, fn=fn.__name__):
                    self._check_against_eager(
                        fn, functools.partial(make, form), backends=("eager",)
                    )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
