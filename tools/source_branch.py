"""The fork-style contribution branch in a PyTorch source checkout: one commit per patch,
at the pinned base commit (or on HEAD with a 3-way apply). Shared by `build` and `stack`.
Wheel stopgaps (the ``Wheel-Stopgap`` trailer, tools/base.py) are left out: the patch they
stand in for is on the branch.

Every check runs before anything changes, including applying the whole series to a
scratch index, so a refusal leaves the checkout exactly as it was.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.base import (
    OverlayError,
    git,
    is_source_only,
    read_pin,
    series_subjects,
    wheel_stopgaps,
)

PYTORCH_MARKERS = ("torch/__init__.py", "c10", "aten/src/ATen", "CMakeLists.txt")


@dataclass(frozen=True)
class BranchPlan:
    checkout: Path
    branch: str
    base: str  # commit the branch starts from
    onto_head: bool
    patches: list[tuple[str, str]]  # (file name, subject)
    stopgaps: list[tuple[str, str]]  # wheel stopgaps left out: (subject, replaced by)

    def describe(self) -> list[str]:
        where = "HEAD (3-way apply)" if self.onto_head else "the pinned base"
        lines = [
            f"checkout:  {self.checkout} (clean)",
            f"branch:    {self.branch} at {self.base[:12]} ({where})",
            f"commits:   {len(self.patches)}, one per patch, all apply:",
        ]
        lines += [f"  {i}. {subject}" for i, (_, subject) in enumerate(self.patches, 1)]
        if self.stopgaps:
            lines.append("left out (wheel stopgaps; a source build has the fix they stand for):")
            lines += [f"  {subject}  (replaced by {by})" for subject, by in self.stopgaps]
        return lines


def validate_checkout(src: Path) -> Path:
    src = src.resolve()
    if not src.is_dir():
        raise OverlayError(f"{src} is not a directory")
    top = git("rev-parse", "--show-toplevel", cwd=src, check=False).strip()
    if not top or Path(top).resolve() != src:
        raise OverlayError(f"{src} is not the top of a git checkout")
    missing = [m for m in PYTORCH_MARKERS if not (src / m).exists()]
    if missing:
        raise OverlayError(f"{src} does not look like a PyTorch checkout (no {', '.join(missing)})")
    dirty = git("status", "--porcelain", cwd=src).splitlines()
    if dirty:
        raise OverlayError(
            f"{src} has uncommitted changes; commit or stash them first:\n  "
            + "\n  ".join(dirty[:10])
        )
    return src


def plan(repo: Path, src: Path, branch: str | None, onto_head: bool) -> BranchPlan:
    src = validate_checkout(src)
    pin = read_pin(repo)
    branch = branch or f"torch-overlay/{pin.version}"
    if git("rev-parse", "--verify", "-q", f"refs/heads/{branch}", cwd=src, check=False).strip():
        raise OverlayError(f"branch {branch} already exists in {src}; delete it or pass --branch")
    if onto_head:
        base = git("rev-parse", "HEAD", cwd=src).strip()
    elif git("cat-file", "-t", pin.git_version, cwd=src, check=False).strip() == "commit":
        base = pin.git_version
    else:
        raise OverlayError(
            f"the pinned base commit {pin.git_version} (torch {pin.version}) is not in {src}; "
            f"fetch it (git fetch origin {pin.git_version}) or pass --onto-head to apply the "
            "series on HEAD with a 3-way merge; nothing was changed"
        )
    subjects, stops = series_subjects(repo), wheel_stopgaps(repo)
    names = [name for name in subjects if name not in stops]
    patches = [(name, subjects[name]) for name in names]
    stopgaps = [(subjects[name], by) for name, by in stops.items()]
    missing = [by for by in stops.values() if by not in {subjects[n] for n in names}]
    if missing:
        raise OverlayError(
            "a wheel stopgap names a patch that is not in the series: " + ", ".join(missing)
        )
    check_applies(repo, src, base, names, three_way=onto_head)
    return BranchPlan(src, branch, base, onto_head, patches, stopgaps)


def three_way_args(repo: Path, name: str, onto_head: bool) -> list[str]:
    """``-3`` when the series goes onto HEAD, and always for a source-only patch: its base
    is the checkout's own file (tools/base.py); without the recorded preimage, git applies
    it by context."""
    text = (repo / "patches" / name).read_bytes()
    return ["-3"] if onto_head or is_source_only(read_pin(repo), text) else []


def check_applies(repo: Path, src: Path, base: str, names: list[str], three_way: bool) -> None:
    """Apply the series to a scratch index of ``base``; the checkout is not touched."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        git("read-tree", base, cwd=src, env=env)
        for name in names:
            args = [
                "apply",
                "--cached",
                *three_way_args(repo, name, three_way),
                str(repo / "patches" / name),
            ]
            try:
                git(*args, cwd=src, env=env)
            except OverlayError as error:
                # `git apply -3` lists conflicted paths as "U path"; plain apply says
                # "error: patch failed: path:line".
                found = re.findall(r"^U (\S+)$|^error: patch failed: ([^:]+):", str(error), re.M)
                conflicts = sorted({a or b for a, b in found})
                where = f" (conflicts in: {', '.join(conflicts)})" if conflicts else ""
                raise OverlayError(
                    f"{name} does not apply on {base[:12]} in {src}{where}; nothing was changed\n"
                    f"{error}"
                ) from None


def create(repo: Path, branch_plan: BranchPlan, amend: Callable[[str], None] | None = None) -> str:
    """Create and check out the branch, one commit per patch; returns its head commit.

    ``amend(patch_name)`` runs after each patch is committed (stack adds tests there).
    """
    src = branch_plan.checkout
    original = git("symbolic-ref", "-q", "--short", "HEAD", cwd=src, check=False).strip()
    original = original or git("rev-parse", "HEAD", cwd=src).strip()
    git("checkout", "-q", "-b", branch_plan.branch, branch_plan.base, cwd=src)
    try:
        for name, _ in branch_plan.patches:
            am = ["am", "-q", "--keep-non-patch",
                  *three_way_args(repo, name, branch_plan.onto_head)]  # fmt: skip
            git(*am, str(repo / "patches" / name), cwd=src, fixed_identity=False)
            if amend:
                amend(name)
    except BaseException:
        git("am", "--abort", cwd=src, check=False)
        git("reset", "-q", "--hard", cwd=src, check=False)
        git("checkout", "-q", original, cwd=src, check=False)
        git("branch", "-q", "-D", branch_plan.branch, cwd=src, check=False)
        raise
    return git("rev-parse", "HEAD", cwd=src).strip()
