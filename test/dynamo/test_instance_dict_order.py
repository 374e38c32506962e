# Owner(s): ["module: dynamo"]
# Upstream home: test/dynamo/test_misc.py (next to the other instance __dict__
# tests); kept in its own file here because the project never edits upstream files.

import functools

import torch
import torch._dynamo.test_case
import torch._dynamo.testing


class _Obj:
    pass


def _make_obj():
    obj = _Obj()
    obj.a = 1.0
    obj.b = 2.0
    obj.c = 3.0
    return obj


class InstanceDictOrderTests(torch._dynamo.test_case.TestCase):
    # A compiled frame answers an enumeration of obj.__dict__ from the keys the
    # object has as the frame starts merged with the frame's pending writes; the
    # order, and so popitem(), must be the order eager sees.

    def _check_same_as_eager(self, fn):
        eager_obj, compiled_obj = _make_obj(), _make_obj()
        x = torch.ones(2)
        expected = fn(x, eager_obj)
        actual = torch.compile(fn, backend="eager", fullgraph=True)(x, compiled_obj)
        self.assertEqual(actual, expected)
        self.assertEqual(
            list(compiled_obj.__dict__.items()), list(eager_obj.__dict__.items())
        )

    def test_popitem_removes_the_last_key(self):
        def fn(x, obj):
            k, v = obj.__dict__.popitem()
            return x * v, k

        self._check_same_as_eager(fn)

    def test_popitem_after_add_removes_the_added_key(self):
        def fn(x, obj):
            obj.d = 4.0
            obj.b = 5.0  # an overwrite does not move the key
            k, v = obj.__dict__.popitem()
            return x * v, k

        self._check_same_as_eager(fn)

    def test_popitem_twice_after_delete(self):
        def fn(x, obj):
            del obj.c
            k1, v1 = obj.__dict__.popitem()
            k2, v2 = obj.__dict__.popitem()
            return x * v1 + v2, k1, k2

        self._check_same_as_eager(fn)

    def test_popitem_of_empty_dict_raises(self):
        def fn(x, obj):
            obj.__dict__.clear()
            try:
                obj.__dict__.popitem()
            except KeyError:
                return x + 1
            return x

        self._check_same_as_eager(fn)

    def test_first_key_after_overwrite(self):
        def fn(x, obj):
            obj.b = 100.0
            return x * obj.__dict__[list(obj.__dict__)[0]]  # noqa: RUF015

        self._check_same_as_eager(fn)

    def test_key_order_after_add_and_delete(self):
        def fn(x, obj):
            obj.d = 4.0
            del obj.a
            obj.c = 30.0
            obj.e = 5.0
            return x, list(obj.__dict__), list(obj.__dict__.values())

        self._check_same_as_eager(fn)

    # A frame-start key that the frame deletes and then writes again moves to
    # the end, as in eager. (The object's __dict__ after the frame still keeps
    # such a key in its old place: the replay stores it without deleting it
    # first, on stock too, so these compare the values the frame returns.)

    def test_order_after_clear_and_update(self):
        def fn(x, obj):
            d = obj.__dict__
            d.clear()
            d.update({"c": 3.0, "b": 2.0, "a": 1.0})
            return torch.cat([x * v for v in d.values()]), list(d)

        self._check_same_as_eager(fn)

    def test_order_after_pop_and_write_again(self):
        def fn(x, obj):
            d = obj.__dict__
            for k in "cba":
                d[k] = d.pop(k)
            return torch.cat([x * v for v in d.values()]), list(d)

        self._check_same_as_eager(fn)

    def test_order_after_delete_and_write_again_one_key(self):
        def fn(x, obj):
            del obj.a
            obj.a = 9.0
            return torch.cat([x * v for v in obj.__dict__.values()])

        self._check_same_as_eager(fn)

    def test_order_after_delete_all_and_write_some_again(self):
        def fn(x, obj):
            del obj.a, obj.b, obj.c
            obj.c = 1.0
            obj.a = 2.0
            return x * obj.__dict__.popitem()[1], list(obj.__dict__)

        self._check_same_as_eager(fn)

    def test_dict_after_delete_and_write_again_forms(self):
        # The replayed stores leave a key the frame deleted and wrote again at
        # the end of the real __dict__, whichever way it was deleted and written.
        def del_setattr(x, obj):
            del obj.__dict__["a"]
            obj.a = 9.0
            return x * obj.a

        def delattr_vars(x, obj):
            delattr(obj, "a")
            vars(obj)["a"] = 9.0
            return x * obj.a

        def del_update(x, obj):
            del obj.a
            obj.__dict__.update({"a": 9.0})
            return x * obj.a

        def del_setdefault(x, obj):
            del obj.a
            return x * obj.__dict__.setdefault("a", 9.0)

        def loop(x, obj):
            for i in range(3):
                del obj.a
                obj.a = float(i)
            return x * obj.a

        def add_new_then_readd(x, obj):
            obj.z = 5.0
            del obj.a
            obj.a = 9.0
            return x * obj.a

        def readd_two_overwrite_one(x, obj):
            del obj.b
            del obj.a
            obj.b = 7.0
            obj.c = 8.0
            obj.a = 9.0
            return x * obj.a

        for fn in (
            del_setattr,
            delattr_vars,
            del_update,
            del_setdefault,
            loop,
            add_new_then_readd,
            readd_two_overwrite_one,
        ):
            with self.subTest(fn.__name__):
                torch._dynamo.reset()
                self._check_same_as_eager(fn)

    def test_order_after_delete_and_write_again_then_graph_break(self):
        # The frame resumed after the graph break reads the real __dict__, which
        # the replay of the first part must leave in eager's order.
        def fn(x, obj):
            del obj.a
            obj.a = 9.0
            torch._dynamo.graph_break()
            return torch.cat([x * v for v in obj.__dict__.values()]), list(obj.__dict__)

        eager_obj, compiled_obj = _make_obj(), _make_obj()
        x = torch.ones(2)
        expected = fn(x, eager_obj)
        actual = torch.compile(fn, backend="eager")(x, compiled_obj)
        self.assertEqual(actual, expected)
        self.assertEqual(list(compiled_obj.__dict__), list(eager_obj.__dict__))

    def test_delete_if_present_then_write_again(self):
        # `try: del obj.a` / `except AttributeError` then `obj.a = ...`, compiled
        # while obj has `a` and run while it does not: the replayed delete must
        # not fail on the missing key, and obj ends with `a` at the end.
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(2, 2)

            def forward(self, x):
                try:
                    del self.cache
                except AttributeError:
                    pass
                y = self.lin(x)
                self.cache = y.detach()
                return y

        def fn(x, obj):
            try:
                del obj.a
            except AttributeError:
                pass
            obj.a = 5.0
            return x * 2

        def run(kind, compiled):
            torch._dynamo.reset()
            torch.manual_seed(0)
            if kind == "module":
                obj = f = Model()
                name = "cache"
            else:
                obj, name = _Obj(), "a"
                f = functools.partial(fn, obj=obj)
            setattr(obj, name, 0.0)
            f = torch.compile(f, backend="eager") if compiled else f
            results = []
            for step in range(4):
                if step % 2:
                    del obj.__dict__[name]
                results.append(f(torch.ones(1, 2)))
                results.append([k for k in obj.__dict__ if not k.startswith("_")])
            return results

        for kind in ("object", "module"):
            self.assertEqual(run(kind, True), run(kind, False), msg=kind)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
