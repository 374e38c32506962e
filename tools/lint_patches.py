"""lintrunner adapter for the series: every patch applies to the pinned base (PATCHAPPLY), and
the C++ lines the patches change are clang-formatted (CLANGFORMAT).

Patch files cannot be formatted themselves, so the series is materialized in a scratch
directory and clang-format runs on the changed line ranges of each C++ file there.
Prints one lintrunner JSON message per line; always exits 0, as lintrunner expects.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import overlay_repo
from tools.base import (
    OverlayError,
    find_repo,
    git,
    installed_torch,
    overlay_series,
    read_pin,
    read_series,
)

CPP_SUFFIXES = (".h", ".hpp", ".cuh", ".cpp", ".cu")


def message(path: str, code: str, name: str, description: str, severity: str = "error") -> str:
    return json.dumps({
        "path": path, "line": None, "char": None, "code": code, "severity": severity,
        "name": name, "original": None, "replacement": None, "description": description,
    })  # fmt: skip


def changed_lines(overlay: Path, base: str, path: str) -> list[str]:
    """``--lines=a:b`` arguments for the lines the series adds to ``path``."""
    diff = git("diff", "-U0", base, "HEAD", "--", path, cwd=overlay)
    ranges = []
    for start, count in re.findall(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        count = 1 if count == "" else int(count)
        if count:
            ranges.append(f"--lines={start}:{int(start) + count - 1}")
    return ranges


def lint(repo: Path, clang_format: str) -> list[str]:
    try:
        pin = read_pin(repo)
        # A source-only patch has no base file here, so clang-format cannot see the code
        # around its lines; format such a patch against the checkout's file.
        names = overlay_series(repo, pin)
        with tempfile.TemporaryDirectory() as scratch:
            overlay = Path(scratch) / "overlay"
            overlay_repo.build(repo, overlay, pin, installed_torch())
            return format_messages(overlay, names, clang_format)
    except OverlayError as error:
        text = str(error)
        culprit = next((n for n in read_series(repo) if text.startswith(n)), "series")
        return [message(f"patches/{culprit}", "PATCHAPPLY", "does-not-apply", text)]


def format_messages(overlay: Path, names: list[str], clang_format: str) -> list[str]:
    base = overlay_repo.base_commit(overlay)
    messages = []
    for commit, name in zip(overlay_repo.commits(overlay), names, strict=True):
        for path in commit.files:
            if not path.endswith(CPP_SUFFIXES) or not (overlay / path).exists():
                continue
            lines = changed_lines(overlay, base, path)
            if not lines:
                continue
            style = f"-style=file:{Path(__file__).resolve().parents[1] / '.clang-format'}"
            proc = subprocess.run([clang_format, style, *lines, path], cwd=overlay,
                                  capture_output=True, text=True)  # fmt: skip
            original = (overlay / path).read_text()
            if proc.returncode or proc.stdout != original:
                diff = subprocess.run(["diff", "-u", path, "-"], cwd=overlay, input=proc.stdout,
                                      capture_output=True, text=True).stdout  # fmt: skip
                messages.append(message(
                    f"patches/{name}", "CLANGFORMAT", "format",
                    f"{path}: lines changed by this patch are not clang-formatted; reformat "
                    f"them in torch_overlay/ and export:\n{diff or proc.stderr}",
                ))  # fmt: skip
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, fromfile_prefix_chars="@")
    parser.add_argument("--clang-format", default="clang-format")
    parser.add_argument("paths", nargs="*", help="ignored: the series is checked as a whole")
    args = parser.parse_args()
    for line in lint(find_repo(), args.clang_format):
        print(line)
    sys.exit(0)


if __name__ == "__main__":
    main()
