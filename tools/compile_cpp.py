"""`torch-overlay compile-cpp`: every C++ file a patch changes, compiled before and after the
patch against the installed wheel's headers, with the flags a torch extension uses.

A syntax and type check (``c++ -fsyntax-only``), not a build: nothing is linked or run.

- A header the wheel ships (``torch/include/...``): the translation unit is a small ``.cpp``
  that includes the header and takes the address of each inline function it defines at
  namespace scope; the header (the wheel's, then with the patch applied) is placed first on
  the include path.
- A source file the wheel does not ship (``source_only`` in ``patches/base.json``): the
  translation unit is the upstream file itself, and then the file with the patch applied
  (``git apply``). Its upstream copy comes from ``--pytorch-src DIR`` (``git show
  <base commit>:<path>``) or from the git-ignored cache ``.upstream-src/``, filled by
  ``--fetch`` (``--from BASE``, like ``upstream-test --fetch``) or by ``--add`` (a copy taken
  elsewhere, recorded with the repository and commit it came from). Without one the file is
  reported as not compiled, with how to get it.

A patch is applied to the file as the patches before it left it. Errors of the file before
the patch (a copy from another commit than the wheel's, headers the wheel does not ship) are
version skew and reported as such; only errors the patch adds count against it. Errors are
matched by file, message and the text of the offending line, so a patch that shifts lines
does not make old errors new. A header the wheel lacks (``fatal error: X: No such file``) is
replaced by an empty stub and named, so the rest of the file is still checked.

``.upstream-src/manifest.jsonl`` holds one JSON object per line: ``repo``, ``commit``,
``path`` (the source path, e.g. ``torch/csrc/autograd/python_variable.cpp``), ``bytes`` and
``sha256``; every file is checked against it before use. Upstream code is never committed.

Run as ``python -m tools.compile_cpp @PATHSFILE`` it is the lintrunner adapter CPPCOMPILE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath

from tools.base import (
    HEADER_ROOTS,
    OverlayError,
    check_installed,
    find_repo,
    installed_torch,
    patch_paths,
    read_base_file,
    read_pin,
    read_series,
    sha256,
)
from tools.fetch_upstream_tests import DEFAULT_BASE, GitSource, HttpSource, swap_in

CACHE_DIR = ".upstream-src"
MANIFEST = "manifest.jsonl"
UPSTREAM_REPO = "pytorch/pytorch"
HEADER_SUFFIXES = (".h", ".hpp", ".cuh")
CPP_SUFFIXES = (*HEADER_SUFFIXES, ".cpp", ".cc")
# The wheel's libtorch_python is built with these; the files test them with #ifdef.
SOURCE_DEFINES = ("-DUSE_DISTRIBUTED", "-DUSE_C10D")
MAX_STUBS = 20
DIAGNOSTIC = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)$"
)
MISSING_HEADER = re.compile(r"fatal error: (?P<header>[^:\s]+): No such file or directory")


def fetch_hint(commit: str) -> str:
    return (f"fetch it with `torch-overlay compile-cpp --fetch` (or --fetch --from BASE), "
            f"or give --pytorch-src DIR (a checkout with {commit[:12]})")  # fmt: skip


@dataclass(frozen=True)
class Copy:
    data: bytes
    origin: str  # e.g. "pytorch/pytorch@d0f2af8b66b2" or "the wheel (torch 2.15.0)"
    skew: str = ""  # why errors of this copy are not the patch's, when it is not the base


@dataclass(frozen=True)
class Diagnostic:
    file: str  # the source path (or the header's path) the error is in
    line: int
    message: str
    text: str  # the offending line, stripped: errors are matched on it, not on the line number

    def key(self) -> tuple[str, str, str]:
        return self.file, self.message, self.text

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: error: {self.message}"


@dataclass
class Compiled:
    errors: list[Diagnostic]
    stubs: list[str]  # headers the wheel lacks, replaced by empty files
    seconds: float


@dataclass
class Result:
    patch: str
    path: str
    origin: str = ""
    skew: str = ""
    before: Compiled | None = None
    after: Compiled | None = None
    not_compiled: str = ""  # why, when the file could not be compiled
    new_errors: list[Diagnostic] = field(default_factory=list)

    def lines(self) -> list[str]:
        head = f"{self.patch}: {self.path}"
        if self.not_compiled:
            return [f"{head}: not compiled: {self.not_compiled}"]
        assert self.before and self.after
        out = [f"{head} (base: {self.origin})"]
        if self.before.errors:
            first = self.before.errors[0]
            out.append(f"  without the patch: {len(self.before.errors)} error(s), version skew "
                       f"({self.skew}), not the patch's; first: {first}")  # fmt: skip
        else:
            out.append("  without the patch: compiles")
        if self.before.stubs:
            out.append(
                f"  headers the wheel does not ship, stubbed: {', '.join(self.before.stubs)}"
            )
        added = [s for s in self.after.stubs if s not in self.before.stubs]
        if added:
            out.append(f"  the patch includes headers the wheel does not ship: {', '.join(added)}")
        if self.new_errors:
            out.append(f"  with the patch: {len(self.new_errors)} new error(s):")
            out += [f"    {d}" for d in self.new_errors]
        else:
            old = len(self.after.errors)
            out.append("  with the patch: compiles" if not old else
                       f"  with the patch: no new errors ({old} of the base remain)")  # fmt: skip
        out.append(f"  time: {self.before.seconds:.1f} s without, {self.after.seconds:.1f} s with")
        return out


# -- the upstream copies ---------------------------------------------------------------------


def read_cache(repo: Path) -> dict[str, dict]:
    """The cache's entries by source path, each file checked against its line; {} without a
    cache. A bad line or a changed file is refused."""
    root = repo / CACHE_DIR
    if not (root / MANIFEST).is_file():
        return {}
    refetch = "re-fetch with `torch-overlay compile-cpp --fetch`"
    entries = {}
    for number, line in enumerate((root / MANIFEST).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            parts = PurePosixPath(entry["path"]).parts
            ok = (re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repo"])
                  and re.fullmatch(r"[0-9a-f]{40}", entry["commit"])
                  and parts and ".." not in parts and not entry["path"].startswith("/")
                  and type(entry["bytes"]) is int and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise OverlayError(f"{root / MANIFEST}:{number}: not an entry (repo, commit, path, "
                               f"bytes, sha256); {refetch}")  # fmt: skip
        file = root / entry["path"]
        if not file.is_file():
            raise OverlayError(f"{root}: {entry['path']} is in {MANIFEST} but missing; {refetch}")
        data = file.read_bytes()
        if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
            raise OverlayError(
                f"{root}: {entry['path']} differs from its {MANIFEST} entry; {refetch}"
            )
        entries[entry["path"]] = entry
    return entries


def recorded_preimage(description: str) -> str:
    """The sha256 that ``base.json``'s source_only text records for the patch's preimage."""
    found = re.search(r"sha256 ([0-9a-f]{64})", description)
    return found.group(1) if found else ""


def source_copy(repo: Path, path: str, commit: str, description: str,
                pytorch_src: Path | None) -> Copy | None:  # fmt: skip
    """The upstream copy of a file the wheel does not ship, or None when there is none."""
    if pytorch_src is not None:
        data = GitSource(pytorch_src, commit).read(path)
        if data is None:
            raise OverlayError(f"{pytorch_src} has no {path} at {commit[:12]}")
        return Copy(data, f"{pytorch_src} at {commit[:12]}")
    entry = read_cache(repo).get(path)
    if entry is None:
        return None
    data = (repo / CACHE_DIR / entry["path"]).read_bytes()
    origin = f"{entry['repo']}@{entry['commit'][:12]}"
    if entry["repo"] == UPSTREAM_REPO and entry["commit"] == commit:
        return Copy(data, origin)
    preimage = (
        " (the patch's recorded preimage)" if sha256(data) == recorded_preimage(description) else ""
    )
    return Copy(data, f"{origin}{preimage}, not {UPSTREAM_REPO}@{commit[:12]}",
                f"{origin} is another commit than the wheel's headers")  # fmt: skip


def fetch(repo: Path, *, base: str | None = None, pytorch_src: Path | None = None) -> str:
    """Fill the cache with every source-only file at the base commit; refuses, changing
    nothing, when one is missing."""
    pin = read_pin(repo)
    if base and pytorch_src:
        raise OverlayError("give --from or --pytorch-src, not both")
    source = (GitSource(pytorch_src, pin.git_version) if pytorch_src
              else HttpSource(base or DEFAULT_BASE, pin.git_version))  # fmt: skip
    files = {}
    for path in sorted(pin.source_only):
        data = source.read(path)
        if data is None:
            raise OverlayError(f"{source.describe(path)}: not found")
        files[path] = (UPSTREAM_REPO, pin.git_version, data)
    write_cache(repo, files)
    return f"{CACHE_DIR}/: {len(files)} file(s), {UPSTREAM_REPO}@{pin.git_version[:12]}, from {source.describe('')}"


def add(repo: Path, path: str, file: Path, origin: str) -> str:
    """Record a copy of ``path`` taken elsewhere, with the ``OWNER/NAME@COMMIT`` it is from."""
    found = re.fullmatch(r"([\w.-]+/[\w.-]+)@([0-9a-f]{40})", origin)
    if not found:
        raise OverlayError(f"--origin {origin}: give OWNER/NAME@COMMIT (40 hex digits)")
    if path not in read_pin(repo).source_only:
        raise OverlayError(f"{path} is not a source-only file of patches/base.json")
    if not file.is_file():
        raise OverlayError(f"{file}: no such file")
    files = {p: (e["repo"], e["commit"], (repo / CACHE_DIR / p).read_bytes())
             for p, e in read_cache(repo).items()}  # fmt: skip
    files[path] = (found.group(1), found.group(2), file.read_bytes())
    write_cache(repo, files)
    return f"{CACHE_DIR}/: {path} from {origin}"


def write_cache(repo: Path, files: dict[str, tuple[str, str, bytes]]) -> None:
    lines = [json.dumps({"repo": r, "commit": c, "path": p, "bytes": len(d), "sha256": sha256(d)})
             for p, (r, c, d) in sorted(files.items())]  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix=f"{CACHE_DIR}.", dir=repo))
    try:
        for path, (_, _, data) in files.items():
            (scratch / path).parent.mkdir(parents=True, exist_ok=True)
            (scratch / path).write_bytes(data)
        (scratch / MANIFEST).write_text("\n".join(lines) + "\n")
        swap_in(scratch, repo / CACHE_DIR)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- compiling -------------------------------------------------------------------------------


@cache
def extension_flags() -> tuple[str, ...]:
    """The flags torch.utils.cpp_extension gives an extension on this machine (CPU)."""
    import torch
    from torch.utils import cpp_extension

    includes = [
        *cpp_extension.include_paths("cpu"),
        sysconfig.get_path("include", scheme="posix_prefix"),
    ]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ("-std=c++20", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-DTORCH_API_INCLUDE_EXTENSION_H", *(f"-isystem{p}" for p in includes))  # fmt: skip


def include_name(path: str) -> str:
    """How code includes a header at source path ``path`` (the wheel's layout)."""
    for source_root, wheel_root in HEADER_ROOTS.items():
        if path.startswith(source_root):
            return wheel_root.removeprefix("torch/include/") + path[len(source_root) :]
    return path


def header_unit(path: str, base: bytes) -> str:
    """A translation unit that includes the header and takes the address of every inline
    function the base header defines once at namespace scope (the same unit before and after
    the patch, so only the patch differs)."""
    text = base.decode(errors="replace")
    namespace = re.search(r"^namespace ([\w:]+) \{", text, re.M)
    names = re.findall(r"^inline\s[^;{(]*?\b(\w+)\(", text, re.M)
    once = [n for n in dict.fromkeys(names) if names.count(n) == 1]
    unit = f"#include <{include_name(path)}>\n"
    if namespace and once:
        refs = "".join(f"    reinterpret_cast<const void*>(&{n}),\n" for n in once)
        unit += (f"namespace {namespace.group(1)} {{\n[[maybe_unused]] static const void* "
                 f"compile_cpp_refs[] = {{\n{refs}}};\n}}\n")  # fmt: skip
    return unit


def compile_unit(root: Path, unit: str, shown: dict[str, str], defines: list[str]) -> Compiled:
    """Compile ``root/unit`` with ``-I root`` first; ``shown`` maps a file under root to the
    path errors are reported at. Headers the wheel lacks are stubbed under root/.stubs."""
    stubs_dir = root / ".stubs"
    stubs: list[str] = []
    command = [os.environ.get("CXX", "c++"), *extension_flags(), *defines, f"-I{root}",
               f"-isystem{stubs_dir}", "-fsyntax-only", "-w", "-fno-diagnostics-show-caret",
               "-fdiagnostics-color=never", unit]  # fmt: skip
    start = time.monotonic()
    while True:
        proc = subprocess.run(command, cwd=root, capture_output=True, text=True)
        missing = MISSING_HEADER.search(proc.stderr)
        if not missing or len(stubs) >= MAX_STUBS or (stubs_dir / missing["header"]).exists():
            break
        (stubs_dir / missing["header"]).parent.mkdir(parents=True, exist_ok=True)
        (stubs_dir / missing["header"]).write_text("")
        stubs.append(missing["header"])
    seconds = time.monotonic() - start
    if proc.returncode != 0 and not any(DIAGNOSTIC.match(x) for x in proc.stderr.splitlines()):
        raise OverlayError(f"{command[0]} failed without a diagnostic: {proc.stderr.strip()[:300]}")
    errors = []
    for line in proc.stderr.splitlines():
        found = DIAGNOSTIC.match(line)
        if not found:
            continue
        file = Path(root, found["file"]).resolve()
        rel = str(file.relative_to(root.resolve())) if file.is_relative_to(root.resolve()) else ""
        lines = file.read_text(errors="replace").splitlines() if file.is_file() else []
        number = int(found["line"])
        text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
        errors.append(Diagnostic(shown.get(rel, str(file)), number, found["msg"], text))
    return Compiled(list(dict.fromkeys(errors)), stubs, seconds)


def apply_patch(path: str, data: bytes, patch: bytes, name: str) -> bytes:
    """``data`` with the patch's hunks for ``path`` applied (git apply, no fuzz)."""
    with tempfile.TemporaryDirectory(prefix="compile-cpp-apply-") as scratch:
        root = Path(scratch)
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        (root / "patch").write_bytes(patch)
        proc = subprocess.run(["git", "apply", f"--include={path}", "patch"], cwd=root,
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise OverlayError(
                f"{name} does not apply to {path}: {proc.stderr.strip().splitlines()[0]}"
            )
        return (root / path).read_bytes()


@cache  # one compile per process for the same text, unit and defines
def compile_file(path: str, content: bytes, base: bytes, defines: tuple[str, ...]) -> Compiled:
    with tempfile.TemporaryDirectory(prefix="compile-cpp-") as scratch:
        root = Path(scratch)
        if path.endswith(HEADER_SUFFIXES):
            placed = include_name(path)
            (root / "unit.cpp").write_text(header_unit(path, base))
            unit = "unit.cpp"
        else:
            placed = unit = path
        (root / placed).parent.mkdir(parents=True, exist_ok=True)
        (root / placed).write_bytes(content)
        return compile_unit(root, unit, {placed: path}, list(defines))


def compile_series(repo: Path, *, pytorch_src: Path | None = None,
                   only: list[str] | None = None) -> list[Result]:  # fmt: skip
    """One result per (patch, C++ file it changes), in series order; ``only`` narrows it to
    those patch file names."""
    pin = read_pin(repo)
    torch = installed_torch()
    check_installed(pin, torch)
    state: dict[str, tuple[Copy, bytes] | str] = {}  # path -> (base copy, current text) or why not
    results = []
    for name in read_series(repo):
        text = (repo / "patches" / name).read_bytes()
        for path in [p for p in patch_paths(text) if p.endswith(CPP_SUFFIXES)]:
            if path not in state:
                if path in pin.source_only:
                    copy = source_copy(
                        repo, path, pin.git_version, pin.source_only[path], pytorch_src
                    )
                    why = f"no copy of {path} at {pin.git_version[:12]}; {fetch_hint(pin.git_version)}"
                else:
                    copy = Copy(
                        read_base_file(pin, torch, path),
                        f"the wheel's header (torch {pin.version})",
                    )
                state[path] = (copy, copy.data) if copy else why
            if isinstance(state[path], str):
                results.append(Result(name, path, not_compiled=state[path]))
                continue
            copy, before = state[path]
            after = apply_patch(path, before, text, name)
            state[path] = (copy, after)
            if only and name not in only:
                continue
            defines = () if path.endswith(HEADER_SUFFIXES) else SOURCE_DEFINES
            compiled = [
                compile_file(path, content, copy.data, defines) for content in (before, after)
            ]
            old = {d.key() for d in compiled[0].errors}
            new = [d for d in compiled[1].errors if d.key() not in old]
            skew = copy.skew or "the base does not compile against the wheel's headers"
            results.append(Result(name, path, copy.origin, skew, *compiled, new_errors=new))
    return [r for r in results if not only or r.patch in only]


def compile_cpp(
    repo: Path, *, pytorch_src: Path | None = None, only: list[str] | None = None
) -> int:
    results = compile_series(repo, pytorch_src=pytorch_src, only=only)
    for result in results:
        print("\n".join(result.lines()))
    if not results:
        print("compile-cpp: no patch changes a C++ file")
    failed = [r for r in results if r.new_errors]
    skipped = [r for r in results if r.not_compiled]
    print(f"compile-cpp: {len(results) - len(skipped)} compiled, {len(skipped)} not compiled, "
          f"{len(failed)} with new errors")  # fmt: skip
    return 1 if failed else 0


# -- lintrunner ------------------------------------------------------------------------------


def lint_messages(repo: Path) -> list[str]:
    """Errors only: a patch that adds a compile error, or a series that cannot be compiled.
    lintrunner fails on any message, advice included, so what is not a finding about the
    patches (a file not compiled here, errors its base copy already has) is said by
    ``compile-cpp`` and by ``check`` (``notes``) instead."""

    def message(path: str, line: int | None, name: str, description: str) -> str:
        return json.dumps({"path": path, "line": line, "char": None, "code": "CPPCOMPILE",
                           "severity": "error", "name": name, "original": None,
                           "replacement": None, "description": description})  # fmt: skip

    try:
        results = compile_series(repo)
    except OverlayError as error:
        return [message("patches/series", None, "refused", str(error))]
    return [message(f"patches/{r.patch}", None, "new-error", str(d))
            for r in results for d in r.new_errors]  # fmt: skip


def notes(repo: Path) -> list[str]:
    """What ``compile-cpp`` cannot check here, found without compiling: each source-only C++
    file a patch changes that has no upstream copy, or only a copy from another commit."""
    pin = read_pin(repo)
    cache = read_cache(repo)
    out = []
    for path in sorted(pin.source_only):
        if not any(path in patch_paths((repo / "patches" / n).read_bytes())
                   for n in read_series(repo)):  # fmt: skip
            continue
        entry = cache.get(path)
        if entry is None:
            out.append(f"compile-cpp: {path} is not compiled here: no copy of it at "
                       f"{pin.git_version[:12]}; {fetch_hint(pin.git_version)}")  # fmt: skip
        elif (entry["repo"], entry["commit"]) != (UPSTREAM_REPO, pin.git_version):
            out.append(f"compile-cpp: {path} is compiled against {entry['repo']}@"
                       f"{entry['commit'][:12]}, not the base commit: errors it has without "
                       "the patch are version skew")  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    # lintrunner passes @PATHSFILE; the check covers the whole series whatever changed.
    del argv
    print("\n".join(lint_messages(find_repo())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
