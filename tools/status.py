"""`torch-overlay status`: the base, where the overlay is active, which patches are active on
this wheel and which need a source build, and which modules are overlaid."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tools import overlay_repo, sync_state, topics
from tools.activate import ACTIVE_DIR, pth_path
from tools.active import ENV_VAR, materialize, tree_digest
from tools.base import (
    OVERLAY_DIR,
    drifted_files,
    installed_torch,
    pip_install,
    read_pin,
    read_series,
)


def status(repo: Path) -> str:
    pin = read_pin(repo)
    torch = installed_torch()
    public = torch.version.split("+", 1)[0]
    matches = public == pin.version and torch.git_version == pin.git_version
    lines = [
        f"base: torch {pin.version} (git {pin.git_version[:12]}), "
        f"{len(read_series(repo))} patch(es) in patches/series",
        f"installed: torch {torch.version} (git {torch.git_version[:12]}): "
        + ("matches the base" if matches else "DOES NOT match the base"),
    ]
    drifted = drifted_files(pin, torch) if matches else []
    for path, expected, actual in drifted:
        lines.append(
            f"  DRIFT: {path}: the wheel's sha256 {actual[:16]}…, base.json's {expected[:16]}…"
        )
    if drifted:
        lines.append(f"  (the overlay cannot be used on it) reinstall: {pip_install(pin)}")
    overlay = repo / OVERLAY_DIR
    if not overlay_repo.exists(overlay):
        return "\n".join([*lines, "overlay: not materialized; run: torch-overlay sync"]) + "\n"
    edits = overlay_repo.uncommitted(overlay)
    lines.append(
        f"overlay: {OVERLAY_DIR}/, "
        + (f"{len(edits)} uncommitted edit(s)" if edits else "no uncommitted edits")
    )
    changed = sync_state.behind(repo)
    if changed is None:
        lines.append("  (no record of the last sync: run torch-overlay sync or export)")
    elif changed:
        lines.append(f"  BEHIND patches/: changed since the last sync: {', '.join(changed)}; "
                     "run torch-overlay sync")  # fmt: skip
    else:
        work = sync_state.ahead(repo) or []
        patches = sum(w.startswith("patches/") for w in work)
        bases = sum(w.startswith("base file") for w in work)
        if patches or bases:
            lines.append(f"  not exported yet: {patches} patch file(s), {bases} base file(s) "
                         "differ from patches/; run torch-overlay export")  # fmt: skip
    lines.append("venv: " + ("activated (" + pth_path().name + ")" if pth_path().exists()
                             else "not activated"))  # fmt: skip
    if os.environ.get(ENV_VAR):
        lines.append("this process: started by torch-overlay run")
    if not matches:
        return "\n".join(lines) + "\n"
    with tempfile.TemporaryDirectory() as scratch:
        plan = materialize(repo, Path(scratch) / "tree")
        now = tree_digest(Path(scratch) / "tree")
    lines.append("patches:")
    upstream = {row["patch"]: row for row in topics.patch_rows(repo, set())}
    for commit in plan.commits:
        state = "held back" if commit.needs_build else "active"
        lines.append(f"  {state:<9}  {commit.subject}")
        if commit.needs_build:
            lines.append(f"             needs a source build ({commit.needs_build})")
        if commit.subject in upstream:
            row = upstream[commit.subject]
            lines.append(f"             topic {row['topic']}; upstream: {row['upstream']}")
    if not plan.commits:
        lines.append("  (none: the series is empty)")
    lines.append("overlaid modules:" if plan.modules else "overlaid modules: none")
    lines += [f"  {module}" for module in plan.modules]
    if pth_path().exists() and (repo / ACTIVE_DIR).exists():
        if tree_digest(repo / ACTIVE_DIR) == now:
            lines.append(f"(the venv uses {ACTIVE_DIR}/, up to date with {OVERLAY_DIR}/)")
        else:
            lines.append(f"venv: STALE: {ACTIVE_DIR}/ (the last activate) differs from what "
                         f"{OVERLAY_DIR}/ holds now; re-run: torch-overlay activate")  # fmt: skip
    return "\n".join(lines) + "\n"
