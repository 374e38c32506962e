# Owner(s): ["module: dynamo"]

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
import torch.nn.functional as F


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


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
