"""`torch-overlay add PATH…`: bring more upstream files into the overlay's base commit so that
they can be edited. The patch commits are replayed onto the new base unchanged."""

from __future__ import annotations

from pathlib import Path

from tools import overlay_repo
from tools.base import OVERLAY_DIR, OverlayError, git, installed_torch, read_pin, wheel_file


def add(repo: Path, paths: list[str]) -> list[str]:
    """Returns the paths that were added (ones already in the base are skipped)."""
    overlay = repo / OVERLAY_DIR
    overlay_repo.require(overlay)
    if overlay_repo.uncommitted(overlay):
        raise OverlayError(f"{OVERLAY_DIR}/ has uncommitted edits; commit them first")
    torch = installed_torch()
    base = overlay_repo.base_commit(overlay)
    in_base = set(git("ls-tree", "-r", "--name-only", base, cwd=overlay).split())
    new = {p: wheel_file(torch, p) for p in dict.fromkeys(paths) if p not in in_base}
    missing = [str(source) for source in new.values() if not source.exists()]
    if missing:
        raise OverlayError("not in the installed wheel: " + ", ".join(missing))
    if not new:
        return []
    # Build the new base tree in a scratch index, so the work tree is untouched until rebase.
    index = {"GIT_INDEX_FILE": str(overlay / ".git" / "torch-overlay-add-index")}
    try:
        git("read-tree", base, cwd=overlay, env=index)
        for path, source in new.items():
            blob = git("hash-object", "-w", str(source), cwd=overlay).strip()
            git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}",
                cwd=overlay, env=index)  # fmt: skip
        tree = git("write-tree", cwd=overlay, env=index).strip()
    finally:
        Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)
    pin = read_pin(repo)
    new_base = git(
        "commit-tree", tree, "-m", f"base: torch {pin.version} ({pin.git_version})", cwd=overlay
    ).strip()
    git("rebase", "-q", "--committer-date-is-author-date", "--onto", new_base, base, cwd=overlay)
    return list(new)
