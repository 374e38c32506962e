"""`torch-overlay sync`: bring torch_overlay/ up to date with the installed wheel plus the series.

Pull-safe (see tools/sync_state.py): after a pull it rebuilds the overlay; it never drops the
overlay's own work: with only local work there is nothing to sync, and with changes on both
sides it refuses, naming them. ``--force`` rebuilds anyway and keeps the work: uncommitted
edits in ``git stash``, unexported commits on a ``saved/…`` branch.

Nothing in torch_overlay/ is lost: the new series is built aside, then fetched into the
existing overlay repository and checked out as ``main``, so stashes, other branches, tags and
the reflog stay. That last step runs with SIGINT/SIGTERM/SIGHUP deferred, and a lock keeps two
syncs (or a sync and an export) from interleaving. Any refusal changes nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tools import overlay_repo, sync_state
from tools.base import OVERLAY_DIR, OverlayError, check_installed, git, installed_torch, read_pin
from tools.export import pending

SCRATCH_PREFIX = ".torch_overlay."  # git-ignored; a leftover is from a killed sync


def sync(repo: Path, force: bool = False, say: Callable[[str], None] = lambda line: None) -> int:
    """Returns the number of patch commits the overlay holds; ``say`` gets what was kept."""
    pin = read_pin(repo)
    torch = installed_torch()
    check_installed(pin, torch)
    overlay = repo / OVERLAY_DIR
    with sync_state.locked(repo):
        recover(repo, overlay, say)
        work = local_work(repo, overlay, force)
        if work is None:  # only local work: nothing to bring in
            say(f"{OVERLAY_DIR}/ is up to date with patches/ and holds work not exported yet "
                "(kept; torch-overlay export writes it to patches/)")  # fmt: skip
            return len(overlay_repo.commits(overlay))
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=repo))
        try:
            fresh = scratch / "overlay"
            overlay_repo.build(repo, fresh, pin, torch)
            with sync_state.uninterruptible():
                # Commits are kept on a branch; uncommitted edits go to the stash anyway.
                commits = [w for w in work if not w.startswith("uncommitted edit")]
                install(fresh, overlay, keep=bool(commits), say=say)
                sync_state.record(repo)
        finally:
            shutil.rmtree(scratch)
    return len(overlay_repo.commits(overlay))


def local_work(repo: Path, overlay: Path, force: bool) -> list[str] | None:
    """The overlay's work that a rebuild would replace ([] when none; None when there is
    nothing to sync because only the overlay moved). Refuses what it cannot merge."""
    if not overlay.exists():
        return []
    if not overlay_repo.exists(overlay):
        others = sorted(p.name for p in overlay.iterdir() if p.name != "README.md")
        if others:
            raise OverlayError(
                f"{OVERLAY_DIR}/ is not a git repository but holds {', '.join(others)}; "
                "move them away, then sync"
            )
        return []
    operation = sync_state.in_progress(overlay)
    if operation:
        raise OverlayError(
            f"{OVERLAY_DIR}/ is in the middle of a {operation}; finish or abort it there first"
        )
    changed = sync_state.behind(repo)
    if changed is None:  # made before sync recorded what patches/ held: who moved is unknown
        work = pending(repo)
        if work and not force:
            raise OverlayError(
                f"{OVERLAY_DIR}/ and patches/ differ, and the overlay predates the record that "
                "tells which side changed. If you changed the overlay: torch-overlay export. "
                "If patches/ changed (a pull): torch-overlay sync --force (it keeps the "
                "overlay's commits on a saved/… branch and its edits in git stash):\n  "
                + "\n  ".join(work)
            )
        return work
    work = sync_state.ahead(repo) or []
    if not work or force:
        return work
    if not changed:
        return None
    raise OverlayError(
        "both sides changed since the last sync: patches/ ("
        + ", ".join(changed)
        + ") and torch_overlay/ ("
        + ", ".join(work)
        + "). Exporting would overwrite the pulled patches, syncing would drop your work. "
        "Either sync --force (your commits stay on a saved/… branch, your edits in git stash; "
        "cherry-pick them onto the new series, then export), or export the overlay's commits "
        "as files first (git -C torch_overlay format-patch) and merge them by hand"
    )


def install(fresh: Path, overlay: Path, keep: bool, say: Callable[[str], None]) -> None:
    """Make ``overlay`` hold the series built at ``fresh``; ``keep``: save its commits on a
    branch first. Uncommitted edits (only there under --force) go to the stash."""
    if not overlay_repo.exists(overlay):
        (overlay / "README.md").unlink(missing_ok=True)  # the project's tracked copy
        if overlay.exists():
            overlay.rmdir()
        os.rename(fresh, overlay)
        return
    if overlay_repo.uncommitted(overlay):
        git("stash", "push", "-q", "--include-untracked", "-m",
            "torch-overlay sync --force: uncommitted edits", cwd=overlay)  # fmt: skip
        say(f"kept the uncommitted edits of {OVERLAY_DIR}/ in its git stash (stash@{{0}})")
    branch = git("symbolic-ref", "-q", "--short", "HEAD", cwd=overlay, check=False).strip()
    if keep:
        saved = f"saved/{time.strftime('%Y%m%d-%H%M%S')}"
        git("branch", "-f", saved, "HEAD", cwd=overlay)
        say(f"kept the previous commits of {OVERLAY_DIR}/ on its branch {saved}")
    git("fetch", "-q", "--no-tags", str(fresh), "main", cwd=overlay)
    git("checkout", "-q", "-f", "-B", "main", "FETCH_HEAD", cwd=overlay)
    if branch and branch != "main":
        say(f"{OVERLAY_DIR}/ was on branch {branch} (kept); it is now on main, the series")
    if not (overlay / "README.md").exists():
        shutil.copyfile(fresh / "README.md", overlay / "README.md")


def recover(repo: Path, overlay: Path, say: Callable[[str], None]) -> None:
    """Clean up after a sync that was killed: restore an overlay that an older torch-overlay
    moved aside (``SCRATCH_PREFIX*/old``) and had not replaced, remove the scratch trees."""
    for leftover in sorted(repo.glob(SCRATCH_PREFIX + "*")):
        if not leftover.is_dir():
            continue
        old = leftover / "old"
        if overlay_repo.exists(old) and not overlay_repo.exists(overlay):
            if overlay.exists():
                (overlay / "README.md").unlink(missing_ok=True)
                overlay.rmdir()
            os.rename(old, overlay)
            say(f"recovered {OVERLAY_DIR}/ from an interrupted sync ({leftover.name}/old)")
        shutil.rmtree(leftover)
