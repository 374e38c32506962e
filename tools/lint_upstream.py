"""lintrunner adapter UPSTREAMLINT: upstream PyTorch's flake8 and ruff rules, and its formatter
(ruff format, upstream's PYFMT), on the Python files the series changes, reporting only the
warnings a patch adds.

The settings are upstream's, kept in tools/upstream.flake8 and tools/upstream_ruff.toml. The series
is materialized in a scratch directory (as tools/lint_patches.py does); each patch's .py files are
linted before and after that patch, so every new warning is reported once, against the patch that
introduced it (message path patches/<patch>), and a later patch touching the same file does not
repeat it. Before the first patch that touches a file, "before" is the stock base file, so
warnings upstream already has never count. Prints one lintrunner JSON message per line; always
exits 0, as lintrunner expects.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tools import overlay_repo
from tools.base import (
    OverlayError,
    find_repo,
    git_bytes,
    installed_torch,
    overlay_series,
    read_pin,
)
from tools.lint_patches import message

CODE = "UPSTREAMLINT"
FLAKE8_CONFIG = Path(__file__).resolve().parent / "upstream.flake8"
RUFF_CONFIG = Path(__file__).resolve().parent / "upstream_ruff.toml"


@dataclass(frozen=True)
class Finding:
    tool: str
    code: str
    line: int
    text: str  # the tool's message
    # What identifies the finding across versions of the file: the stripped text of the
    # offending line (for a formatter hunk: the hunk). Line numbers shift whenever a patch adds
    # or removes lines above; this text does not, and needs no diff parsing to map lines between
    # versions. Messages are left out: some name line numbers ("redefinition ... from line 12").
    context: str

    def key(self) -> tuple[str, str, str]:
        return self.tool, self.code, self.context


def line_text(lines: list[str], row: int) -> str:
    return lines[row - 1].strip() if 0 < row <= len(lines) else ""


def run_tool(command: list[str], source: bytes, cwd: Path, ok: tuple[int, ...] = (0, 1)) -> str:
    # Exit status 1 means "found warnings" for the linters; anything else is a crash.
    proc = subprocess.run(command, input=source, cwd=cwd, capture_output=True)
    if proc.returncode not in ok:
        raise OverlayError(f"{command[2:4]} failed:\n{proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode(errors="replace")


def flake8(source: bytes, path: str, cwd: Path) -> list[Finding]:
    # The source goes on stdin under its upstream path, which per-file-ignores match
    # relative to cwd (the overlay root).
    out = run_tool(
        [sys.executable, "-m", "flake8", f"--config={FLAKE8_CONFIG}",
         "--format=%(row)d\t%(code)s\t%(text)s", f"--stdin-display-name={path}", "-"],
        source, cwd,
    )  # fmt: skip
    lines = source.decode(errors="replace").splitlines()
    findings = []
    for line in out.splitlines():
        row, code, text = line.split("\t", 2)
        findings.append(Finding("flake8", code, int(row), text, line_text(lines, int(row))))
    return findings


def ruff(source: bytes, path: str, cwd: Path) -> list[Finding]:
    out = run_tool(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--no-fix", f"--config={RUFF_CONFIG}",
         "--output-format=json", f"--stdin-filename={path}", "-"],
        source, cwd,
    )  # fmt: skip
    lines = source.decode(errors="replace").splitlines()
    return [
        Finding(
            "ruff",
            item["code"] or "syntax-error",
            item["location"]["row"],
            item["message"],
            line_text(lines, item["location"]["row"]),
        )
        for item in json.loads(out)
    ]


def ruff_format(source: bytes, path: str, cwd: Path) -> list[Finding]:
    """One finding per hunk that upstream's formatter (PYFMT: ruff format) would change."""
    out = run_tool(
        [sys.executable, "-m", "ruff", "format", "--no-cache", f"--config={RUFF_CONFIG}",
         f"--stdin-filename={path}", "-"],
        source, cwd, ok=(0, 2),
    )  # fmt: skip
    if not out.strip():  # exit 2, cannot parse: the linters report that syntax error
        return []
    lines = source.decode(errors="replace").splitlines(keepends=True)
    formatted = out.splitlines(keepends=True)
    findings = []
    matcher = difflib.SequenceMatcher(None, lines, formatted, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            removed = "".join("-" + line for line in lines[i1:i2])
            hunk = removed + "".join("+" + line for line in formatted[j1:j2])
            text = (
                "not formatted as upstream's formatter would; fix with "
                f"`ruff format --config tools/upstream_ruff.toml torch_overlay/{path}`, then export:\n{hunk}"
            )
            findings.append(Finding("ruff format", "PYFMT", i1 + 1, text, hunk))
    return findings


def new_findings(before: bytes, after: bytes, path: str, cwd: Path, cache: dict) -> list[Finding]:
    """Warnings in ``after`` beyond those ``before`` already has (compared as multisets of keys,
    so a warning repeated on identical lines counts each time)."""

    def findings_of(source: bytes) -> list[Finding]:
        if (path, source) not in cache:
            cache[path, source] = [
                *flake8(source, path, cwd),
                *ruff(source, path, cwd),
                *ruff_format(source, path, cwd),
            ]
        return cache[path, source]

    budget = Counter(f.key() for f in findings_of(before)) if before else Counter()
    result = []
    for finding in findings_of(after):
        key = finding.key()
        if budget[key]:
            budget[key] -= 1
        else:
            result.append(finding)
    return result


def series_messages(overlay: Path, names: list[str]) -> list[str]:
    messages = []
    cache: dict = {}
    for commit, name in zip(overlay_repo.commits(overlay), names, strict=True):
        for path in commit.files:
            if not path.endswith(".py"):
                continue
            after = git_bytes("show", f"{commit.sha}:{path}", cwd=overlay, check=False)
            if not after:  # deleted by this patch
                continue
            before = git_bytes("show", f"{commit.sha}^:{path}", cwd=overlay, check=False)
            # flake8 and ruff share many codes; one message per line and code.
            tools_by_warning: dict[tuple[int, str], list[Finding]] = {}
            for finding in new_findings(before, after, path, overlay, cache):
                tools_by_warning.setdefault((finding.line, finding.code), []).append(finding)
            for (line, code), findings in sorted(tools_by_warning.items()):
                tools = ", ".join(f.tool for f in findings)
                summary, _, details = findings[0].text.partition("\n")
                messages.append(message(
                    f"patches/{name}", CODE, code,
                    f"{path}:{line}: {code} {summary} [{tools}, upstream settings]"
                    + (f"\n{details}" if details else ""),
                ))  # fmt: skip
    return messages


def lint(repo: Path) -> list[str]:
    try:
        pin = read_pin(repo)
        names = overlay_series(repo, pin)  # a source-only patch changes no Python file
        with tempfile.TemporaryDirectory() as scratch:
            overlay = Path(scratch) / "overlay"
            overlay_repo.build(repo, overlay, pin, installed_torch())
            return series_messages(overlay, names)
    except OverlayError as error:
        return [message("patches/series", CODE, "not-checked", f"cannot lint the series: {error}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, fromfile_prefix_chars="@")
    parser.add_argument("paths", nargs="*", help="ignored: the series is checked as a whole")
    parser.parse_args()
    for line in lint(find_repo()):
        print(line)
    sys.exit(0)


if __name__ == "__main__":
    main()
