"""Pipeline schedules: final gradients compared with a fused single-process backward.

Each scenario runs in a spawned child with its own one-rank gloo process group (the
DTensor reproducers hold the fake one); the child inherits the overlay from verify.
"""

from __future__ import annotations

import tempfile

from tools.reproducers import Outcome, in_spawned_child, reproducer


def _tied_weight_zbv(store_path: str, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    torch.manual_seed(0)
    tied = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    class TiedIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = tied

        def forward(self, x):
            return torch.tanh(x @ self.weight)

    class TiedOut(TiedIn):
        def forward(self, x):
            return x @ self.weight.t()

    def loss_fn(output, target):
        return ((output - target) ** 2).mean()

    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    device = torch.device("cpu")
    stages = [PipelineStage(TiedIn(), 0, 2, device), PipelineStage(TiedOut(), 1, 2, device)]
    ScheduleZBVZeroBubble(stages, n_microbatches=4, loss_fn=loss_fn).step(x, target=y)
    pipelined, tied.grad = tied.grad.clone(), None
    for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True):
        (loss_fn(TiedOut()(TiedIn()(xm)), ym) / 4).backward()
    queue.put(((pipelined - tied.grad).norm() / tied.grad.norm()).item())
    dist.destroy_process_group()


@reproducer(
    bug="A weight tied across the two stages of a rank (ZBV) is divided twice by scale_grads",
    upstream="-",
    patch="[pipelining] Scale a weight shared by stages on one rank once per step",
)
def tied_weight_scaled_twice() -> Outcome:
    with tempfile.TemporaryDirectory() as scratch:  # FileStore deletes its file itself
        error = in_spawned_child(_tied_weight_zbv, f"{scratch}/store", timeout=120)
    return Outcome(error < 1e-12, f"tied grad relative error {error:.2g} vs a fused backward")
