"""`torch-overlay upstream-test --fetch`: fill the cache ``.upstream-tests/`` with upstream's
test files at the pinned base commit, so the gate runs without a PyTorch checkout.

Every test file ``patches/upstream.json`` maps, and the test-local modules they import (found
with ``ast``: ``from model_registry import …`` next to the file, ``functorch.common_utils``
under ``test/``), are read at ``git_version`` of ``patches/base.json``, from
``BASE/<commit>/<path>`` (``--from BASE``, default upstream's raw file endpoint; a mirror or a
static server with that layout works the same) or from a checkout's objects (``git cat-file``
in ``--pytorch-src``).

There is no trusted hash for upstream's files at that commit, so each download is checked
with what can be checked: the HTTP status, Content-Length against the bytes received, that
the file parses as Python, and the sha256 that the current cache's manifest or ``--expect
FILE`` records for the same repository, commit and path (a commit's files never change, so
other bytes are refused; a cache manifest of the first format names no repository and is not
used). Everything is read and checked first, then written to a scratch
directory beside the cache and swapped in: a refusal leaves the cache as it was.

A machine that reaches neither GitHub nor a checkout (this project's own build machines) can
write copies of the files *at the base commit*, verbatim, as ``DIR/<commit>/<path>``, serve
DIR with ``python -m http.server`` on 127.0.0.1 and fetch ``--from`` it: they are checked like
any download. Never put another commit's version there: the manifest records the base commit.
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from tools.base import OverlayError, git_bytes, read_pin, read_upstream_map, sha256
from tools.upstream_test import CACHE_DIR, MANIFEST, UPSTREAM_REPO, read_manifest

DEFAULT_BASE = f"https://raw.githubusercontent.com/{UPSTREAM_REPO}"
# The import scan follows modules of modules; these bound it (the mapped files need about 40).
MAX_FILES, MAX_LOOKUPS = 200, 1000
TIMEOUT = 60  # seconds per request


class HttpSource:
    """Files at ``BASE/<commit>/<path>``."""

    def __init__(self, base: str, commit: str):
        owner = re.match(r"https?://raw\.githubusercontent\.com/([^/]+/[^/]+)/?$", base)
        if owner and owner.group(1).lower() != UPSTREAM_REPO:
            # A fork's files are not upstream's gate, and running them runs a stranger's code.
            raise OverlayError(f"--from {base}: only {UPSTREAM_REPO}'s files are fetched")
        self.base, self.commit = base.rstrip("/"), commit

    def describe(self, path: str) -> str:
        return f"{self.base}/{self.commit}/{path}"

    def read(self, path: str) -> bytes | None:
        """The file's bytes, or None when the server has no such file (404)."""
        url = self.describe(path)
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                expected = response.headers.get("Content-Length")
                try:
                    data = response.read()
                except http.client.IncompleteRead as error:
                    data = error.partial
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise OverlayError(f"{url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError) as error:
            raise OverlayError(f"{url}: {getattr(error, 'reason', error)}") from None
        if expected is not None and int(expected) != len(data):
            raise OverlayError(f"{url}: truncated: {len(data)} of {expected} bytes received")
        return data


class GitSource:
    """Files at ``<commit>:<path>`` in a checkout's objects."""

    def __init__(self, checkout: Path, commit: str):
        self.checkout, self.commit = checkout, commit
        found = git_bytes("cat-file", "-t", commit, cwd=checkout, check=False).strip()
        if found != b"commit":
            raise OverlayError(f"{checkout} does not have the base commit {commit[:12]} "
                               f"(git fetch origin {commit})")  # fmt: skip

    def describe(self, path: str) -> str:
        return f"{self.checkout} {self.commit[:12]}:{path}"

    def read(self, path: str) -> bytes | None:
        spec = f"{self.commit}:{path}"
        if git_bytes("cat-file", "-t", spec, cwd=self.checkout, check=False).strip() != b"blob":
            return None
        return git_bytes("cat-file", "blob", spec, cwd=self.checkout)


def local_imports(path: str, data: bytes) -> list[list[str]]:
    """For each module the file imports, the paths where a test-local copy would be, in the
    order Python would find it: beside the file (pytest puts its directory first on
    sys.path), then under ``test/``. torch and the standard library are never test-local."""
    tree = ast.parse(data, filename=path)
    here = PurePosixPath(path).parent
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:  # from . import x / from .x import y
            base = here.parents[node.level - 2] if node.level > 1 else here
            if node.module:
                modules = [(node.module, base)]
            else:
                modules = [(alias.name, base) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [(node.module, None)]
        else:
            continue
        for name, relative_to in modules:
            top = name.split(".")[0]
            if relative_to is None and (top == "torch" or top in sys.stdlib_module_names):
                continue
            file = name.replace(".", "/") + ".py"
            roots = [relative_to] if relative_to is not None else [here, PurePosixPath("test")]
            candidates = [str(root / file) for root in roots]
            found.append([c for c in dict.fromkeys(candidates) if c.startswith("test/")])
    return [c for c in found if c]


def expected_hashes(*manifests: Path) -> dict[tuple[str, str, str], str]:
    """(repo, commit, path) -> sha256 from manifests that exist and can be read."""
    expected = {}
    for path in manifests:
        for entry in read_manifest(path).values():
            expected[entry["repo"], entry["commit"], entry["path"]] = entry["sha256"]
    return expected


def fetch(
    repo: Path, *, base: str | None = None, pytorch_src: Path | None = None,
    expect: Path | None = None,
) -> str:  # fmt: skip
    """Fill the cache; returns a one-line summary. Refuses, changing nothing, on any bad file."""
    commit = read_pin(repo).git_version
    if base and pytorch_src:
        raise OverlayError("give --from or --pytorch-src, not both")
    source = (
        GitSource(pytorch_src, commit) if pytorch_src else HttpSource(base or DEFAULT_BASE, commit)
    )
    cache = repo / CACHE_DIR
    if expect is not None and not expect.is_file():
        raise OverlayError(f"--expect {expect}: no such file")
    known = [expect] if expect else []
    try:  # the current cache's record, if it is one this version can read
        expected = expected_hashes(
            *known, *([cache / MANIFEST] if (cache / MANIFEST).is_file() else [])
        )
    except OverlayError:
        expected = expected_hashes(*known)

    upstream = read_upstream_map(repo)
    wanted = sorted({f for tests in upstream.tests.values() for f in tests})
    files = read_files(source, wanted, commit, expected)
    lines = [json.dumps({"repo": UPSTREAM_REPO, "commit": commit, "path": path,
                         "bytes": len(data), "sha256": sha256(data)})
             for path, data in sorted(files.items())]  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix=f"{CACHE_DIR}.", dir=repo))
    try:
        for path, data in files.items():
            (scratch / path).parent.mkdir(parents=True, exist_ok=True)
            (scratch / path).write_bytes(data)
        (scratch / MANIFEST).write_text("\n".join(lines) + "\n")
        swap_in(scratch, cache)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    siblings = len(files) - len(wanted)
    return (f"{CACHE_DIR}/: {len(wanted)} mapped test file(s) and {siblings} module(s) they "
            f"import, {UPSTREAM_REPO}@{commit[:12]}, from {source.describe('')}")  # fmt: skip


def read_files(
    source: HttpSource | GitSource, wanted: list[str], commit: str,
    expected: dict[tuple[str, str, str], str],
) -> dict[str, bytes]:  # fmt: skip
    """The mapped files and, following their imports, the test-local modules, all checked."""
    files: dict[str, bytes] = {}
    looked_up: set[str] = set()
    queue = [[path] for path in wanted]
    while queue:
        candidates = queue.pop(0)
        if any(c in files for c in candidates):
            continue
        for path in candidates:
            if path in looked_up:
                continue
            looked_up.add(path)
            if len(looked_up) > MAX_LOOKUPS or len(files) >= MAX_FILES:
                raise OverlayError(f"more than {MAX_FILES} files or {MAX_LOOKUPS} lookups: "
                                   "the import scan is bounded")  # fmt: skip
            data = source.read(path)
            if data is None:
                if path in wanted:  # a mapped file must exist; a guessed module may not
                    raise OverlayError(f"{source.describe(path)}: not found")
                continue
            try:
                queue += local_imports(path, data)
            except (SyntaxError, ValueError) as error:
                raise OverlayError(
                    f"{source.describe(path)}: not a Python file ({error})"
                ) from None
            key = (UPSTREAM_REPO, commit, path)
            if key in expected and sha256(data) != expected[key]:
                raise OverlayError(
                    f"{source.describe(path)}: wrong hash: sha256 {sha256(data)[:16]}…, the "
                    f"manifest records {expected[key][:16]}… for the same commit"
                )
            files[path] = data
            break
    return files


def swap_in(new: Path, target: Path) -> None:
    """Replace ``target`` with ``new``: two renames on one filesystem, the old tree restored if
    the second fails, so the cache is never a mix of both."""
    old = new.with_name(new.name + ".old")
    if target.exists():
        os.rename(target, old)
    try:
        os.rename(new, target)
    except OSError:
        if old.exists():
            os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
