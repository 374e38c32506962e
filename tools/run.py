"""`torch-overlay run -- CMD…`: run a command with the overlay's Python files shadowing the
installed torch, in that process and every Python process it starts (spawned children,
torchrun workers, subprocesses), through PYTHONPATH and an import hook."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tools import overlay_repo, topics
from tools.active import environment, materialize
from tools.base import OverlayError, installed_torch, read_pin


def run(repo: Path, argv: list[str], topic: str | None = None) -> int:
    if not argv:
        raise SystemExit("torch-overlay run: give a command after --")
    with tempfile.TemporaryDirectory(prefix="torch-overlay-run-") as scratch:
        tree = Path(scratch) / "tree"
        overlay = topic_overlay(repo, topic, Path(scratch) / "overlay") if topic else None
        plan = materialize(repo, tree, overlay=overlay)
        print(f"torch-overlay: {plan.summary()}", file=sys.stderr)
        return subprocess.call(argv, env=environment(tree))


def topic_overlay(repo: Path, topic: str, dest: Path) -> Path:
    """An overlay of one topic and those it depends on, from ``patches/`` (so a topic is
    tested as it lands upstream: without the other topics)."""
    found = topics.read_topics(repo)
    if topic not in found.topics:
        raise OverlayError(f"no topic {topic!r}; topics: {', '.join(found.topics)}")
    pin, torch = read_pin(repo), installed_torch()
    names = [name for t in found.chain(topic) for name in t.patches]
    overlay_repo.build(repo, dest, pin, torch, names=names)
    return dest
