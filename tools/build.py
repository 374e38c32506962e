"""`torch-overlay build --pytorch-src DIR`: the series as a branch of a PyTorch source
checkout (one commit per patch), built with CUDA by upstream's current command.

Since July 2026 PyTorch builds with scikit-build-core (setup.py is gone):
``python -m pip install --no-build-isolation -v -e .``, with the build requirements
installed first. Settings reach CMake through the environment (``USE_*``, ``BUILD_*``,
``CMAKE_*``, ``TORCH_CUDA_ARCH_LIST``; ``MAX_JOBS`` becomes the build parallelism).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from tools import source_branch
from tools.base import OverlayError

NVCC_JOB_GIB = 4  # an nvcc job of a CUDA build can take this much memory


def detect_cuda_arch() -> str | None:
    """Compute capabilities of the local GPUs (e.g. "9.0"), or None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
        capture_output=True, text=True,
    )  # fmt: skip
    caps = sorted({line.strip() for line in proc.stdout.splitlines() if line.strip()})
    return ";".join(caps) if proc.returncode == 0 and caps else None


def default_jobs() -> int:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(os.cpu_count() or 1, int(memory_gib // NVCC_JOB_GIB)))


def build_environment(arch: str | None, jobs: int | None) -> dict[str, str]:
    """The variables this build sets (on top of the caller's environment)."""
    env = {
        "USE_CUDA": "1",
        "USE_DISTRIBUTED": "1",
        "MAX_JOBS": str(jobs or default_jobs()),
    }
    arch = arch or os.environ.get("TORCH_CUDA_ARCH_LIST") or detect_cuda_arch()
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    if shutil.which("ccache"):
        for language in ("C", "CXX", "CUDA"):
            env[f"CMAKE_{language}_COMPILER_LAUNCHER"] = "ccache"
    return env


def check_python(repo: Path, python: str | None, dry_run: bool) -> str:
    """The Python to build into: a separate environment. Installing the built torch into this
    project's own venv would replace the pinned wheel, and every other verb would refuse."""
    if python is None:
        if dry_run:
            return "PYTHON"
        raise OverlayError(
            "pass --python: the Python of a separate build environment (e.g. "
            "python3 -m venv ~/pytorch-build && ~/pytorch-build/bin/pip install -r "
            "<checkout>/requirements-build.txt, then --python ~/pytorch-build/bin/python)"
        )
    resolved = shutil.which(python)
    if resolved is None:
        raise OverlayError(f"--python {python}: no such Python; nothing was changed")
    venv = (repo / ".venv").resolve()
    prefix = subprocess.run(
        [resolved, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True
    ).stdout.strip()
    if prefix and Path(prefix).resolve() == venv:
        raise OverlayError(
            f"{python} is this project's venv ({venv}); building into it would replace the "
            "pinned torch wheel. Pass --python of a separate build environment"
        )
    return python


def build(
    repo: Path,
    src: Path,
    *,
    branch: str | None = None,
    onto_head: bool = False,
    arch: str | None = None,
    jobs: int | None = None,
    python: str | None = None,
    dry_run: bool = False,
) -> int:
    branch_plan = source_branch.plan(repo, src, branch, onto_head)
    env = build_environment(arch, jobs)
    python = check_python(repo, python, dry_run)
    command = [python, "-m", "pip", "install", "--no-build-isolation", "-v", "-e", "."]
    lines = branch_plan.describe() + ["environment:"]
    lines += [f"  {key}={value}" for key, value in env.items()]
    if "TORCH_CUDA_ARCH_LIST" not in env:
        lines.append("  TORCH_CUDA_ARCH_LIST is unset: no NVIDIA GPU found; pass --arch (e.g. 9.0)")
    lines.append(f"command:   {shlex.join(command)}  (in {branch_plan.checkout})")
    print(
        ("build plan (dry run, nothing changed):\n" if dry_run else "build plan:\n")
        + "\n".join(lines)
    )
    if dry_run:
        return 0
    if "TORCH_CUDA_ARCH_LIST" not in env:
        raise OverlayError(
            "no CUDA architecture: no NVIDIA GPU was found; pass --arch, e.g. --arch 9.0"
        )
    source_branch.require_identity(branch_plan.checkout)
    source_branch.refuse_untracked(repo, branch_plan.checkout, [branch_plan], [])
    head = source_branch.create(repo, branch_plan)
    print(
        f"created {branch_plan.branch} at {head[:12]}; building (output streams below)", flush=True
    )
    return subprocess.call(command, cwd=branch_plan.checkout, env={**os.environ, **env})
