"""The pinned base and the helpers every verb shares.

The base record (``patches/base.json``) pins the torch release, its upstream git sha and the
sha256 of every upstream file a patch touches. Base files are read from the installed wheel:
``.py`` files from ``site-packages/torch``, C++ headers from ``site-packages/torch/include``
(placed at their source paths, e.g. ``torch/csrc/autograd/utils/grad_layout_contract.h``).

A file the wheel does not ship (a ``.cpp`` source) is listed under ``source_only`` instead,
with where its patch's context lines come from. A patch that changes only such files is a
source-only patch: it lives in ``patches/`` alone (the overlay repository cannot hold a base
it does not have), it is always held back on a wheel, and ``build`` / ``stack`` apply it to
the PyTorch checkout's own copy of the file with ``git apply --3way``, which applies by
context when the checkout lacks the recorded preimage.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PIN_FILE = Path("patches/base.json")
UPSTREAM_MAP_FILE = Path("patches/upstream.json")
SERIES_FILE = Path("patches/series")
SERIES_HEADER = (
    "# One patch file per upstream PR, applied in this order (torch-overlay export writes it).\n"
)
OVERLAY_DIR = "torch_overlay"
PATCH_GLOB = "*.patch"

# Fixed identity and dates so the overlay's commits (and so the exported patches) are
# reproducible on every machine.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "torch-overlay",
    "GIT_AUTHOR_EMAIL": "torch-overlay@localhost",
    "GIT_COMMITTER_NAME": "torch-overlay",
    "GIT_COMMITTER_EMAIL": "torch-overlay@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# An author that is nobody: upstream's CLA check fails on it and the PR shows a fake author.
# The overlay's own identity above means "no author yet": build and stack give such a
# patch the checkout's git identity, dated when they commit it.
PLACEHOLDER_IDENTITY = re.compile(
    r"localhost|\.example\b|@example\.(?:com|org|net)\b|\bmaintainers\b|torch[-_]overlay",
    re.I,
)
UNASSIGNED_AUTHOR = f"{GIT_ENV['GIT_AUTHOR_NAME']} <{GIT_ENV['GIT_AUTHOR_EMAIL']}>"
UNASSIGNED_DATE = GIT_ENV["GIT_AUTHOR_DATE"][:10]  # a commit date that means "no date yet"
# User-level git settings that would change generated patch text.
GIT_CONFIG = [
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicprefix=false",
    "-c", "diff.relative=false",
    "-c", "diff.algorithm=myers",
    "-c", "format.signature=",
    "-c", "core.autocrlf=false",
    "-c", "commit.gpgsign=false",
]  # fmt: skip

# Source-tree prefixes of C++ headers and where the wheel keeps them.
HEADER_ROOTS = {
    "torch/csrc/": "torch/include/torch/csrc/",
    "c10/": "torch/include/c10/",
    "aten/src/ATen/": "torch/include/ATen/",
}
PYTHON_SUFFIXES = (".py", ".pyi")


class OverlayError(Exception):
    """A refusal: reported as one clear message; nothing was changed."""


@dataclass(frozen=True)
class Pin:
    version: str
    git_version: str
    files: dict[str, str]  # source path -> sha256 of the upstream file
    # source path of a file the wheel does not ship -> where its patch's context comes from
    source_only: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InstalledTorch:
    version: str
    git_version: str
    site: Path  # the directory that contains the ``torch`` package


def read_pin(repo: Path) -> Pin:
    path = repo / PIN_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise OverlayError(f"no base record at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise OverlayError(f"{PIN_FILE} is not valid JSON: {error}") from None
    try:
        return Pin(
            str(data["torch_version"]),
            str(data["git_version"]),
            {str(k): str(v) for k, v in dict(data["files"]).items()},
            {str(k): str(v) for k, v in dict(data.get("source_only", {})).items()},
        )
    except KeyError as error:
        raise OverlayError(f"{PIN_FILE} has no {error.args[0]!r} key") from None
    except (TypeError, ValueError, AttributeError):
        raise OverlayError(
            f"{PIN_FILE} should be an object with torch_version, git_version and files "
            "(source path -> sha256)"
        ) from None


def write_pin(repo: Path, pin: Pin) -> None:
    data = {
        "torch_version": pin.version,
        "git_version": pin.git_version,
        "files": dict(sorted(pin.files.items())),
    }
    if pin.source_only:
        data["source_only"] = dict(sorted(pin.source_only.items()))
    (repo / PIN_FILE).write_text(json.dumps(data, indent=2) + "\n")


def patch_message(text: bytes) -> tuple[str, str]:
    """Subject (without ``[PATCH]``) and body of a ``git format-patch`` file."""
    message = email.message_from_bytes(text, policy=email.policy.default)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(message["Subject"]))
    body = message.get_payload(decode=True).decode()
    return subject, body.split("\n---\n", 1)[0]


def patch_paths(text: bytes) -> list[str]:
    """The files a ``git format-patch`` file changes."""
    return re.findall(r"^diff --git a/(\S+) b/", text.decode(errors="replace"), re.M)


def is_source_only(pin: Pin, text: bytes) -> bool:
    """Whether the patch changes only files the wheel does not ship (see the module doc).
    A patch that mixes such files with wheel files is refused: split it."""
    paths = patch_paths(text)
    outside = [p for p in paths if p in pin.source_only]
    if outside and len(outside) != len(paths):
        raise OverlayError(
            f"a patch changes both files the wheel ships and files it does not "
            f"({', '.join(outside)}); split it into two patches"
        )
    return bool(outside)


# A patch that only stands in, on a wheel, for a fix that needs a source build carries this
# trailer, naming the subject of the patch that replaces it; build and stack leave it out.
WHEEL_STOPGAP_TRAILER = "Wheel-Stopgap"


def wheel_stopgap(text: bytes) -> str:
    """The subject a wheel stopgap patch names in its trailer, or "" for any other patch."""
    return patch_field(text, WHEEL_STOPGAP_TRAILER)


# A patch message is the upstream PR text, then (optionally) a section for this project only:
# from a line reading exactly NOTES_HEADING to the end. It holds the project's evidence
# (stock-vs-overlay figures, which copy of an upstream test file was run) and the trailers
# below; `stack` drops it, so upstream sees only the PR text.
NOTES_HEADING = "Overlay notes:"
# The topic a patch belongs to (patches/topics.json declares the topics); every patch has one.
TOPIC_TRAILER = "Topic"
# A patch this project carries but does not submit upstream, with the reason.
CARRIED_TRAILER = "Carried-Only"
PROJECT_TRAILERS = ("Wheel-Stopgap", "Requires-Source-Build", TOPIC_TRAILER, CARRIED_TRAILER)


def pr_text(message: str) -> str:
    """The part of a commit message that upstream receives: everything before the
    NOTES_HEADING line, without any project trailer line."""
    text = re.split(rf"^{re.escape(NOTES_HEADING)}[ \t]*$", message, maxsplit=1, flags=re.M)[0]
    trailers = "|".join(map(re.escape, PROJECT_TRAILERS))
    text = re.sub(rf"^(?:{trailers}):.*\n?", "", text, flags=re.M)
    return text.rstrip() + "\n"


def message_field(message: str, key: str) -> str:
    """The value of a ``Key: value`` line anywhere in a message ("" when absent). Read as a
    plain line: git's trailer parsing only looks at the last paragraph."""
    found = re.search(rf"^{re.escape(key)}:[ \t]*(.+)$", message, re.M)
    return found.group(1).strip() if found else ""


def patch_field(text: bytes, key: str) -> str:
    """``message_field`` of a ``git format-patch`` file's message."""
    return message_field(text.decode(errors="replace").split("\n---\n", 1)[0], key)


def read_patch(repo: Path, name: str) -> bytes:
    """A patch file of the series, refused (one line) when missing or not UTF-8."""
    try:
        text = (repo / "patches" / name).read_bytes()
    except FileNotFoundError:
        raise OverlayError(f"{SERIES_FILE} names {name}, which does not exist") from None
    try:
        text.decode()
    except UnicodeDecodeError as error:
        line = text[: error.start].count(b"\n") + 1
        raise OverlayError(
            f"patches/{name} line {line}: {text[error.start : error.end]!r} is not UTF-8 "
            "(git format-patch writes UTF-8; fix the encoding or re-export the patch)"
        ) from None
    return text


def series_subjects(repo: Path) -> dict[str, str]:
    """Patch file name -> subject, in series order."""
    return {name: patch_message(read_patch(repo, name))[0] for name in read_series(repo)}


def wheel_stopgaps(repo: Path) -> dict[str, str]:
    """The series' wheel stopgaps: patch file name -> subject of the patch that replaces it."""
    found = {name: wheel_stopgap(read_patch(repo, name)) for name in read_series(repo)}
    return {name: replaced_by for name, replaced_by in found.items() if replaced_by}


def overlay_series(repo: Path, pin: Pin) -> list[str]:
    """The patches the overlay repository holds, in order: all but the source-only ones."""
    return [name for name in read_series(repo) if not is_source_only(pin, read_patch(repo, name))]


def source_only_series(repo: Path, pin: Pin) -> list[str]:
    """The source-only patches of the series, in series order."""
    return [name for name in read_series(repo) if is_source_only(pin, read_patch(repo, name))]


@dataclass(frozen=True)
class UpstreamMap:
    """``patches/upstream.json``: where upstream already tests what the series touches."""

    tests: dict[str, list[str]]  # touched source path -> upstream test files
    select: dict[str, str]  # upstream test file -> pytest -k expression
    # patch file name without its number (``patch_slug``) -> upstream issues it fixes; the
    # number changes whenever a patch is inserted before it, the rest of the name does not
    issues: dict[str, list[int]]

    def issues_of(self, name: str) -> list[int]:
        return self.issues.get(patch_slug(name), [])


def patch_slug(name: str) -> str:
    """A patch file name without its series number: ``0007-DTensor-x.patch`` -> ``DTensor-x.patch``."""
    return re.sub(r"^\d{4}-", "", name)


def read_upstream_map(repo: Path) -> UpstreamMap:
    """The upstream map; a missing file maps nothing (``check`` then names every touched
    file)."""
    path = repo / UPSTREAM_MAP_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return UpstreamMap({}, {}, {})
    except json.JSONDecodeError as error:
        raise OverlayError(f"{path} is not valid JSON: {error}") from None
    return UpstreamMap(
        tests={source: list(files) for source, files in data.get("tests", {}).items()},
        select=dict(data.get("select", {})),
        issues={
            patch_slug(name): [int(n) for n in numbers]
            for name, numbers in data.get("issues", {}).items()
        },
    )


def read_series(repo: Path) -> list[str]:
    """Patch file names in order; blank lines and ``#`` comments are ignored. A name given
    twice or naming no file is refused here, so that no verb trips over it later."""
    path = repo / SERIES_FILE
    if not path.exists():
        raise OverlayError(f"no series file at {path}")
    first_line: dict[str, int] = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if name in first_line:
            raise OverlayError(
                f"{SERIES_FILE} line {number} names {name} again (first on line "
                f"{first_line[name]}); remove one of them"
            )
        if not (repo / "patches" / name).is_file():
            raise OverlayError(
                f"{SERIES_FILE} line {number} names {name}, which does not exist "
                "(restore the file or remove the line)"
            )
        first_line[name] = number
    return list(first_line)


def installed_torch() -> InstalledTorch:
    """Read the installed torch's version without importing it (importing costs seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise OverlayError("torch is not installed in this Python environment")
    package = Path(spec.origin).parent
    text = (package / "version.py").read_text()
    fields = dict(re.findall(r"^(__version__|git_version)\s*=\s*'([^']*)'", text, re.M))
    return InstalledTorch(fields["__version__"], fields["git_version"], package.parent)


def check_installed(pin: Pin, torch: InstalledTorch) -> None:
    public = torch.version.split("+", 1)[0]
    if public != pin.version or torch.git_version != pin.git_version:
        raise OverlayError(
            f"installed torch is {torch.version} (git {torch.git_version[:12]}), but the series "
            f"is pinned to torch {pin.version} (git {pin.git_version[:12]}); "
            f"install it with: {pip_install(pin, force=public == pin.version)}"
        )


def pip_install(pin: Pin, force: bool = True) -> str:
    """The command that installs the pinned release into this Python, as written. Plain
    ``pip install torch==X`` is a no-op when X is installed, so a drifted file needs
    ``--force-reinstall`` (``--no-deps``: the dependencies are not what drifted)."""
    flags = " --force-reinstall --no-deps" if force else ""
    return f"{shlex.quote(sys.executable)} -m pip install{flags} torch=={pin.version}"


def drifted_files(pin: Pin, torch: InstalledTorch) -> list[tuple[str, str, str]]:
    """(source path, sha256 in base.json, sha256 in the wheel or "missing") for every base
    file of the wheel that differs from the base record."""
    found = []
    for path, expected in sorted(pin.files.items()):
        try:
            actual = sha256(wheel_file(torch, path).read_bytes())
        except FileNotFoundError:
            actual = "missing"
        except OverlayError:  # not a file a wheel ships: check reports it
            continue
        if actual != expected:
            found.append((path, expected, actual))
    return found


def wheel_file(torch: InstalledTorch, source_path: str) -> Path:
    """Where the wheel keeps the upstream file that lives at ``source_path`` in the repo."""
    if source_path.endswith(PYTHON_SUFFIXES) and source_path.startswith("torch/"):
        return torch.site / source_path
    for source_root, wheel_root in HEADER_ROOTS.items():
        if source_path.startswith(source_root) and source_path.endswith((".h", ".hpp", ".cuh")):
            return torch.site / wheel_root / source_path[len(source_root) :]
    raise OverlayError(
        f"{source_path}: the wheel does not ship this file (only torch/**/*.py and C++ headers "
        "are taken from it)"
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_base_file(pin: Pin, torch: InstalledTorch, source_path: str) -> bytes:
    """The upstream file from the wheel, refused if it drifted from the recorded sha256."""
    path = wheel_file(torch, source_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise OverlayError(f"base file {source_path} is missing from the wheel ({path})") from None
    expected = pin.files.get(source_path)
    if expected is not None and sha256(data) != expected:
        raise OverlayError(
            f"base file {source_path} drifted: {path} has sha256 {sha256(data)[:16]}…, "
            f"the base record says {expected[:16]}…; reinstall it: {pip_install(pin)}"
        )
    return data


def git(
    *args: str,
    cwd: Path,
    check: bool = True,
    env: dict[str, str] | None = None,
    fixed_identity: bool = True,
) -> str:
    return git_bytes(*args, cwd=cwd, check=check, env=env, fixed_identity=fixed_identity).decode(
        errors="replace"
    )


def git_bytes(
    *args: str,
    cwd: Path,
    check: bool = True,
    env: dict[str, str] | None = None,
    fixed_identity: bool = True,
) -> bytes:
    """Run git; ``fixed_identity`` uses the overlay's reproducible identity and dates (off for
    commits in a user's own checkout)."""
    proc = subprocess.run(
        ["git", *GIT_CONFIG, *args],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, **(GIT_ENV if fixed_identity else {}), **(env or {})},
    )
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise OverlayError(f"git {' '.join(args)} failed in {cwd}:\n{message}")
    return proc.stdout


def find_repo(start: Path | None = None) -> Path:
    """The project root: the nearest directory upwards that holds ``patches/base.json``."""
    here = (start or Path.cwd()).resolve()
    for candidate in [here, *here.parents]:
        if (candidate / PIN_FILE).exists():
            return candidate
    raise OverlayError(f"no {PIN_FILE} in {here} or any parent; run from the project checkout")
