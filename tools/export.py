"""`torch-overlay export`: write the overlay's commits back to ``patches/`` and the base record.

Source-only patches (tools/base.py) are not in the overlay; they are kept as they are, after
the overlay's patches. Export never writes over a file of ``patches/`` that changed since the
overlay was last synced (a pulled patch): it refuses and names it (tools/sync_state.py)."""

from __future__ import annotations

from pathlib import Path

from tools import overlay_repo, sync_state
from tools.base import (
    OVERLAY_DIR,
    PATCH_GLOB,
    SERIES_FILE,
    SERIES_HEADER,
    OverlayError,
    Pin,
    read_patch,
    read_pin,
    read_series,
    sha256,
    source_only_series,
    write_pin,
)


def planned(repo: Path) -> tuple[list[tuple[str, bytes]], Pin]:
    """The patches and base record that the overlay's commits stand for. Source-only patches
    (which the overlay does not hold) keep their text and follow the overlay's patches,
    renumbered."""
    overlay = repo / OVERLAY_DIR
    overlay_repo.require(overlay)
    pin = read_pin(repo)
    files = {path: sha256(data) for path, data in overlay_repo.base_files(overlay).items()}
    patches = overlay_repo.render_patches(overlay)
    for name in source_only_series(repo, pin):
        number = f"{len(patches) + 1:04d}"
        patches.append((f"{number}-{name.split('-', 1)[1]}", read_patch(repo, name)))
    return patches, Pin(pin.version, pin.git_version, files, pin.source_only)


def pending(repo: Path) -> list[str]:
    """What the overlay holds that ``patches/`` does not: uncommitted edits, unexported commits.
    When patches/ changed since the last sync, the overlay is behind, and that is all it says."""
    overlay = repo / OVERLAY_DIR
    changed = sync_state.behind(repo)
    if changed:
        return [f"{OVERLAY_DIR}/ is behind patches/ (changed since the last sync: "
                f"{', '.join(changed)}); run torch-overlay sync"]  # fmt: skip
    problems = [f"uncommitted edit in {OVERLAY_DIR}/: {line}" for line in
                overlay_repo.uncommitted(overlay)]  # fmt: skip
    patches, pin = planned(repo)
    if [name for name, _ in patches] != read_series(repo):
        problems.append(
            f"the overlay's commits ({len(patches)}) differ from patches/series; "
            "run torch-overlay export"
        )
    for name, text in patches:
        path = repo / "patches" / name
        if not path.exists() or path.read_bytes() != text:
            problems.append(
                f"patches/{name} differs from its overlay commit; run torch-overlay export"
            )
    if pin != read_pin(repo):
        problems.append(
            "patches/base.json differs from the overlay's base files; run torch-overlay export"
        )
    return problems


def export(repo: Path) -> list[str]:
    """Regenerate patches/ from the overlay; returns the names of files that changed."""
    overlay = repo / OVERLAY_DIR
    overlay_repo.require(overlay)
    with sync_state.locked(repo):
        changed = write(repo, overlay)
        sync_state.record(repo)
    return changed


def write(repo: Path, overlay: Path) -> list[str]:
    pulled = sync_state.behind(repo)
    if pulled:
        raise OverlayError(
            "patches/ changed since the last sync (" + ", ".join(pulled) + "); exporting would "
            "overwrite that with the overlay's older version. Run torch-overlay sync first "
            "(it refuses, naming both sides, if the overlay holds work of its own)"
        )
    dirty = overlay_repo.uncommitted(overlay)
    if dirty:
        raise OverlayError(
            f"{OVERLAY_DIR}/ has uncommitted edits; commit them there first:\n  "
            + "\n  ".join(dirty)
        )
    patches, pin = planned(repo)
    patch_dir = repo / "patches"
    changed = []
    keep = {name for name, _ in patches}
    for stale in sorted(patch_dir.glob(PATCH_GLOB)):
        if stale.name not in keep:
            stale.unlink()
            changed.append(f"removed patches/{stale.name}")
    for name, text in patches:
        path = patch_dir / name
        if not path.exists() or path.read_bytes() != text:
            path.write_bytes(text)
            changed.append(f"wrote patches/{name}")
    series = SERIES_HEADER + "".join(f"{name}\n" for name, _ in patches)
    if (repo / SERIES_FILE).read_text() != series:
        (repo / SERIES_FILE).write_text(series)
        changed.append(f"wrote {SERIES_FILE}")
    if pin != read_pin(repo):
        write_pin(repo, pin)
        changed.append("wrote patches/base.json")
    return changed
