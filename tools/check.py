"""`torch-overlay check`: the series applies to the pinned base, nothing is unexported, and
every patch message reads as an upstream PyTorch PR."""

from __future__ import annotations

import email
import email.policy
import re
import tempfile
from pathlib import Path

from tools import overlay_repo
from tools.active import materialize
from tools.base import (
    OVERLAY_DIR,
    OverlayError,
    check_installed,
    installed_torch,
    read_pin,
    read_series,
)
from tools.export import pending

SUBJECT = re.compile(r"^(\[[A-Za-z][^\]]*\])+ \S")
FIXES = re.compile(
    r"^Fixes (#\d+|pytorch/pytorch#\d+|https://github\.com/pytorch/pytorch/issues/\d+)$"
)
TEST_COMMAND = re.compile(r"(?:python|pytest)\S*\s+(?:-m pytest\s+)?(test/\S+\.py)")


def patch_message(text: bytes) -> tuple[str, str]:
    """Subject (without ``[PATCH]``) and body of a ``git format-patch`` file."""
    message = email.message_from_bytes(text, policy=email.policy.default)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(message["Subject"]))
    body = message.get_payload(decode=True).decode()
    return subject, body.split("\n---\n", 1)[0]


def message_problems(repo: Path, name: str, text: bytes) -> list[str]:
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
    for line in body.splitlines():
        if line.startswith("Fixes") and not FIXES.match(line.strip()):
            problems.append(f"{name}: {line.strip()!r} should read 'Fixes #N'")
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
        try:  # what `run` activates on a wheel: held-back patches must come out cleanly
            materialize(repo, Path(scratch) / "active", overlay=Path(scratch) / "overlay")
        except OverlayError as error:
            problems.append(f"on a wheel: {error}")
    if overlay_repo.exists(repo / OVERLAY_DIR):
        problems += pending(repo)
    for name in read_series(repo):
        problems += message_problems(repo, name, (repo / "patches" / name).read_bytes())
    return problems
