"""The dX/dW split backward (stage_backward_input, then stage_backward_weight) compared
with a fused backward of the same graph, in float64."""

from __future__ import annotations

from tools.reproducers import Outcome, reproducer

GROUPING = (
    "[pipelining] dX/dW split: one param group per parameter, graph kept where groups overlap"
)
ROOTS = (
    "[pipelining] dX/dW split: weight gradients that reach an output without passing an "
    "input-dependent node"
)
ACCUMULATE = "[pipelining] dX/dW split: accumulate weight gradients through AccumulateGrad"
NO_INPLACE_DETACH = "[pipelining] dX/dW split: do not detach user tensors in place"
UPSTREAM = "-"


def _split_vs_fused(stage, n_params: int, n_microbatches: int = 1) -> Outcome:
    """Run ``stage(x, params) -> outputs`` through the split and a fused backward."""
    import torch
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64)) for _ in range(n_params)]
    refs = [torch.nn.Parameter(p.detach().clone()) for p in params]
    try:
        for _ in range(n_microbatches):
            x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
            outputs = stage(x, params)
            grads = [torch.randn_like(o) for o in outputs]
            torch.autograd.backward(stage(x.detach(), refs), grads)
            _, groups = stage_backward_input(outputs, grads, [x], iter(params))
            stage_backward_weight(iter(params), groups)
    except RuntimeError as error:
        cause = error.__cause__ or error
        return Outcome(False, f"{type(cause).__name__}: {str(cause).strip().splitlines()[0][:70]}")
    errors = [
        "None" if p.grad is None else f"{((p.grad - r.grad).norm() / r.grad.norm()).item():.2g}"
        for p, r in zip(params, refs, strict=True)
    ]
    ok = all(e != "None" and float(e) < 1e-12 for e in errors)
    return Outcome(ok, f"relative error per param vs fused: {', '.join(errors)}")


@reproducer(bug="Split backward: weight reused after another layer (x@w1@w2@w1) crashes W",
            upstream=UPSTREAM, patch=GROUPING)  # fmt: skip
def split_weight_reused_after_another_layer() -> Outcome:
    return _split_vs_fused(lambda x, p: [x @ p[0] @ p[1] @ p[0]], 2)


@reproducer(bug="Split backward: a param joining two groups, tanh((x+(w0+s))+(w1+s))",
            upstream=UPSTREAM, patch=GROUPING)  # fmt: skip
def split_param_in_two_groups() -> Outcome:
    return _split_vs_fused(lambda x, p: [((x + (p[0] + p[2])) + (p[1] + p[2])).tanh()], 3)


@reproducer(bug="Split backward: a parameter-only stage output (pos * 1.0) gets no grad",
            upstream=UPSTREAM, patch=ROOTS)  # fmt: skip
def split_parameter_only_output() -> Outcome:
    return _split_vs_fused(lambda x, p: [(x @ p[0]).tanh(), p[1] * 1.0], 2)


@reproducer(bug="Split backward: a view stage output (h.view(-1)) crashes I (detach_)",
            upstream="pytorch/pytorch#142229", patch=NO_INPLACE_DETACH)  # fmt: skip
def split_view_output() -> Outcome:
    return _split_vs_fused(lambda x, p: [(x @ p[0]).tanh().view(-1)], 1)


@reproducer(bug="Split backward: x @ (wa + wb) over 3 micro-batches (.grad aliasing)",
            upstream=UPSTREAM, patch=ACCUMULATE)  # fmt: skip
def split_grad_aliasing() -> Outcome:
    return _split_vs_fused(lambda x, p: [x @ (p[0] + p[1])], 2, n_microbatches=3)


@reproducer(bug="Split backward: post-accumulate-grad hooks do not fire in W",
            upstream=UPSTREAM, patch=ACCUMULATE)  # fmt: skip
def split_post_accumulate_hook() -> Outcome:
    import torch
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    w = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    calls = []
    w.register_post_accumulate_grad_hook(calls.append)
    x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    _, groups = stage_backward_input(
        [x @ w], [torch.ones(4, 4, dtype=torch.float64)], [x], iter([w])
    )
    stage_backward_weight(iter([w]), groups)
    return Outcome(len(calls) == 1, f"hook fired {len(calls)} time(s); a fused backward: 1")
