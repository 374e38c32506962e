"""`torch-overlay check`: the series applies to the pinned base, nothing is unexported, every
touched file has upstream tests mapped in ``patches/upstream.json``, and every patch message
reads as an upstream PyTorch PR.

A message may not point at another PR by its place in the series ("next PR", "previous
PR", "(previous)"...): the series gets reordered, and upstream each patch is a PR of its own,
so such a phrase goes stale silently. Name the other PR by its title, or leave it out. Every
upstream issue that ``patches/upstream.json`` declares for a patch needs its ``Fixes #N``.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tools import overlay_repo
from tools.active import materialize
from tools.base import (
    OVERLAY_DIR,
    PATCH_GLOB,
    PIN_FILE,
    SERIES_FILE,
    UPSTREAM_MAP_FILE,
    WHEEL_STOPGAP_TRAILER,
    InstalledTorch,
    OverlayError,
    UpstreamMap,
    check_installed,
    installed_torch,
    patch_message,
    read_patch,
    read_pin,
    read_series,
    read_upstream_map,
    series_subjects,
    wheel_file,
    wheel_stopgaps,
)
from tools.export import pending

SUBJECT = re.compile(r"^(\[[A-Za-z][^\]]*\])+ \S")
FIXES = re.compile(
    r"^Fixes (#\d+|pytorch/pytorch#\d+|https://github\.com/pytorch/pytorch/issues/\d+)$"
)
RELATIVE_REFERENCE = re.compile(
    r"\b(?:previous|next|earlier|later|prior|preceding|following)\s+"
    r"(?:PRs?|patch(?:es)?|commits?)\b"
    r"|\((?:previous|next|earlier|later)\)",
    re.I,
)
TEST_COMMAND = re.compile(r"(?:python|pytest)\S*\s+(?:-m pytest\s+)?(test/\S+\.py)")


def message_problems(
    repo: Path, name: str, text: bytes, known_issues: list[int] | tuple[int, ...] = ()
) -> list[str]:
    """Problems with one patch message; ``known_issues`` are the upstream issues it fixes."""
    subject, body = patch_message(text)
    problems = []
    if not SUBJECT.match(subject):
        problems.append(
            f"{name}: subject {subject!r} should read '[Area] title', e.g. '[DTensor] …'"
        )
    summary = re.search(r"^Summary:(.*?)(?:^Test Plan:|\Z)", body, re.M | re.S)
    if not summary or not summary.group(1).strip():
        problems.append(f"{name}: no 'Summary:' section (problem, root cause, fix)")
    plan = re.search(r"^Test Plan:\s*\n?(.+)", body, re.M | re.S)
    tests = TEST_COMMAND.findall(plan.group(1)) if plan else []
    if not tests:
        problems.append(f"{name}: 'Test Plan:' must name the command that runs this repo's test")
    problems += [f"{name}: Test Plan names {t}, which is not in this repo" for t in tests
                 if not (repo / t).is_file()]  # fmt: skip
    fixed = set()
    for line in body.splitlines():
        if line.startswith("Fixes") and not FIXES.match(line.strip()):
            problems.append(f"{name}: {line.strip()!r} should read 'Fixes #N'")
        elif line.startswith("Fixes"):
            fixed.add(int(re.findall(r"\d+", line)[-1]))
    problems += [f"{name}: {UPSTREAM_MAP_FILE} says it fixes #{n}; add the line 'Fixes #{n}'"
                 for n in known_issues if n not in fixed]  # fmt: skip
    for reference in RELATIVE_REFERENCE.finditer(body):
        problems.append(
            f"{name}: {' '.join(reference.group().split())!r} points at a PR by its place in "
            "the series; name that PR by its title or remove the reference"
        )
    return problems


def upstream_map_problems(upstream: UpstreamMap, touched: set[str], series: list[str]) -> list[str]:
    """Touched files without mapped upstream tests, and issues declared for missing patches."""
    problems = [
        f"{path}: a patch touches it, but no upstream test file maps to it in {UPSTREAM_MAP_FILE}"
        for path in sorted(touched)
        if not upstream.tests.get(path)
    ]
    problems += [
        f'{UPSTREAM_MAP_FILE}: "issues" names {name}, which is not in {SERIES_FILE}'
        for name in upstream.issues
        if name not in series
    ]
    return problems


def check(repo: Path) -> list[str]:
    """All problems found; empty when the series is good."""
    pin = read_pin(repo)
    torch = installed_torch()
    check_installed(pin, torch)
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        # Refuses (OverlayError) on drift or on the first patch that does not apply.
        overlay_repo.build(repo, Path(scratch) / "overlay", pin, torch)
        changed = {f for c in overlay_repo.commits(Path(scratch) / "overlay") for f in c.files}
        try:  # what `run` activates on a wheel: held-back patches must come out cleanly
            materialize(repo, Path(scratch) / "active", overlay=Path(scratch) / "overlay")
        except OverlayError as error:
            problems.append(f"on a wheel: {error}")
    for commit in overlay_repo.source_only_commits(repo, pin):
        changed.update(commit.files)
    problems += [f"{p}: in {PIN_FILE}'s source_only, but the wheel ships it" for p in
                 pin.source_only if shipped(torch, p)]  # fmt: skip
    if overlay_repo.exists(repo / OVERLAY_DIR):
        problems += pending(repo)
    upstream = read_upstream_map(repo)
    series = read_series(repo)
    problems += [f"patches/{p.name}: not named in {SERIES_FILE} (add it there, or delete it)"
                 for p in sorted((repo / "patches").glob(PATCH_GLOB)) if p.name not in series]  # fmt: skip
    problems += upstream_map_problems(upstream, set(pin.files) | changed, series)
    for name in series:
        text = read_patch(repo, name)
        problems += message_problems(repo, name, text, upstream.issues.get(name, ()))
    subjects = set(series_subjects(repo).values())
    problems += [f"{name}: its {WHEEL_STOPGAP_TRAILER} names {by!r}, which is not a patch "
                 "of the series" for name, by in wheel_stopgaps(repo).items()
                 if by not in subjects]  # fmt: skip
    return problems


def shipped(torch: InstalledTorch, path: str) -> bool:
    """Whether the wheel ships the upstream file at source path ``path``."""
    try:
        return wheel_file(torch, path).exists()
    except OverlayError:  # not a kind of file a wheel ships (e.g. a .cpp source)
        return False
