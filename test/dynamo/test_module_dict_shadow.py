# Owner(s): ["module: dynamo"]
"""An instance __dict__ entry that shadows a registered parameter, buffer or submodule
is what eager uses; an already-compiled module must recompile and use it too (and go
back when the entry is removed). Dynamo already guards `forward` this way."""

import torch
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(F.linear(x, self.weight) * self.scale)


class ModuleDictShadowTest(TestCase):
    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def check_follows_eager(self, module, name, shadow):
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(module, backend=counter, fullgraph=True)
        x = torch.randn(2, 4)
        self.assertEqual(compiled(x), module(x))
        module.__dict__[name] = shadow
        self.assertEqual(compiled(x), module(x))  # eager uses the shadow
        del module.__dict__[name]
        self.assertEqual(compiled(x), module(x))
        self.assertEqual(counter.frame_count, 2)  # one recompile, for the shadow

    def test_parameter_shadowed(self):
        torch.manual_seed(0)
        self.check_follows_eager(Gate(), "weight", torch.zeros(4, 4))

    def test_buffer_shadowed(self):
        torch.manual_seed(0)
        self.check_follows_eager(Gate(), "scale", torch.full((4,), -1.0))

    def test_submodule_shadowed(self):
        torch.manual_seed(0)
        self.check_follows_eager(Gate(), "inner", nn.Identity())

    def test_builtin_module_parameter_shadowed(self):
        torch.manual_seed(0)
        self.check_follows_eager(nn.Linear(4, 4), "weight", torch.zeros(4, 4))


if __name__ == "__main__":
    run_tests()
