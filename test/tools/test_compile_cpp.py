# Owner(s): ["module: tools"]
"""`torch-overlay compile-cpp`: the series' C++ files compiled before and after each patch
against the installed wheel's headers.

The header patch compiles for real here (a few seconds each way); a type error put into a
copy of it is reported with the file and line. The source-only patch needs an upstream copy
of python_variable.cpp: without one it is reported as not compiled; with this checkout's
git-ignored cache (.upstream-src/) it is compiled for real (about a minute each way), and
skipped where there is no cache. The cache's fetch, --add and integrity checks run against a
local server and scratch files.
"""

import io
import json
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from test_upstream_test import serve
from torch.testing._internal.common_utils import TestCase, run_tests

from tools.base import OverlayError, installed_torch, read_base_file, read_pin, read_series, sha256
from tools.cli import main
from tools.compile_cpp import (
    CACHE_DIR,
    Compiled,
    Diagnostic,
    Result,
    add,
    apply_patch,
    compile_cpp,
    compile_series,
    fetch,
    lint_messages,
    notes,
    read_cache,
    source_copy,
)

REPO = Path(__file__).resolve().parents[2]
HEADER = "torch/csrc/autograd/utils/grad_layout_contract.h"
SOURCE = "torch/csrc/autograd/python_variable.cpp"
FORK = "anagnorisis2peripeteia/pytorch@4d9bed61dcf0d732dcecbd2295daed0c350ff141"


def cached_source() -> bool:
    try:
        return SOURCE in read_cache(REPO)
    except OverlayError:
        return False


def patch_for(root: Path, path: str) -> str:
    """The first patch of the series that changes ``path`` (two patches change
    python_variable.cpp; the tests break and compile the first)."""
    names = [n for n in read_series(root) if f"b/{path}" in (root / "patches" / n).read_text()]
    return names[0]


def output_of(function, *args, **kwargs) -> tuple[object, str]:
    with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
        returned = function(*args, **kwargs)
    return returned, printed.getvalue()


class CompileCppTest(TestCase):
    def setUp(self):
        super().setUp()
        self.root = Path(tempfile.mkdtemp(prefix="compile-cpp-test-"))
        self.addCleanup(shutil.rmtree, self.root)
        shutil.copytree(REPO / "patches", self.root / "patches")
        self.pin = read_pin(self.root)

    def break_patch(self, path: str, old: str, new: str) -> str:
        """Replace an added line of the patch that changes ``path``; returns the patch name."""
        name = patch_for(self.root, path)
        patch = self.root / "patches" / name
        text = patch.read_text()
        self.assertEqual(text.count(f"\n+{old}\n"), 1)
        patch.write_text(text.replace(f"\n+{old}\n", f"\n+{new}\n"))
        return name

    def test_header_compiles_before_and_after_its_patch(self):
        name = patch_for(self.root, HEADER)
        (result,) = compile_series(self.root, only=[name])
        self.assertEqual((result.patch, result.path, result.not_compiled), (name, HEADER, ""))
        self.assertEqual(result.before.errors, [])
        self.assertEqual(result.after.errors, [])
        self.assertEqual(result.before.stubs + result.after.stubs, [])
        self.assertIn("  with the patch: compiles", result.lines())

    def test_a_type_error_in_a_header_patch_is_reported_with_file_and_line(self):
        bad = "    return at::kStrided;"
        name = self.break_patch(HEADER, "    return at::MemoryFormat::Contiguous;", bad)
        patched = apply_patch(
            HEADER,
            read_base_file(self.pin, installed_torch(), HEADER),
            (self.root / "patches" / name).read_bytes(),
            name,
        )
        line = patched.decode().splitlines().index(bad) + 1
        code, printed = output_of(compile_cpp, self.root, only=[name])
        self.assertEqual(code, 1, printed)
        self.assertIn(f"{name}: {HEADER} (base: the wheel's header (torch 2.15.0))", printed)
        self.assertIn("  without the patch: compiles", printed)
        self.assertIn("  with the patch: 1 new error(s):", printed)
        self.assertRegex(printed, rf"\n    {HEADER}:{line}: error: could not convert .*kStrided")
        self.assertIn("compile-cpp: 1 compiled, 0 not compiled, 1 with new errors", printed)

    def test_without_a_copy_of_a_source_file_it_is_not_compiled_and_says_how_to_get_one(self):
        name = patch_for(self.root, SOURCE)
        command = ["--repo", str(self.root), "compile-cpp", name]
        code, printed = output_of(main, command)
        self.assertEqual(code, 0)
        self.assertEqual(
            printed.splitlines(),
            [
                f"{name}: {SOURCE}: not compiled: no copy of {SOURCE} at d0f2af8b66b2; fetch "
                "it with `torch-overlay compile-cpp --fetch` (or --fetch --from BASE), or give "
                "--pytorch-src DIR (a checkout with d0f2af8b66b2)",
                "compile-cpp: 0 compiled, 1 not compiled, 0 with new errors",
            ],
        )

    def test_fetch_add_and_a_changed_copy(self):
        commit = self.pin.git_version
        requests = []
        served = {f"/pytorch/pytorch/{commit}/{path}": b"int x;\n" if path == SOURCE else b"int g;\n"
                  for path in sorted(self.pin.source_only)}  # fmt: skip
        url = serve(self, served, requests)
        code, printed = output_of(
            main, ["--repo", str(self.root), "compile-cpp", "--fetch", "--from", url]
        )
        self.assertEqual((code, sorted(requests)), (0, sorted(served)))
        self.assertIn(
            f".upstream-src/: {len(served)} file(s), pytorch/pytorch@{commit[:12]}", printed
        )
        entry = {"repo": "pytorch/pytorch", "commit": commit, "path": SOURCE, "bytes": 7,
                 "sha256": sha256(b"int x;\n")}  # fmt: skip
        manifest = self.root / CACHE_DIR / "manifest.jsonl"

        def manifest_entry(path):
            (found,) = [e for line in manifest.read_text().splitlines()
                        if (e := json.loads(line))["path"] == path]  # fmt: skip
            return found

        self.assertEqual(manifest_entry(SOURCE), entry)
        copy = source_copy(self.root, SOURCE, commit, self.pin.source_only[SOURCE], None)
        self.assertEqual((copy.data, copy.origin, copy.skew), (b"int x;\n", f"pytorch/pytorch@{commit[:12]}", ""))  # fmt: skip

        # A copy from another commit is recorded as such, and its errors are skew.
        other = self.root / "other.cpp"
        other.write_bytes(b"int y;\n")
        with self.assertRaisesRegex(OverlayError, "give OWNER/NAME@COMMIT"):
            add(self.root, SOURCE, other, "someone/pytorch@4d9bed61")
        with self.assertRaisesRegex(OverlayError, "not a source-only file"):
            add(self.root, HEADER, other, FORK)
        add(self.root, SOURCE, other, FORK)
        self.assertEqual(manifest_entry(SOURCE)["repo"], FORK.split("@")[0])
        copy = source_copy(self.root, SOURCE, commit, self.pin.source_only[SOURCE], None)
        self.assertEqual(copy.origin, f"{FORK[:-28]}, not pytorch/pytorch@{commit[:12]}")
        self.assertIn("another commit than the wheel's headers", copy.skew)

        # Every file is checked against the manifest before use; a refusal is one line.
        (self.root / CACHE_DIR / SOURCE).write_bytes(b"int z;\n")
        code, _ = output_of(
            main, ["--repo", str(self.root), "compile-cpp", patch_for(self.root, SOURCE)]
        )
        self.assertEqual(code, 3)  # a refusal
        with self.assertRaisesRegex(
            OverlayError, r"differs from its manifest.jsonl entry; re-fetch"
        ):
            read_cache(self.root)
        # A missing file at the base commit leaves the cache as it was.
        requests.clear()
        before = manifest.read_bytes()
        with self.assertRaisesRegex(OverlayError, f"{SOURCE}: not found"):
            fetch(self.root, base=url.replace("/pytorch/pytorch", "/elsewhere"))
        self.assertEqual(manifest.read_bytes(), before)
        self.assertEqual(list(self.root.glob(".upstream-src.*")), [])

    def test_lint_messages(self):
        diagnostic = Diagnostic(SOURCE, 12, "'x' was not declared in this scope", "x;")
        compiled = Compiled([], [], 1.0)
        results = [
            Result("0001-a.patch", HEADER, not_compiled="no copy"),
            Result("0002-b.patch", SOURCE, "o", "s", Compiled([diagnostic], [], 1.0), compiled),
            Result("0003-c.patch", SOURCE, "o", "s", compiled, compiled, new_errors=[diagnostic]),
        ]
        with mock.patch("tools.compile_cpp.compile_series", return_value=results):
            messages = [json.loads(m) for m in lint_messages(self.root)]
        # lintrunner fails on any message: only the error the patch adds is one.
        self.assertEqual(
            [(m["path"], m["severity"], m["name"]) for m in messages],
            [("patches/0003-c.patch", "error", "new-error")],
        )
        self.assertEqual(
            messages[0]["description"], f"{SOURCE}:12: error: 'x' was not declared in this scope"
        )

    def test_check_notes_what_is_not_compiled_here(self):
        # Without a cached copy: each source-only file is named, with how to fetch it.
        found = notes(self.root)
        self.assertEqual(len(found), len(self.pin.source_only))
        (note,) = [n for n in found if SOURCE in n]
        self.assertIn(f"{SOURCE} is not compiled here: no copy of it at", note)
        self.assertIn("compile-cpp --fetch", note)
        if cached_source():  # this checkout's copy is from another commit: version skew
            shutil.copytree(REPO / CACHE_DIR, self.root / CACHE_DIR)
            (note,) = [n for n in notes(self.root) if SOURCE in n]
            self.assertIn("not the base commit: errors it has without the patch are", note)

    @unittest.skipUnless(
        cached_source(), f"no copy of {SOURCE} in {CACHE_DIR}/ (compile-cpp --fetch)"
    )
    def test_source_file_compiles_before_and_after_its_patch_and_a_type_error_is_caught(self):
        # The real compile: about a minute for each version of the file.
        shutil.copytree(REPO / CACHE_DIR, self.root / CACHE_DIR)
        name = patch_for(self.root, SOURCE)
        (result,) = compile_series(self.root, only=[name])
        self.assertEqual(result.not_compiled, "")
        self.assertEqual(result.new_errors, [], "\n".join(result.lines()))
        report = "\n".join(result.lines())
        if (
            result.before.errors
        ):  # a copy from another commit than the wheel's: skew, not the patch's
            self.assertIn("error(s), version skew (", report)
        self.assertIn("  with the patch: ", report)

        bad = "  if (!TorchDispatchModeTLS::any_modes_set(nullptr, 1)) {"
        self.break_patch(SOURCE, "  if (!TorchDispatchModeTLS::any_modes_set()) {", bad)
        (broken,) = compile_series(self.root, only=[name])
        self.assertEqual(broken.before, result.before)
        (error,) = broken.new_errors
        patched = apply_patch(
            SOURCE,
            (self.root / CACHE_DIR / SOURCE).read_bytes(),
            (self.root / "patches" / name).read_bytes(),
            name,
        )
        self.assertEqual((error.file, error.text), (SOURCE, bad.strip()))
        self.assertEqual(error.line, patched.decode().splitlines().index(bad) + 1)
        self.assertRegex(error.message, "too many arguments|no matching function")


if __name__ == "__main__":
    run_tests()
