"""`torch-overlay run -- CMD…`: run a command with the overlay's Python files shadowing the
installed torch, in that process and every Python process it starts (spawned children,
torchrun workers, subprocesses), through PYTHONPATH and an import hook."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tools.active import environment, materialize


def run(repo: Path, argv: list[str]) -> int:
    if not argv:
        raise SystemExit("torch-overlay run: give a command after --")
    with tempfile.TemporaryDirectory(prefix="torch-overlay-run-") as scratch:
        tree = Path(scratch) / "tree"
        plan = materialize(repo, tree)
        print(f"torch-overlay: {plan.summary()}", file=sys.stderr)
        return subprocess.call(argv, env=environment(tree))
