# Owner(s): ["module: tools"]
"""`torch-overlay build` and `stack` against a small fake PyTorch checkout made here: a git
repo with the series' base files at their source paths and a stub build entry point that
records the arguments and environment it was started with."""

import io
import json
import os
import re
import shutil
import stat
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

from tools.base import (
    OverlayError,
    git,
    installed_torch,
    patch_paths,
    read_pin,
    read_series,
    source_only_series,
    wheel_file,
    wheel_stopgap,
)
from tools.build import build
from tools.stack import stack

REPO = Path(__file__).resolve().parents[2]
STUB_BUILD = """\
#!{python}
import json, os, sys
keys = ("USE_CUDA", "USE_DISTRIBUTED", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS")
with open({record!r}, "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {{k: os.environ.get(k) for k in keys}}}}, f)
"""


def preimage(patch: str, path: str) -> str:
    """What a patch says ``path`` holds: its context and removed lines at their line
    numbers, placeholder lines elsewhere. Stands in for a file the wheel does not ship."""
    section = patch.split(f"diff --git a/{path} b/{path}\n", 1)[1].split("\ndiff --git ")[0]
    lines: dict[int, str] = {}
    for hunk in re.split(r"^@@ ", section, flags=re.M)[1:]:
        header, *body = hunk.split("\n")
        number = int(re.match(r"-(\d+)", header).group(1))
        for line in body:
            if line[:1] in (" ", "-") or line == "":
                lines[number] = line[1:]
                number += 1
            elif line.startswith("--"):
                break
    return "".join(f"{lines.get(n, f'// line {n}')}\n" for n in range(1, max(lines) + 1))


def make_fake_checkout(root: Path) -> Path:
    """A PyTorch-shaped git repo holding the series' base files as the source tree has them."""
    torch = installed_torch()
    pin = read_pin(REPO)
    for path in pin.files:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        text = wheel_file(torch, path).read_text()
        # The wheel wraps headers in a TORCH_STABLE_ONLY guard that the source tree lacks.
        lines = [line for line in text.splitlines(True) if "TORCH_STABLE_ONLY" not in line]
        target.write_text("".join(lines))
    for name in source_only_series(REPO, pin):
        patch = (REPO / "patches" / name).read_text()
        for path in patch_paths(patch.encode()):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(preimage(patch, path))
    for marker in ("torch/__init__.py", "c10/.keep", "aten/src/ATen/.keep", "CMakeLists.txt"):
        (root / marker).parent.mkdir(parents=True, exist_ok=True)
        (root / marker).touch()
    git("init", "-q", "-b", "main", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "upstream", cwd=root)
    return root


def checkout_state(src: Path) -> tuple:
    return (
        git("rev-parse", "HEAD", cwd=src),
        git("symbolic-ref", "-q", "HEAD", cwd=src, check=False),
        git("for-each-ref", cwd=src),
        git("status", "--porcelain", cwd=src),
    )


class SourceBuildTest(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-build-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.src = make_fake_checkout(self.tmp / "pytorch")
        # What a branch holds: the series without its wheel stopgaps.
        self.series = [
            name
            for name in read_series(REPO)
            if not wheel_stopgap((REPO / "patches" / name).read_bytes())
        ]

    def run_quietly(self, fn, *args, **kwargs):
        with redirect_stdout(io.StringIO()) as out:
            result = fn(*args, **kwargs)
        return result, out.getvalue()

    def branch_commits(self, branch="torch-overlay/2.15.0") -> list[str]:
        return git("log", "--reverse", "--format=%s", f"main..{branch}", cwd=self.src).splitlines()

    def test_build_dry_run_prints_the_plan_and_changes_nothing(self):
        before = checkout_state(self.src)
        rc, out = self.run_quietly(
            build, REPO, self.src, onto_head=True, arch="9.0", jobs=3, dry_run=True
        )
        self.assertEqual(rc, 0)
        self.assertEqual(checkout_state(self.src), before)
        self.assertIn("branch:    torch-overlay/2.15.0", out)
        self.assertIn(f"commits:   {len(self.series)}, one per patch", out)
        for line in ("USE_CUDA=1", "USE_DISTRIBUTED=1", "TORCH_CUDA_ARCH_LIST=9.0", "MAX_JOBS=3"):
            self.assertIn(f"  {line}\n", out)
        self.assertIn("-m pip install --no-build-isolation -v -e .", out)

    def test_build_applies_one_commit_per_patch_and_runs_the_build_command(self):
        record = self.tmp / "record.json"
        stub = self.tmp / "python-stub"
        stub.write_text(STUB_BUILD.format(python=os.sys.executable, record=str(record)))
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
        rc, _ = self.run_quietly(
            build, REPO, self.src, onto_head=True, arch="9.0", python=str(stub)
        )
        self.assertEqual(rc, 0)
        called = json.loads(record.read_text())
        self.assertEqual(
            called["argv"], ["-m", "pip", "install", "--no-build-isolation", "-v", "-e", "."]
        )
        self.assertEqual(Path(called["cwd"]).resolve(), self.src.resolve())
        self.assertEqual(called["env"]["USE_CUDA"], "1")
        self.assertEqual(called["env"]["USE_DISTRIBUTED"], "1")
        self.assertEqual(called["env"]["TORCH_CUDA_ARCH_LIST"], "9.0")
        self.assertGreaterEqual(int(called["env"]["MAX_JOBS"]), 1)
        self.assertEqual(len(self.branch_commits()), len(self.series))
        self.assertEqual(
            git("branch", "--show-current", cwd=self.src).strip(), "torch-overlay/2.15.0"
        )
        header = self.src / "torch/csrc/autograd/utils/grad_layout_contract.h"
        self.assertIn("exact_memory_format", header.read_text())
        # the source-only patch, applied to the checkout's own file by context
        source = self.src / "torch/csrc/autograd/python_variable.cpp"
        self.assertIn("if (!dtensor_is_tracing()) {", source.read_text())
        subjects = self.branch_commits()
        self.assertEqual(
            subjects[-1], "[DTensor] Keep the native sharding cache out of traced regions"
        )
        self.assertNotIn(
            "[aot_autograd] A forward output never resolves to a tangent placeholder", subjects
        )

    def assert_refused(self, pattern: str, src=None, **kwargs):
        src = src or self.src
        before = checkout_state(src)
        with self.assertRaisesRegex(OverlayError, pattern):
            self.run_quietly(build, REPO, src, arch="9.0", **kwargs)
        self.assertEqual(checkout_state(src), before)

    def test_refusals_change_nothing(self):
        self.assert_refused("pinned base commit d0f2af8b66b2.* is not in")
        (self.src / "torch/__init__.py").write_text("# local edit\n")
        self.assert_refused("uncommitted changes", onto_head=True)
        git("checkout", "torch/__init__.py", cwd=self.src)
        not_pytorch = self.tmp / "other"
        not_pytorch.mkdir()
        git("init", "-q", cwd=not_pytorch)
        (not_pytorch / "README").write_text("not pytorch\n")
        git("add", "-A", cwd=not_pytorch)
        git("commit", "-q", "-m", "x", cwd=not_pytorch)
        self.assert_refused(
            "does not look like a PyTorch checkout", src=not_pytorch, onto_head=True
        )
        git("branch", "torch-overlay/2.15.0", cwd=self.src)
        self.assert_refused("already exists", onto_head=True)
        git("branch", "-D", "torch-overlay/2.15.0", cwd=self.src)

    def test_refuses_a_series_that_conflicts_with_head(self):
        ops = self.src / "torch/distributed/tensor/_ops/_tensor_ops.py"
        ops.write_text(ops.read_text().replace("aten.view.dtype,", "aten.view.dtype,  # moved"))
        git("commit", "-q", "-am", "upstream moved on", cwd=self.src)
        self.assert_refused(
            r"0002-.*\.patch does not apply on .* \(conflicts in: torch/distributed/tensor/_ops/_tensor_ops.py\); nothing was changed",
            onto_head=True,
        )

    def test_stack_places_each_patch_tests_and_rehearses_the_pull_requests(self):
        out = stack(REPO, self.src, onto_head=True)
        subjects = self.branch_commits()
        self.assertEqual(len(subjects), len(self.series))
        shas = git("rev-list", "--reverse", "main..HEAD", cwd=self.src).split()
        for sha in shas:
            files = git(
                "diff-tree", "--no-commit-id", "--name-only", "-r", sha, cwd=self.src
            ).split()
            self.assertTrue(any(f.startswith("test/") for f in files), (sha, files))
            message = git("log", "-1", "--format=%B", sha, cwd=self.src)
            self.assertNotIn("Requires-Source-Build", message)
            self.assertIn("Test Plan:", message)
        first = git("diff-tree", "--no-commit-id", "--name-only", "-r", shas[0], cwd=self.src)
        self.assertIn("test/autograd/test_clone_obey_contract.py", first)
        self.assertIn("rehearsal (ghstack's fake GitHub, offline; nothing was pushed):", out)
        for number, subject in enumerate(subjects, 500):
            self.assertIn(f"#{number} {subject}  (gh/you/{number - 499}/head -> ", out)

    def test_stack_never_overwrites_an_upstream_test(self):
        clash = self.src / "test/distributed/tensor/test_partial_product.py"
        clash.parent.mkdir(parents=True)
        clash.write_text("# upstream's own file\n")
        git("add", "-A", cwd=self.src)
        git("commit", "-q", "-m", "upstream test", cwd=self.src)
        before = checkout_state(self.src)
        with self.assertRaisesRegex(
            OverlayError, "would overwrite upstream files.*test_partial_product.py"
        ):
            stack(REPO, self.src, onto_head=True)
        self.assertEqual(checkout_state(self.src), before)


if __name__ == "__main__":
    run_tests()
