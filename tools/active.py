"""Which patches can be active on a wheel, and the tree of Python files that activates them.

A patch that touches C++ (or carries the ``Requires-Source-Build`` trailer because its Python
change is only correct with a C++ change of the series) is held back: its Python changes are
reverse-applied from the overlay's working tree, so uncommitted edits are still tested.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools import overlay_repo
from tools.base import (
    OVERLAY_DIR,
    OverlayError,
    check_installed,
    git,
    git_bytes,
    installed_torch,
    read_pin,
    sha256,
)
from tools.boot.torch_overlay_finder import PIN_NAME

BOOT_DIR = Path(__file__).parent / "boot"
ENV_VAR = "TORCH_OVERLAY_ACTIVE"


@dataclass(frozen=True)
class Plan:
    commits: list[overlay_repo.Commit]  # the series, in order
    modules: list[str]  # overlaid module names, sorted

    @property
    def active(self) -> list[overlay_repo.Commit]:
        return [c for c in self.commits if not c.needs_build]

    @property
    def held_back(self) -> list[overlay_repo.Commit]:
        return [c for c in self.commits if c.needs_build]

    def summary(self) -> str:
        text = f"{len(self.active)} patch(es) active, {len(self.modules)} module(s) overlaid"
        if self.held_back:
            text += f"; {len(self.held_back)} held back (need a source build)"
        return text


def materialize(repo: Path, dest: Path, overlay: Path | None = None) -> Plan:
    """Write the active Python files of ``overlay`` (default: the project's) to ``dest``
    (which must not exist) and describe them. ``dest/PIN_NAME`` gives the import hook the
    pinned release and the base sha256 of each file it replaces, which it checks against the
    torch of every interpreter it runs in."""
    pin = read_pin(repo)
    torch = installed_torch()
    check_installed(pin, torch)
    overlay = overlay or repo / OVERLAY_DIR
    overlay_repo.require(overlay)
    commits = overlay_repo.commits(overlay) + overlay_repo.source_only_commits(repo, pin)
    held_back = [c for c in commits if c.needs_build and c.sha]  # source-only: no Python
    tracked = git("ls-files", "-co", "--exclude-standard", "--", "torch/*.py", cwd=overlay)
    dest.mkdir(parents=True)
    for rel in tracked.split():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(overlay / rel, dest / rel)
    for commit in reversed(held_back):
        diff = git("diff", "--full-index", f"{commit.sha}^", commit.sha, "--", "*.py", cwd=overlay)
        if diff:
            # dest lies outside any git work tree, so git apply works on plain files there.
            proc = subprocess.run(
                ["git", "apply", "-R", "-"], cwd=dest, input=diff.encode(), capture_output=True
            )
            if proc.returncode:
                raise OverlayError(
                    f"cannot hold back {commit.subject!r} (it needs a source build): later "
                    f"changes depend on it:\n{proc.stderr.decode().strip()}"
                )
    modules = []
    replaced = {}  # base files the tree shadows -> their pinned sha256
    base = overlay_repo.base_commit(overlay)
    in_base = set(git("ls-tree", "-r", "--name-only", base, cwd=overlay).split())
    for path in sorted(dest.rglob("*.py")):
        rel = path.relative_to(dest).as_posix()
        installed = torch.site / rel
        if installed.exists() and installed.read_bytes() == path.read_bytes():
            path.unlink()  # unchanged upstream file: let the wheel's copy serve it
            continue
        modules.append(rel[: -len(".py")].removesuffix("/__init__").replace("/", "."))
        if rel in pin.files:
            replaced[rel] = pin.files[rel]
        elif rel in in_base:  # added since the last export: the overlay's base copy
            replaced[rel] = sha256(git_bytes("show", f"{base}:{rel}", cwd=overlay))
    hook_pin = {"torch_version": pin.version, "git_version": pin.git_version, "files": replaced}
    (dest / PIN_NAME).write_text(json.dumps(hook_pin, indent=2) + "\n")
    return Plan(commits, modules)


def tree_digest(tree: Path) -> str:
    """Names the Python files of a materialized overlay, so a report can say what it measured."""
    files = sorted(tree.rglob("*.py"))
    return sha256(b"".join(f.relative_to(tree).as_posix().encode() + f.read_bytes() for f in files))


def overlay_digest(repo: Path) -> str:
    """``tree_digest`` of what ``run`` would activate now (uncommitted overlay edits included)."""
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        materialize(repo, Path(scratch) / "tree")
        return tree_digest(Path(scratch) / "tree")


def materialize_to(repo: Path, target: Path) -> Plan:
    """Like ``materialize``, replacing ``target`` only once the new tree is complete."""
    scratch = Path(tempfile.mkdtemp(prefix="torch-overlay-active-"))
    try:
        plan = materialize(repo, scratch / "tree")
        if target.exists():
            shutil.rmtree(target)
        shutil.move(scratch / "tree", target)
    finally:
        shutil.rmtree(scratch)
    return plan


def environment(tree: Path | None) -> dict[str, str]:
    """Environment for a process tree: the overlay at ``tree``, or stock torch for None."""
    env = dict(os.environ)
    paths = [str(BOOT_DIR / "run")]
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != paths[0]]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[ENV_VAR] = str(tree) if tree else ""
    return env


def run_stock_and_overlay(repo: Path, command: list[str]) -> tuple[Plan, str, str]:
    """Run ``command`` in ``repo`` on stock torch and with the overlay's active patches
    (materialized in a scratch tree), both at once (they share nothing but the machine, and
    each spends much of its time starting interpreters); return the plan and both outputs.
    A run that fails stops here with its stderr."""
    with tempfile.TemporaryDirectory(prefix="torch-overlay-") as scratch:
        tree = Path(scratch) / "tree"
        plan = materialize(repo, tree)
        variants = {"stock": None, "overlay": tree}
        # Files, not pipes: a run that fills a pipe nobody reads yet would stall.
        logs = {(label, stream): Path(scratch) / f"{label}.{stream}"
                for label in variants for stream in ("out", "err")}  # fmt: skip
        procs = {}
        try:
            for label, active in variants.items():
                with open(logs[label, "out"], "w") as out, open(logs[label, "err"], "w") as err:
                    procs[label] = subprocess.Popen(
                        command, cwd=repo, env=environment(active), stdout=out, stderr=err
                    )
            for proc in procs.values():
                proc.wait()
        finally:  # an interrupt or an error here must not leave the other run behind
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for label, proc in procs.items():
            if proc.returncode:
                sys.stderr.write(logs[label, "err"].read_text())
                raise SystemExit(f"{' '.join(command)} failed ({label} torch)")
        outputs = {label: logs[label, "out"].read_text() for label in variants}
    return plan, outputs["stock"], outputs["overlay"]
