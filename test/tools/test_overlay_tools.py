# Owner(s): ["module: tools"]
"""The overlay toolchain against the real installed wheel, in temporary project directories."""

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from tools.activate import pth_path
from tools.active import ENV_VAR, environment, materialize
from tools.add import add
from tools.base import (
    PIN_FILE,
    SERIES_FILE,
    SERIES_HEADER,
    UPSTREAM_MAP_FILE,
    OverlayError,
    git,
    installed_torch,
    sha256,
)
from tools.boot.torch_overlay_finder import PIN_NAME
from tools.check import check, message_problems
from tools.export import export
from tools.lint_patches import lint
from tools.status import status
from tools.sync import sync
from tools.verify import verify

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = "torch/distributed/pipelining/_backward.py"
MODULE = "torch.distributed.pipelining._backward"
GOOD_MESSAGE = """[pipelining] Add a marker

Summary:
The marker shows which copy of the module was imported. Root cause: none, it is a probe.

Test Plan:
python test/distributed/test_probe.py
"""
# The project's part of every message (tools/base.py: NOTES_HEADING): the patch's topic.
NOTES = "\n\nOverlay notes:\nTopic: probe\n"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below root (except git internals, which git status may refresh)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


class OverlayProject:
    """A scratch project: the real base record with an empty series, then a marker patch."""

    def __init__(self, root: Path):
        self.root = root
        (root / "patches").mkdir()
        pin = json.loads((REPO_ROOT / PIN_FILE).read_text())
        pin["files"] = {}
        (root / PIN_FILE).write_text(json.dumps(pin, indent=2) + "\n")
        (root / SERIES_FILE).write_text(SERIES_HEADER)
        upstream = {"tests": {TARGET: ["test/distributed/pipelining/test_backward.py"]}}
        (root / UPSTREAM_MAP_FILE).write_text(json.dumps(upstream))
        topics = {"topics": [{"name": "probe", "title": "[pipelining] A probe"}]}
        (root / "patches/topics.json").write_text(json.dumps(topics))
        (root / "test/distributed").mkdir(parents=True)
        (root / "test/distributed/test_probe.py").write_text("")
        self.overlay = root / "torch_overlay"

    def commit_edit(self, path: str, old: str, new: str, message: str) -> None:
        add(self.root, [path])
        file = self.overlay / path
        file.write_text(file.read_text().replace(old, new, 1))
        git("commit", "-q", "-a", "-m", message.rstrip("\n") + NOTES, cwd=self.overlay)

    def state(self) -> tuple:
        head = git("rev-parse", "HEAD", cwd=self.overlay) if self.overlay.exists() else ""
        return head, snapshot(self.overlay), snapshot(self.root / "patches")


class OverlayToolsTest(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.project = OverlayProject(self.tmp)
        sync(self.tmp)
        self.project.commit_edit(
            TARGET,
            "import collections",
            'OVERLAY_MARKER = "hello"\nimport collections',
            GOOD_MESSAGE,
        )

    def test_sync_export_round_trip_is_byte_stable(self):
        self.assertEqual(
            export(self.tmp),
            ["wrote patches/0001-pipelining-Add-a-marker.patch", f"wrote {SERIES_FILE}",
             "wrote patches/base.json"],
        )  # fmt: skip
        pin = json.loads((self.tmp / PIN_FILE).read_text())
        wheel_copy = (installed_torch().site / TARGET).read_bytes()
        self.assertEqual(pin["files"], {TARGET: sha256(wheel_copy)})
        exported = snapshot(self.tmp / "patches")
        self.assertEqual(sync(self.tmp), 1)
        self.assertEqual(export(self.tmp), [])
        self.assertEqual(snapshot(self.tmp / "patches"), exported)
        self.assertIn("OVERLAY_MARKER", (self.project.overlay / TARGET).read_text())
        self.assertEqual(check(self.tmp), [])
        materialize(self.tmp, self.tmp / "tree")  # the import hook checks these against torch
        hook_pin = json.loads((self.tmp / "tree" / PIN_NAME).read_text())
        self.assertEqual(hook_pin["files"], pin["files"])
        self.assertEqual(hook_pin["git_version"], pin["git_version"])
        # A second sync is a no-op on content (idempotent).
        sync(self.tmp)
        self.assertEqual(snapshot(self.tmp / "patches"), exported)

    def assert_refused_untouched(self, pattern: str, force: bool = False) -> None:
        before = self.project.state()
        with self.assertRaisesRegex(OverlayError, pattern):
            sync(self.tmp, force=force)
        self.assertEqual(self.project.state(), before)
        self.assertEqual([p.name for p in self.tmp.glob(".torch_overlay.*") if p.is_dir()], [])

    def test_refuses_wrong_torch_version(self):
        export(self.tmp)
        pin = json.loads((self.tmp / PIN_FILE).read_text())
        pin["torch_version"] = "2.14.1"
        (self.tmp / PIN_FILE).write_text(json.dumps(pin))
        self.assert_refused_untouched(r"pinned to torch 2\.14\.1")

    def test_refuses_drifted_base_file(self):
        export(self.tmp)
        pin = json.loads((self.tmp / PIN_FILE).read_text())
        pin["files"][TARGET] = "0" * 64
        (self.tmp / PIN_FILE).write_text(json.dumps(pin))
        self.assert_refused_untouched(f"base file {TARGET} drifted", force=True)

    def test_refuses_patch_that_does_not_apply(self):
        export(self.tmp)
        (patch,) = self.tmp.glob("patches/0001-*.patch")
        text = patch.read_text()
        self.assertIn(" # Copyright (c) Meta", text)  # a context line of the hunk
        patch.write_text(text.replace(" # Copyright (c) Meta", " # Copyright (c) Someone"))
        self.assert_refused_untouched(
            "0001-pipelining-Add-a-marker.patch does not apply", force=True
        )
        self.assertTrue(any("does not apply" in p for p in self.check_problems()))

    def check_problems(self) -> list[str]:
        try:
            return check(self.tmp)
        except OverlayError as error:
            return [str(error)]

    def assert_kept(self) -> None:
        """sync with unexported work and unchanged patches/: nothing to sync, nothing lost."""
        before = self.project.state()
        said = []
        sync(self.tmp, say=said.append)
        self.assertEqual(self.project.state(), before)
        self.assertIn("holds work not exported yet", said[0])

    def test_sync_keeps_unexported_work(self):
        export(self.tmp)
        (self.project.overlay / TARGET).write_text("edited\n")
        self.assert_kept()
        git("checkout", TARGET, cwd=self.project.overlay)
        self.project.commit_edit(TARGET, "OVERLAY_MARKER", "OVERLAY_MARKER_2", "[x] y")
        self.assert_kept()
        self.assertTrue(any("differs from its overlay commit" in p or "differ from patches/series" in p
                            for p in check(self.tmp)))  # fmt: skip

    def test_check_reads_messages_like_upstream_prs(self):
        def problems(message: str) -> list[str]:
            subject, _, body = message.partition("\n\n")
            text = f"Subject: [PATCH] {subject}\n\n{body}\n---\n diff\n".encode()
            return message_problems(self.tmp, "p.patch", text)

        subject, _, body = GOOD_MESSAGE.partition("\n\n")
        self.assertEqual(problems(f"{subject}\n\n{body}\nFixes #180486\n"), [])
        self.assertExpectedInline(
            "\n".join(problems("Add a marker\n\nFixes: the bug\n")),
            """\
p.patch: subject 'Add a marker' should read '[Area] title', e.g. '[DTensor] …'
p.patch: no 'Summary:' section (problem, root cause, fix)
p.patch: 'Test Plan:' must name the command that runs this repo's test
p.patch: 'Fixes: the bug' should read 'Fixes #N'""",
        )
        self.assertEqual(
            problems(f"{subject}\n\n{body.replace('test_probe', 'test_missing')}"),
            [
                "p.patch: Test Plan names test/distributed/test_missing.py, which is not in this repo"
            ],
        )
        # A PR named by its place in the series goes stale when the series is reordered.
        relative = body.replace(
            "it is a probe.",
            "it is a probe (next\nPR: 1; previous patch: 2; a\nfollow-up PR may drop it; "
            "the earlier one (previous)).",
        )
        self.assertExpectedInline(
            "\n".join(problems(f"{subject}\n\n{relative}")),
            """\
p.patch: 'next PR' points at a PR by its place in the series; name that PR by its title or remove the reference
p.patch: 'previous patch' points at a PR by its place in the series; name that PR by its title or remove the reference
p.patch: '(previous)' points at a PR by its place in the series; name that PR by its title or remove the reference""",
        )
        # Every upstream issue declared for the patch in upstream.json needs its Fixes line.
        text = f"Subject: [PATCH] {subject}\n\n{body}\nFixes pytorch/pytorch#180486\n---\n".encode()
        self.assertEqual(message_problems(self.tmp, "p.patch", text, [180486]), [])
        self.assertEqual(
            message_problems(self.tmp, "p.patch", text, [180486, 197859]),
            ["p.patch: patches/upstream.json says it fixes #197859; add the line 'Fixes #197859'"],
        )

    def test_check_refuses_touched_files_without_upstream_tests(self):
        export(self.tmp)
        upstream = {"tests": {}, "issues": {"0002-gone.patch": [1]}}
        (self.tmp / UPSTREAM_MAP_FILE).write_text(json.dumps(upstream))
        self.assertEqual(
            check(self.tmp),
            [f"{TARGET}: a patch touches it, but no upstream test file maps to it in "
             f"{UPSTREAM_MAP_FILE}",
             f'{UPSTREAM_MAP_FILE}: "issues" names gone.patch, which is not in {SERIES_FILE}'],
        )  # fmt: skip

    def test_check_reports_a_held_back_patch_that_later_patches_build_on(self):
        self.project.commit_edit(
            TARGET, 'OVERLAY_MARKER = "hello"', 'OVERLAY_MARKER = "needs C++"',
            GOOD_MESSAGE.replace("Add a marker", "Change it") + "\nRequires-Source-Build: x\n",
        )  # fmt: skip
        self.project.commit_edit(
            TARGET, 'OVERLAY_MARKER = "needs C++"', 'OVERLAY_MARKER = "later"',
            GOOD_MESSAGE.replace("Add a marker", "Build on it"),
        )  # fmt: skip
        export(self.tmp)
        # (the probe's patches share one test file, which check reports separately)
        (problem,) = [p for p in check(self.tmp) if p.startswith("on a wheel")]
        self.assertIn("on a wheel: cannot hold back '[pipelining] Change it'", problem)

    def test_lint_adapter_flags_unformatted_cpp_and_non_applying_patches(self):
        clang_format = str(Path(sys.executable).parent / "clang-format")
        self.project.commit_edit(
            "torch/csrc/autograd/utils/grad_layout_contract.h",
            "namespace torch::autograd::utils {",
            "namespace torch::autograd::utils {\ninline int  answer( ) {return 42;}",
            "[autograd] Badly formatted",
        )  # fmt: skip
        export(self.tmp)
        (message,) = [json.loads(line) for line in lint(self.tmp, clang_format)]
        self.assertEqual((message["code"], message["path"]),
                         ("CLANGFORMAT", "patches/0002-autograd-Badly-formatted.patch"))  # fmt: skip
        self.assertIn("+inline int answer() {", message["description"])
        (patch,) = self.tmp.glob("patches/0001-*.patch")
        patch.write_text(patch.read_text().replace(" # Copyright (c) Meta", " # Copyright (c) X"))
        (message,) = [json.loads(line) for line in lint(self.tmp, clang_format)]
        self.assertEqual(
            (message["code"], message["path"]), ("PATCHAPPLY", f"patches/{patch.name}")
        )

    def test_status_holds_back_patches_that_need_a_source_build(self):
        header = "torch/csrc/autograd/utils/grad_layout_contract.h"
        self.project.commit_edit(
            header, "namespace torch::autograd::utils {", "namespace torch::autograd::utils {\n// edited",
            "[autograd] C++ change",
        )  # fmt: skip
        self.project.commit_edit(
            "torch/distributed/pipelining/_utils.py", "import logging", "import logging  # edited",
            "[pipelining] Python change that relies on the C++ one\n\n"
            "Requires-Source-Build: relies on the grad_layout_contract.h change\n\n"
            "A paragraph after the trailer must not hide it.",
        )  # fmt: skip
        with mock.patch.dict(os.environ, {ENV_VAR: ""}):  # as if not started by `run`
            text = status(self.tmp)
        self.assertExpectedInline(
            text,
            """\
base: torch 2.15.0 (git d0f2af8b66b2), 0 patch(es) in patches/series
installed: torch 2.15.0+cu132 (git d0f2af8b66b2): matches the base
overlay: torch_overlay/, no uncommitted edits
  not exported yet: 3 patch file(s), 3 base file(s) differ from patches/; run torch-overlay export
venv: not activated
patches:
  active     [pipelining] Add a marker
  held back  [autograd] C++ change
             needs a source build (touches C++: torch/csrc/autograd/utils/grad_layout_contract.h)
  held back  [pipelining] Python change that relies on the C++ one
             needs a source build (Requires-Source-Build: relies on the grad_layout_contract.h change)
overlaid modules:
  torch.distributed.pipelining._backward
""",
        )
        # Uncommitted edits are part of what `run` activates.
        target = self.project.overlay / TARGET
        target.write_text(target.read_text().replace('"hello"', '"edited"'))
        plan = materialize(self.tmp, self.tmp / "tree")
        self.assertEqual(plan.modules, [MODULE])
        self.assertIn('OVERLAY_MARKER = "edited"', (self.tmp / "tree" / TARGET).read_text())


PROBE = f"""\
import multiprocessing as mp
import sys
import {MODULE} as m

def child(queue):
    import {MODULE} as m
    queue.put(getattr(m, "OVERLAY_MARKER", None))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print("process", getattr(m, "OVERLAY_MARKER", None), "child", queue.get(), flush=True)
    proc.join()
"""


PATHS_PROBE = f"""\
import inspect, json, linecache
import torch._dynamo.trace_rules as rules
import {MODULE} as m

fn = m.stage_backward_input
lines = inspect.getsource(m).splitlines()
marker = next((i for i, line in enumerate(lines) if line.startswith("OVERLAY_MARKER")), None)
print(json.dumps({{
    "file": m.__file__,
    "co_filename": fn.__code__.co_filename,
    "check_file": [str(rules.check_file(m.__file__, inlined)) for inlined in (False, True)],
    "marker_line": None if marker is None else linecache.getline(m.__file__, marker + 1),
}}))
"""


class OverlayActivationTest(TestCase):
    """`run` and `activate` in real child processes (each imports torch: a few seconds)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = Path(tempfile.mkdtemp(prefix="overlay-run-test-"))
        cls.project = OverlayProject(cls.tmp)
        sync(cls.tmp)
        cls.project.commit_edit(
            TARGET,
            "import collections",
            'OVERLAY_MARKER = "hello"\nimport collections',
            GOOD_MESSAGE,
        )
        (cls.tmp / "probe.py").write_text(PROBE)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)
        super().tearDownClass()

    def cli(self, *args: str, python: str = sys.executable, env=None) -> str:
        proc = subprocess.run(
            [python, "-m", "tools.cli", "--repo", str(self.tmp), *args],
            cwd=REPO_ROOT, capture_output=True, text=True, env=env,
        )  # fmt: skip
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def test_run_shadows_in_torchrun_worker_and_spawned_child(self):
        torchrun = str(Path(sys.executable).parent / "torchrun")
        out = self.cli("run", "--", torchrun, "--standalone", "--nproc-per-node", "1",
                       str(self.tmp / "probe.py"))  # fmt: skip
        self.assertIn("process hello child hello", out)
        stock = subprocess.run(
            [sys.executable, str(self.tmp / "probe.py")],
            capture_output=True, text=True, env=environment(None), check=True,
        )  # fmt: skip
        self.assertIn("process None child None", stock.stdout)

    def test_run_loads_an_overlaid_module_as_the_installed_one(self):
        # Dynamo decides by a code object's file whether it is torch's own code (skipped, or
        # inlined by its lists) or the user's (traced): an overlaid module must keep the
        # installed path, and tracebacks and inspect must show its own lines there.
        (self.tmp / "paths.py").write_text(PATHS_PROBE)
        out = json.loads(self.cli("run", "--", sys.executable, str(self.tmp / "paths.py")))
        stock = subprocess.run(
            [sys.executable, str(self.tmp / "paths.py")],
            capture_output=True, text=True, env=environment(None), check=True,
        )  # fmt: skip
        stock = json.loads(stock.stdout)
        installed = str(installed_torch().site / TARGET)
        self.assertEqual((out["file"], out["co_filename"]), (installed, installed))
        self.assertEqual(out["check_file"], stock["check_file"])
        self.assertEqual(out["marker_line"], 'OVERLAY_MARKER = "hello"\n')
        self.assertIsNone(stock["marker_line"])

    def test_run_gives_the_overlay_its_own_inductor_cache(self):
        # Inductor keys its on-disk caches by the installed torch files, which the overlay
        # leaves as they are: a shared directory would serve stock's graphs to the overlay.
        code = ("import os, subprocess, sys; print(os.environ['TORCHINDUCTOR_CACHE_DIR']); "
                "env = {**os.environ, 'TORCH_OVERLAY_ACTIVE': ''}; "
                "subprocess.run([sys.executable, '-c', 'import os; "
                "print(os.environ[\\'TORCHINDUCTOR_CACHE_DIR\\'])'], env=env)")  # fmt: skip
        env = {**environment(None), "TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "inductor")}
        proc = subprocess.run(
            [sys.executable, "-m", "tools.cli", "--repo", str(self.tmp), "run", "--",
             sys.executable, "-c", code],
            cwd=REPO_ROOT, capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        overlay_dir, stock_dir = proc.stdout.split()
        self.assertEqual(Path(overlay_dir).parent, self.tmp / "inductor")
        self.assertRegex(Path(overlay_dir).name, r"^torch-overlay-[0-9a-f]{16}$")
        self.assertEqual(stock_dir, str(self.tmp / "inductor"))

    def run_with_torch_from(self, torch_dir: Path, code: str) -> subprocess.CompletedProcess:
        """``torch-overlay run`` a Python whose ``import torch`` finds ``torch_dir/torch`` first,
        as an interpreter of another environment would."""
        code = f"import sys; sys.path.insert(0, {str(torch_dir)!r}); {code}"
        return subprocess.run(
            [sys.executable, "-m", "tools.cli", "--repo", str(self.tmp), "run", "--",
             sys.executable, "-c", code],
            cwd=REPO_ROOT, capture_output=True, text=True,
        )  # fmt: skip

    def test_run_refuses_to_shadow_a_torch_that_is_not_the_pinned_base(self):
        version_py = (installed_torch().site / "torch" / "version.py").read_text()
        other = self.tmp / "other-release"
        (other / "torch").mkdir(parents=True)
        (other / "torch" / "__init__.py").write_text("")
        (other / "torch" / "version.py").write_text(
            "__version__ = '2.14.1+cpu'\ngit_version = '0123456789abcdef'\n"
        )
        proc = self.run_with_torch_from(other, "import torch.distributed.tensor")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(
            f"ImportError: torch-overlay (this interpreter: {sys.executable}): the torch it "
            f"imports, {other / 'torch'}, is torch 2.14.1+cpu (git 0123456789ab), but the "
            "overlay is made for torch 2.15.0 (git d0f2af8b66b2)",
            proc.stderr,
        )
        # Checked lazily: a process that never imports torch pays nothing and is not refused.
        proc = self.run_with_torch_from(other, "print('no torch')")
        self.assertEqual((proc.returncode, proc.stdout), (0, "no torch\n"), proc.stderr)
        # The pinned release, but the file the overlay replaces differs from the base.
        drifted = self.tmp / "drifted"
        (drifted / TARGET).parent.mkdir(parents=True)
        (drifted / "torch" / "__init__.py").write_text("")
        (drifted / "torch" / "version.py").write_text(version_py)
        (drifted / TARGET).write_text("# edited in site-packages\n")
        proc = self.run_with_torch_from(drifted, f"import {MODULE}")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(
            f"the overlay replaces {TARGET}, but {drifted / TARGET} has sha256 "
            f"{sha256(b'# edited in site-packages' + bytes([10]))[:16]}…, where the pinned base "
            "(torch 2.15.0 (git d0f2af8b66b2)) has sha256",
            proc.stderr,
        )

    def test_verify_fails_when_the_overlay_does_not_fix_a_reproducer(self):
        # This scratch series lacks the project's fixes, so every reproducer stays wrong.
        with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
            self.assertEqual(verify(self.tmp, self.tmp / "reports"), 1)
        report = json.loads((self.tmp / "reports" / "verify.json").read_text())
        rows = report["reproducers"]
        # The gates are shown too; this scratch series was never run through upstream-test.
        self.assertEqual(report["gates"][0]["detail"], "not run: torch-overlay upstream-test")
        self.assertGreater(len(rows), 0)
        self.assertEqual({row["verdict"] for row in rows}, {"FAIL"})
        self.assertTrue(all(row["stock_shows_bug"] for row in rows))
        self.assertIn(
            f"0 of {len(rows)} reproducer(s) pass with the overlay, {len(rows)} fail",
            out.getvalue(),
        )
        self.assertTrue((self.tmp / "reports" / "verify.md").read_text().startswith("| bug |"))

    def test_activate_then_deactivate_leaves_the_venv_as_before(self):
        venv = self.tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        site = Path(subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip())  # fmt: skip
        # Let the scratch venv see this venv's torch, as a venv with torch installed would.
        (site / "base_site.pth").write_text(str(Path(pth_path()).parent) + "\n")
        before = snapshot(venv)
        env = {k: v for k, v in environment(None).items() if k != "TORCH_OVERLAY_ACTIVE"}
        env["PYTHONPATH"] = str(REPO_ROOT)  # no run hook: only the .pth may activate it
        self.assertIn("activated: 1 patch(es) active", self.cli("activate", python=python, env=env))
        self.assertIn("venv: activated", self.cli("status", python=python, env=env))
        probe = subprocess.run([python, str(self.tmp / "probe.py")], capture_output=True,
                               text=True, env=env, check=True)  # fmt: skip
        self.assertIn("process hello child hello", probe.stdout)
        self.assertIn("deactivated", self.cli("deactivate", python=python, env=env))
        self.assertEqual(snapshot(venv), before)
        self.assertFalse((self.tmp / ".overlay-active").exists())


if __name__ == "__main__":
    run_tests()
