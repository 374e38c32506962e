"""Branches of a PyTorch source checkout made from the series: one commit per patch, at the
pinned base commit (or on HEAD with a 3-way apply). Shared by `build` (one branch: every
patch but the wheel stopgaps) and `stack` (one branch per topic: the patches it submits).

Every commit is authored and committed by the checkout's own git identity, dated when it is
made, unless the patch names a real author (tools/base.py: PLACEHOLDER_IDENTITY).

Every check runs before anything changes, including applying each branch's patches to a
scratch index, so a refusal leaves the checkout exactly as it was.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.base import (
    PLACEHOLDER_IDENTITY,
    UNASSIGNED_DATE,
    OverlayError,
    git,
    is_source_only,
    patch_paths,
    read_pin,
    series_subjects,
    wheel_stopgaps,
)

PYTORCH_MARKERS = ("torch/__init__.py", "c10", "aten/src/ATen", "CMakeLists.txt")


@dataclass(frozen=True)
class BranchPlan:
    checkout: Path
    branch: str
    base: str  # commit the series' base is: the pinned base, or HEAD with --onto-head
    onto_head: bool
    patches: list[tuple[str, str]]  # (file name, subject) committed on this branch
    stopgaps: list[tuple[str, str]]  # wheel stopgaps left out: (subject, replaced by)
    parent: str = ""  # a branch this one starts from (a topic it depends on), or "": base

    def describe(self) -> list[str]:
        where = "HEAD (3-way apply)" if self.onto_head else "the pinned base"
        start = f"on {self.parent}" if self.parent else f"at {self.base[:12]} ({where})"
        lines = [
            f"checkout:  {self.checkout} (clean)",
            f"branch:    {self.branch} {start}",
            f"commits:   {len(self.patches)}, one per patch, all apply:",
        ]
        lines += [f"  {i}. {subject}" for i, (_, subject) in enumerate(self.patches, 1)]
        if self.stopgaps:
            lines.append("left out (wheel stopgaps; a source build has the fix they stand for):")
            lines += [f"  {subject}  (replaced by {by})" for subject, by in self.stopgaps]
        return lines


def validate_checkout(src: Path) -> Path:
    """A clean PyTorch git checkout. Untracked files are allowed (a build leaves some); one
    in a path a branch writes is refused in ``create``."""
    src = src.resolve()
    if not src.is_dir():
        raise OverlayError(f"{src} is not a directory")
    top = git("rev-parse", "--show-toplevel", cwd=src, check=False).strip()
    if not top or Path(top).resolve() != src:
        raise OverlayError(f"{src} is not the top of a git checkout")
    missing = [m for m in PYTORCH_MARKERS if not (src / m).exists()]
    if missing:
        raise OverlayError(f"{src} does not look like a PyTorch checkout (no {', '.join(missing)})")
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=src).splitlines()
    if dirty:
        raise OverlayError(
            f"{src} has uncommitted changes; commit or stash them first:\n  "
            + "\n  ".join(dirty[:10])
        )
    return src


def require_identity(src: Path) -> str:
    """The checkout's git identity, which authors and commits every branch commit."""
    name = git("config", "user.name", cwd=src, check=False, fixed_identity=False).strip()
    email = git("config", "user.email", cwd=src, check=False, fixed_identity=False).strip()
    if not name or not email:
        raise OverlayError(
            f"{src} has no git identity (user.name and user.email); the commits are authored "
            "as you, so set it first: git -C <checkout> config user.name 'Your Name' && "
            "git -C <checkout> config user.email you@example.org; nothing was changed"
        )
    return f"{name} <{email}>"


# Recorded on each branch made here (``git config branch.<name>.torchOverlayBase``), so a
# later --onto-head run from that branch (stack after build) starts where it started.
BASE_CONFIG = "torchOverlayBase"


def start_commit(repo: Path, src: Path, onto_head: bool) -> str:
    pin = read_pin(repo)
    if onto_head:
        branch = git("symbolic-ref", "-q", "--short", "HEAD", cwd=src, check=False).strip()
        made_here = (
            branch and git("config", f"branch.{branch}.{BASE_CONFIG}", cwd=src, check=False).strip()
        )
        return made_here or git("rev-parse", "HEAD", cwd=src).strip()
    if git("cat-file", "-t", pin.git_version, cwd=src, check=False).strip() == "commit":
        return pin.git_version
    raise OverlayError(
        f"the pinned base commit {pin.git_version} (torch {pin.version}) is not in {src}; "
        f"fetch it (git fetch origin {pin.git_version}) or pass --onto-head to apply the "
        "series on HEAD with a 3-way merge; nothing was changed"
    )


def refuse_existing(src: Path, branches: list[str]) -> None:
    """Refuse branch names git would reject, and names taken by a branch or by its path
    (``a/b`` cannot be created beside a branch ``a``, nor ``a`` beside ``a/b``)."""
    bad = [b for b in branches
           if git("check-ref-format", "--branch", b, cwd=src, check=False).strip() != b]  # fmt: skip
    if bad:
        raise OverlayError(f"not a valid branch name: {', '.join(bad)}; nothing was changed")
    refs = git("for-each-ref", "--format=%(refname:short)", "refs/heads/", cwd=src).split()
    existing = [
        b for b in branches
        if any(r == b or r.startswith(f"{b}/") or b.startswith(f"{r}/") for r in refs)
    ]  # fmt: skip
    if existing:
        raise OverlayError(
            f"branch {', '.join(existing)} already exists in {src}; delete it "
            f"(git branch -D {' '.join(existing)}) or choose other names (build --branch, "
            "stack --prefix); nothing was changed"
        )


def plan(repo: Path, src: Path, branch: str | None, onto_head: bool) -> BranchPlan:
    """The build branch: every patch of the series but the wheel stopgaps."""
    src = validate_checkout(src)
    pin = read_pin(repo)
    branch = branch or f"torch-overlay/{pin.version}"
    refuse_existing(src, [branch])
    base = start_commit(repo, src, onto_head)
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
    """Apply the patches to a scratch index of ``base``; the checkout is not touched."""
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
            before = git("write-tree", cwd=src, env=env)
            try:
                git(*args, cwd=src, env=env)
                if git("write-tree", cwd=src, env=env) == before:
                    raise OverlayError(
                        f"{name} is already in {base[:12]} (applying it changes nothing); "
                        "the start commit has it: drop it from the series or start from the "
                        "pinned base; nothing was changed"
                    )
            except OverlayError as error:
                if "is already in" in str(error):
                    raise
                # `git apply -3` lists conflicted paths as "U path"; plain apply says
                # "error: patch failed: path:line".
                found = re.findall(r"^U (\S+)$|^error: patch failed: ([^:]+):", str(error), re.M)
                conflicts = sorted({a or b for a, b in found})
                where = f" (conflicts in: {', '.join(conflicts)})" if conflicts else ""
                raise OverlayError(
                    f"{name} does not apply on {base[:12]} in {src}{where}; nothing was changed\n"
                    f"{error}"
                ) from None


def refuse_untracked(repo: Path, src: Path, plans: list[BranchPlan], extra: list[str]) -> None:
    """A file the start commit does not track, where a branch writes, would be overwritten or
    committed (ignored files included: ``git status`` does not show them)."""
    written = {p for bp in plans for name, _ in bp.patches
               for p in patch_paths((repo / "patches" / name).read_bytes())}  # fmt: skip
    tracked = set(git("ls-tree", "-r", "--name-only", plans[0].base, cwd=src).splitlines())
    clashes = sorted(p for p in written | set(extra) if (src / p).exists() and p not in tracked)
    if clashes:
        raise OverlayError(
            f"files in {src} that git does not track are in the way of the branch: "
            f"{', '.join(clashes)}; move them away first; nothing was changed"
        )


def create(repo: Path, branch_plan: BranchPlan, amend: Callable[[str], None] | None = None) -> str:
    """Create and check out the branch, one commit per patch; returns its head commit.

    A patch without a real author (the overlay's unassigned identity, or any placeholder)
    is authored by the checkout's identity, dated now. ``amend(patch_name)`` runs after
    each patch is committed (stack adds tests there)."""
    src = branch_plan.checkout
    original = git("symbolic-ref", "-q", "--short", "HEAD", cwd=src, check=False).strip()
    original = original or git("rev-parse", "HEAD", cwd=src).strip()
    start = branch_plan.parent or branch_plan.base
    git("checkout", "-q", "-b", branch_plan.branch, start, cwd=src)
    try:
        git("config", f"branch.{branch_plan.branch}.{BASE_CONFIG}", branch_plan.base, cwd=src)
        for name, _ in branch_plan.patches:
            am = ["am", "-q", "--keep-non-patch",
                  *three_way_args(repo, name, branch_plan.onto_head)]  # fmt: skip
            before = git("rev-parse", "HEAD", cwd=src).strip()
            git(*am, str(repo / "patches" / name), cwd=src, fixed_identity=False)
            if git("rev-parse", "HEAD", cwd=src).strip() == before:  # "already applied"
                raise OverlayError(f"{name} made no commit: the start commit already has it")
            author, date = git("log", "-1", "--format=%an <%ae>%x00%ad", "--date=iso-strict",
                               cwd=src).strip().split("\0")  # fmt: skip
            if PLACEHOLDER_IDENTITY.search(author):
                git("commit", "-q", "--amend", "--no-edit", "--cleanup=verbatim",
                    "--reset-author", cwd=src, fixed_identity=False)  # fmt: skip
            elif date.startswith(UNASSIGNED_DATE):  # a real author, no real date yet
                git("commit", "-q", "--amend", "--no-edit", "--cleanup=verbatim",
                    "--date=now", cwd=src, fixed_identity=False)  # fmt: skip
            if amend:
                amend(name)
    except BaseException:
        git("am", "--abort", cwd=src, check=False)
        git("reset", "-q", "--hard", cwd=src, check=False)
        git("checkout", "-q", original, cwd=src, check=False)
        git("branch", "-q", "-D", branch_plan.branch, cwd=src, check=False)
        raise
    return git("rev-parse", "HEAD", cwd=src).strip()


def current(src: Path) -> str:
    """The checked-out branch (or commit), to return to."""
    name = git("symbolic-ref", "-q", "--short", "HEAD", cwd=src, check=False).strip()
    return name or git("rev-parse", "HEAD", cwd=src).strip()
