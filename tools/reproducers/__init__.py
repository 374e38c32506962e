"""The registry of reproducers that `torch-overlay verify` runs on stock torch and with the
overlay: one per bug the series fixes.

Add one in a module of this package (modules must not import torch at import time, so that
listing the registry stays cheap)::

    @reproducer(
        bug="P(sum).fill_(1.5) keeps Partial",
        upstream="pytorch/pytorch#NNN",
        patch="[DTensor] subject of the patch that fixes it",
    )
    def fill_keeps_partial() -> Outcome:
        ...
        return Outcome(ok=value == truth, detail=f"value {value}, truth {truth}")
"""

from __future__ import annotations

import importlib
import multiprocessing
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    ok: bool  # the result matches the plain-tensor ground truth
    detail: str  # values vs truth, placements, collective counts


@dataclass(frozen=True)
class Reproducer:
    name: str
    bug: str
    upstream: str
    patch: str  # subject of the patch that fixes it
    run: Callable[[], Outcome]


REGISTRY: dict[str, Reproducer] = {}


def reproducer(*, bug: str, upstream: str, patch: str):
    def register(fn: Callable[[], Outcome]) -> Callable[[], Outcome]:
        REGISTRY[fn.__name__] = Reproducer(fn.__name__, bug, upstream, patch, fn)
        return fn

    return register


def load_all() -> dict[str, Reproducer]:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return REGISTRY


def in_spawned_child(target: Callable[..., None], *args, timeout: float = 300):
    """Run ``target(*args, queue)`` in a spawned child (its own process group, the
    overlay inherited from the environment) and return what it put on the queue."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=target, args=(*args, queue))
    child.start()
    result = queue.get(timeout=timeout)
    child.join()
    return result


def in_spawned_ranks(target: Callable[..., None], world_size: int, *args, timeout: float = 300):
    """Run ``target(rank, *args, queue)`` in ``world_size`` spawned children, one per rank
    (each puts ``(rank, result)``), and return their results in rank order."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    children = [
        context.Process(target=target, args=(rank, *args, queue)) for rank in range(world_size)
    ]
    for child in children:
        child.start()
    results = dict(queue.get(timeout=timeout) for _ in children)
    for child in children:
        child.join()
    return [results[rank] for rank in range(world_size)]
