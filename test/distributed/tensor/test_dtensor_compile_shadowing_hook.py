# Owner(s): ["oncall: distributed"]
"""torchtitan#3122: a TP MoE block whose router gate is compiled, with a pre-hook that
shadows the gate's DTensor weight by its local tensor, trains two steps like eager.

The hook is written the corrected way (read ``module._parameters``, pop the shadow in a
post-hook); the reported crash came from the hook reading its own stale shadow. What is
left is PyTorch's part: the compiled gate must use the shadow like eager (Dynamo guards on
the instance ``__dict__``), and a compiled ``to_local()`` must not hand back the
parameter's own local tensor (inductor)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
)
from torch.distributed.tensor.parallel import (
    PrepareModuleInputOutput,
    parallelize_module,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

DIM, EXPERTS, BATCH, SEQ = 8, 4, 2, 4


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(EXPERTS, DIM) * 0.1)

    def forward(self, x):
        return F.linear(x, self.weight)


class MoEBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()
        self.experts = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        scores = self.gate(x).softmax(dim=-1)
        return self.experts(x) * scores.mean(dim=-1, keepdim=True)


def shadow_weight_with_local(module, args):
    module.__dict__["weight"] = module._parameters["weight"].to_local()


def pop_shadow(module, args, output):
    module.__dict__.pop("weight", None)


def moe_input_to_local(module, args):
    (x,) = args
    if isinstance(x, DTensor):
        return (x.to_local(grad_placements=(Partial(),)).clone(),)


class DTensorCompileShadowingHookTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def build(self, mesh, backend):
        torch.manual_seed(0)
        moe = MoEBlock()
        distribute_module(moe.gate, mesh)
        moe.gate.register_forward_pre_hook(shadow_weight_with_local)
        moe.gate.register_forward_hook(pop_shadow)
        parallelize_module(
            moe,
            mesh,
            PrepareModuleInputOutput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_input=False,
                output_layouts=(Partial(),),
                desired_output_layouts=(Shard(1),),
            ),
        )
        moe.register_forward_pre_hook(moe_input_to_local)
        if backend is not None:
            moe.gate = torch.compile(moe.gate, backend=backend, fullgraph=True)
        return moe

    def train(self, backend):
        mesh = self.build_device_mesh()
        moe = self.build(mesh, backend)
        results = []
        for step in range(2):
            torch.manual_seed(100 + step)
            x = torch.randn(BATCH, SEQ, DIM, requires_grad=True)
            local = x.chunk(self.world_size, dim=1)[self.rank].contiguous()
            # A local Shard(1) output.
            out = moe(DTensor.from_local(local, mesh, (Shard(1),)))
            out.sum().backward()
            results.append((out.detach(), x.grad))
            # A parameter update between the steps, like a trainer.
            with torch.no_grad():
                for p in moe.parameters():
                    p.sub_(0.1 * p.grad)
                    p.grad = None
        weight = (
            moe.gate._parameters["weight"]
            if backend is None
            else moe.gate._orig_mod.weight
        )
        return results, weight

    @with_comms
    def test_two_steps_match_eager(self):
        expected, expected_weight = self.train(None)
        for backend in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            results, weight = self.train(backend)
            for (out, x_grad), (ref_out, ref_x_grad) in zip(
                results, expected, strict=True
            ):
                self.assertEqual(out, ref_out, msg=backend)
                self.assertEqual(x_grad, ref_x_grad, msg=backend)
            self.assertEqual(weight.to_local(), expected_weight.to_local(), msg=backend)
            # the parameter's local tensor is still a leaf that does not require grad
            self.assertIsNone(weight._local_tensor.grad_fn, msg=backend)
            self.assertFalse(weight._local_tensor.requires_grad, msg=backend)


if __name__ == "__main__":
    run_tests()
