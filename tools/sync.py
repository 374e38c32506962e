"""`torch-overlay sync`: materialize torch_overlay/ from the installed wheel plus the series.

All or nothing: the new overlay is built beside the old one and swapped in only when every
patch applied; any refusal leaves the existing overlay exactly as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tools import overlay_repo
from tools.base import OVERLAY_DIR, OverlayError, check_installed, installed_torch, read_pin
from tools.export import pending


def sync(repo: Path, force: bool = False) -> int:
    """Returns the number of patches applied."""
    pin = read_pin(repo)
    torch = installed_torch()
    check_installed(pin, torch)
    overlay = repo / OVERLAY_DIR
    if overlay_repo.exists(overlay) and not force:
        problems = pending(repo)
        if problems:
            raise OverlayError(
                "the overlay holds work that is not in patches/ (export it, or sync --force "
                "to discard it):\n  " + "\n  ".join(problems)
            )
    scratch = Path(tempfile.mkdtemp(prefix=".torch_overlay.", dir=repo))
    try:
        fresh = scratch / "overlay"
        overlay_repo.build(repo, fresh, pin, torch)
        if overlay.exists():
            overlay.rename(scratch / "old")
        fresh.rename(overlay)
    finally:
        shutil.rmtree(scratch)
    return len(overlay_repo.commits(overlay))
