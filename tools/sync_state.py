"""Who moved since the last sync: ``patches/`` (a pull), the overlay (local work), or both.

``sync`` and ``export`` record, inside the overlay's git directory, the sha256 of every file
of ``patches/`` that the overlay is made from (series, base.json, each ``*.patch``) and of
what ``export`` would write from the overlay's commits. Comparing both with now tells:

- ``patches/`` changed (a teammate's patch was pulled): the overlay is *behind*. ``sync``
  rebuilds it; ``export`` refuses, since it would write the overlay's older version over the
  pulled one; ``run``, ``status`` and ``verify`` warn.
- the overlay changed (commits, edits): it is *ahead*; ``export`` writes it back.
- both: ``sync`` refuses naming both sides, as ``git pull`` does with local changes.

The verbs that change ``torch_overlay/`` or ``patches/`` hold a lock (``locked``) so that two
of them cannot interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tools import overlay_repo
from tools.base import OVERLAY_DIR, sha256

STATE_FILE = "torch-overlay-synced.json"  # in torch_overlay/.git: survives any sync
LOCK_FILE = ".torch_overlay.lock"  # git-ignored (/.torch_overlay.*)
# Git operations that a sync must not move HEAD under.
IN_PROGRESS = {
    "rebase-merge": "rebase",
    "rebase-apply": "rebase or am",
    "MERGE_HEAD": "merge",
    "CHERRY_PICK_HEAD": "cherry-pick",
    "REVERT_HEAD": "revert",
    "BISECT_LOG": "bisect",
}


def patches_snapshot(repo: Path) -> dict[str, str]:
    """sha256 of every file of patches/ that the overlay is made from."""
    folder = repo / "patches"
    files = [folder / "series", folder / "base.json", *sorted(folder.glob("*.patch"))]
    return {f"patches/{f.name}": sha256(f.read_bytes()) for f in files if f.is_file()}


def overlay_snapshot(overlay: Path) -> dict[str, str]:
    """sha256 of what export would write from the overlay's commits: each patch file and each
    base file a patch touches."""
    found = {f"patches/{name}": sha256(text) for name, text in overlay_repo.render_patches(overlay)}
    for path, data in overlay_repo.base_files(overlay).items():
        found[f"base file {path}"] = sha256(data)
    return found


def record(repo: Path) -> None:
    """Remember that patches/ and the overlay agree now (after a sync or an export)."""
    overlay = repo / OVERLAY_DIR
    data = {"patches": patches_snapshot(repo), "overlay": overlay_snapshot(overlay)}
    path = overlay / ".git" / STATE_FILE
    partial = path.with_name(STATE_FILE + ".partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)  # never half written


def recorded(overlay: Path) -> dict | None:
    """The last record, or None for an overlay made before records (or a damaged one)."""
    try:
        data = json.loads((overlay / ".git" / STATE_FILE).read_text())
        return {"patches": dict(data["patches"]), "overlay": dict(data["overlay"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """``name (changed|new|removed)`` for each entry that differs."""
    return [
        f"{name} ({'new' if name not in old else 'removed' if name not in new else 'changed'})"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def behind(repo: Path) -> list[str] | None:
    """Files of patches/ changed since the overlay was last synced or exported; None when the
    overlay is missing or has no record. Cheap: hashes a few files."""
    state = recorded(repo / OVERLAY_DIR)
    return None if state is None else changes(state["patches"], patches_snapshot(repo))


def ahead(repo: Path) -> list[str] | None:
    """The overlay's work since it was last synced or exported (uncommitted edits, then what
    export would change); None when the overlay has no record."""
    overlay = repo / OVERLAY_DIR
    state = recorded(overlay)
    if state is None:
        return None
    work = [f"uncommitted edit: {line}" for line in overlay_repo.uncommitted(overlay)]
    return work + changes(state["overlay"], overlay_snapshot(overlay))


def behind_warning(repo: Path) -> str:
    """A one-line warning when the overlay is behind patches/, else ""."""
    changed = behind(repo)
    if not changed:
        return ""
    return (
        f"warning: {OVERLAY_DIR}/ is behind patches/ (changed since the last sync: "
        f"{', '.join(changed)}); this uses the overlay as it is: run torch-overlay sync"
    )


def in_progress(overlay: Path) -> str:
    """The git operation under way in the overlay (a rebase...), or ""."""
    git_dir = overlay / ".git"
    return next((what for name, what in IN_PROGRESS.items() if (git_dir / name).exists()), "")


@contextlib.contextmanager
def locked(repo: Path) -> Iterator[None]:
    """Serialize the verbs that change torch_overlay/ or patches/ (flock: released by the
    kernel when the process dies, so a killed sync never leaves it stuck)."""
    with open(repo / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"torch-overlay: waiting for another torch-overlay command that is changing "
                f"{OVERLAY_DIR}/ (lock: {repo / LOCK_FILE})",
                file=sys.stderr,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """Defer SIGINT/SIGTERM/SIGHUP until the block is done, so that a swap is never half made;
    then they take effect. Blocked in this thread's mask, which the git processes started
    inside inherit (a Ctrl-C to the whole process group does not stop them midway), and caught
    by Python handlers meanwhile: another thread (torch starts some) may receive the signal,
    and Python would run the handler in the main thread anyway."""
    caught: list[int] = []
    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = (
        {s: signal.signal(s, lambda n, _: caught.append(n)) for s in DEFERRED} if main else {}
    )
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in caught:
            signal.raise_signal(signum)
