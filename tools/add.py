"""`torch-overlay add PATH…`: bring more upstream files into the overlay's base commit so that
they can be edited. The patch commits are replayed onto the new base unchanged.

A PATH is the file's source path (``torch/distributed/x.py``), optionally ``./``-relative or
under ``torch_overlay/``, or the file's absolute path in site-packages."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from tools import overlay_repo, sync_state
from tools.base import (
    HEADER_ROOTS,
    OVERLAY_DIR,
    InstalledTorch,
    OverlayError,
    git,
    installed_torch,
    read_pin,
    wheel_file,
)


def source_path(repo: Path, torch: InstalledTorch, given: str) -> str:
    """The source path (``torch/...``) that ``given`` names, or a refusal saying what is wrong."""
    path = Path(given)
    if path.is_absolute():
        resolved = Path(os.path.realpath(path))
        for root, relative in (
            *((torch.site / wheel_root, source_root) for source_root, wheel_root in HEADER_ROOTS.items()),
            (torch.site, ""),
            (repo / OVERLAY_DIR, ""),
        ):  # fmt: skip
            if resolved.is_relative_to(os.path.realpath(root)):
                return relative + resolved.relative_to(os.path.realpath(root)).as_posix()
        raise OverlayError(
            f"{given}: not in the installed torch ({torch.site / 'torch'}) nor in {OVERLAY_DIR}/"
        )
    rel = posixpath.normpath(path.as_posix())
    rel = rel.removeprefix(f"{OVERLAY_DIR}/")
    if not rel.startswith("torch/") and "/" not in rel and rel.startswith("torch."):
        stem = rel.removesuffix(".py").replace(".", "/")
        files = [f"{stem}.py", f"{stem}/__init__.py"]
        found = next((f for f in files if (torch.site / f).is_file()), "")
        raise OverlayError(
            f"{given} is a module name; give its file: {found}"
            if found
            else f"{given} is a module name, and the wheel has neither {files[0]} nor {files[1]}"
        )
    if rel.endswith("/") or (torch.site / rel).is_dir():
        raise OverlayError(
            f"{given} is a directory; give the files to edit, e.g. {rel.rstrip('/')}/__init__.py"
        )
    return rel


def add(repo: Path, paths: list[str]) -> list[str]:
    """Returns the paths that were added (ones already in the base are skipped)."""
    overlay = repo / OVERLAY_DIR
    overlay_repo.require(overlay)
    with sync_state.locked(repo):
        return add_locked(repo, overlay, paths)


def add_locked(repo: Path, overlay: Path, paths: list[str]) -> list[str]:
    if overlay_repo.uncommitted(overlay):
        raise OverlayError(f"{OVERLAY_DIR}/ has uncommitted edits; commit them first")
    torch = installed_torch()
    paths = [source_path(repo, torch, given) for given in paths]
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
