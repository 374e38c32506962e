"""`torch-overlay activate` / `deactivate`: make the overlay the venv's default.

Activation adds one file to the venv, ``site-packages/torch_overlay.pth``, which loads the
import hook at interpreter start; the active Python files live in the project's
``.overlay-active/``. Nothing in site-packages is edited, and deactivation removes exactly
what activation added. Re-run ``activate`` after editing the overlay.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

from tools.active import BOOT_DIR, Plan, materialize_to
from tools.base import OverlayError, drifted_files, installed_torch, pip_install, read_pin

PTH_NAME = "torch_overlay.pth"
ACTIVE_DIR = ".overlay-active"


def pth_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def pth_line(tree: Path) -> str:
    finder = BOOT_DIR / "torch_overlay_finder.py"
    # A .pth line that starts with "import" is executed by site.py at every interpreter start.
    return (
        "import importlib.util as u, sys; "
        f"s = u.spec_from_file_location('torch_overlay_finder', {str(finder)!r}); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); "
        "sys.modules.setdefault('torch_overlay_finder', m); "
        f"m.install({str(tree)!r})\n"
    )


def activate(repo: Path) -> Plan:
    if sys.prefix == sys.base_prefix:
        raise OverlayError("activate works on a virtual environment; this Python is not one")
    # Under drift every `import torch` of the venv would fail the hook's check: refuse now.
    pin = read_pin(repo)
    drifted = [path for path, _, _ in drifted_files(pin, installed_torch())]
    if drifted:
        raise OverlayError(
            f"base files of the installed torch differ from patches/base.json ({', '.join(drifted)}); "
            f"reinstall it first: {pip_install(pin)}"
        )
    plan = materialize_to(repo, repo / ACTIVE_DIR)
    pth_path().write_text(pth_line(repo / ACTIVE_DIR))
    return plan


def deactivate(repo: Path) -> bool:
    """Returns whether anything was active."""
    was_active = pth_path().exists()
    pth_path().unlink(missing_ok=True)
    shutil.rmtree(repo / ACTIVE_DIR, ignore_errors=True)
    return was_active
