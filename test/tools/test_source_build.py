# Owner(s): ["module: tools"]
"""`torch-overlay build` and `stack` against a small fake PyTorch checkout made here: a git
repo with the series' base files at their source paths and a stub build entry point that
records the arguments and environment it was started with."""

import io
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from tools import stack as stack_module
from tools.base import (
    OverlayError,
    git,
    installed_torch,
    is_source_only,
    patch_paths,
    read_pin,
    read_series,
    series_subjects,
    source_only_series,
    wheel_file,
    wheel_stopgap,
)
from tools.build import build
from tools.stack import stack
from tools.topics import read_topics

REPO = Path(__file__).resolve().parents[2]
STUB_BUILD = """\
#!{python}
import json, os, sys
keys = ("USE_CUDA", "USE_DISTRIBUTED", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS")
with open({record!r}, "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {{k: os.environ.get(k) for k in keys}}}}, f)
"""


def section_of(patch: str, path: str) -> str:
    """The part of a patch that changes ``path``."""
    return patch.split(f"diff --git a/{path} b/{path}\n", 1)[1].split("\ndiff --git ")[0]


def preimage_lines(patch: str, path: str) -> dict[int, str]:
    """The context and removed lines a patch shows for ``path``, by line number."""
    section = section_of(patch, path)
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
    return lines


def line_shift(patch: str, path: str) -> list[tuple[int, int]]:
    """(first new line after a hunk, lines it added net) per hunk of ``path``."""
    shifts = []
    hunk_header = r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@"
    for header in re.findall(hunk_header, section_of(patch, path), re.M):
        old_len = int(header[1] or 1)
        new_start, new_len = int(header[2]), int(header[3] or 1)
        shifts.append((new_start + new_len, new_len - old_len))
    return shifts


def preimage(patch: str, path: str, later: tuple[str, ...] = ()) -> str:
    """What a patch says ``path`` holds: its context and removed lines at their line
    numbers, placeholder lines elsewhere. Stands in for a file the wheel does not ship.
    ``later`` patches of the series that change the file too (on top of this one)
    add their context, moved back to this file's line numbers (outside its hunks;
    only this patch's line shifts are undone, enough for two patches on one file)."""
    lines = preimage_lines(patch, path)
    shifts = line_shift(patch, path)
    for other in later:
        for number, text in preimage_lines(other, path).items():
            base = number - sum(delta for end, delta in shifts if end <= number)
            lines.setdefault(base, text)
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
    texts = [(REPO / "patches" / n).read_text() for n in source_only_series(REPO, pin)]
    written = set()
    for i, patch in enumerate(texts):
        for path in patch_paths(patch.encode()):
            if path in written:  # the first patch that changes it writes it
                continue
            later = tuple(t for t in texts[i + 1 :] if path in patch_paths(t.encode()))
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(preimage(patch, path, later))
            written.add(path)
    for marker in ("torch/__init__.py", "c10/.keep", "aten/src/ATen/.keep", "CMakeLists.txt"):
        (root / marker).parent.mkdir(parents=True, exist_ok=True)
        (root / marker).touch()
    git("init", "-q", "-b", "main", cwd=root)
    name, email = IDENTITY[:-1].split(" <")
    git("config", "user.name", name, cwd=root)
    git("config", "user.email", email, cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "upstream", cwd=root)
    return root


IDENTITY = "Ada Lovelace <ada@pytorch.invalid>"


def copy_project(dest: Path) -> Path:
    """A copy of this project's series and tests, to change its topics."""
    shutil.copytree(REPO / "patches", dest / "patches")
    shutil.copytree(REPO / "test", dest / "test", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


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
        # the source-only patches, applied to the checkout's own files by context
        source = self.src / "torch/csrc/autograd/python_variable.cpp"
        self.assertIn("if (!dtensor_is_tracing()) {", source.read_text())
        self.assertIn("enum class NumberValueClass", source.read_text())
        source = self.src / "torch/csrc/dynamo/guards.cpp"
        self.assertIn('"add_dict_not_contains_key_guard",', source.read_text())
        subjects = self.branch_commits()
        self.assertEqual(
            subjects[-4:],
            [
                "[DTensor] Keep the native sharding cache out of traced regions",
                "[dynamo] One leaf for the absent-key checks of a dict: DICT_NOT_CONTAINS_KEYS",
                "[DTensor] Tell a Python scalar from a 0-d tensor in the native sharding cache key",
                "[DTensor] Key a Python number's value class where the sharding caches leave its "
                "value out",
            ],
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
            r"\d{4}-DTensor-.*\.patch does not apply on .* \(conflicts in: torch/distributed/tensor/_ops/_tensor_ops.py\); nothing was changed",
            onto_head=True,
        )

    def topic_branches(self) -> dict[str, list[str]]:
        """Every stack branch -> its commits' subjects, from the base up."""
        branches = git("for-each-ref", "--format=%(refname:short)", "refs/heads/torch-overlay/",
                       cwd=self.src).split()  # fmt: skip
        return {b: self.branch_commits(b) for b in branches}

    def test_stack_makes_one_branch_per_topic_authored_by_the_checkout(self):
        found = read_topics(REPO)
        before = checkout_state(self.src)
        out = stack(REPO, self.src, onto_head=True)
        # The checkout is back where it was; only branches were added.
        self.assertEqual(checkout_state(self.src)[:2], before[:2])
        branches = self.topic_branches()
        submitting = [t for t in found.topics.values() if found.submitted(t)]
        self.assertGreaterEqual(len(branches), 3)
        self.assertEqual(sorted(branches), sorted(f"torch-overlay/{t.name}" for t in submitting))
        head = git("rev-parse", "main", cwd=self.src).strip()
        subjects = series_subjects(REPO)
        for topic in submitting:
            branch = f"torch-overlay/{topic.name}"
            # Each topic stands alone on the checkout's HEAD, with exactly its own PRs.
            start = topic.depends and f"torch-overlay/{topic.depends}"
            self.assertEqual(git("merge-base", "main", branch, cwd=self.src).strip(), head, branch)
            self.assertEqual(
                self.branch_commits(branch)[-len(found.submitted(topic)) :],
                [subjects[name] for name in found.submitted(topic)],
            )
            if not start:
                self.assertEqual(len(self.branch_commits(branch)), len(found.submitted(topic)))
            for sha in git("rev-list", f"main..{branch}", cwd=self.src).split():
                author, committer, date, message = git(
                    "log", "-1", "--format=%an <%ae>%x00%cn <%ce>%x00%at%x00%B", sha,
                    cwd=self.src,
                ).split("\0", 3)  # fmt: skip
                self.assertEqual(author, IDENTITY, sha)
                self.assertEqual(committer, IDENTITY, sha)
                self.assertGreater(int(date), time.time() - 3600)
                for word in ("torch-overlay", "torch_overlay", "Overlay notes", "Topic:",
                             "Wheel-Stopgap", "Requires-Source-Build", "Carried-Only",
                             "localhost", ".example"):  # fmt: skip
                    self.assertNotIn(word, message, sha)
                self.assertIn("Test Plan:", message)
                files = git("diff-tree", "--no-commit-id", "--name-only", "-r", sha,
                            cwd=self.src).split()  # fmt: skip
                self.assertTrue(any(f.startswith("test/") for f in files), (sha, files))
        # Carried patches are never submitted.
        stacked = {s for commits in branches.values() for s in commits}
        for name in found.carried:
            self.assertNotIn(subjects[name], stacked)
        self.assertIn("not submitted (carried here only):", out)
        # One offline rehearsal and one quoted `ghstack submit` per independent stack.
        for topic in submitting:
            branch = f"torch-overlay/{topic.name}"
            self.assertIn(f"rehearsal of {branch} (ghstack's fake GitHub", out)
            self.assertIn(
                f"  cd {shlex.quote(str(self.src))} && git checkout {branch} && ghstack submit",
                out,
            )
        first = subjects[found.submitted(submitting[0])[0]]
        self.assertIn(f"#500 {first}  (gh/you/1/head -> gh/you/1/base; author {IDENTITY})", out)

    def test_stack_dry_run_changes_nothing_and_runs_after_build(self):
        before = checkout_state(self.src)
        out = stack(REPO, self.src, onto_head=True, dry_run=True)
        self.assertEqual(checkout_state(self.src), before)
        self.assertIn("stack plan (dry run, nothing changed):", out)
        self.assertIn("branch:    torch-overlay/pipelining at ", out)
        # The README's order: build, then stack on the same checkout.
        stub = self.tmp / "python-stub"
        stub.write_text(STUB_BUILD.format(python=os.sys.executable, record=str(self.tmp / "r")))
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
        rc, _ = self.run_quietly(build, REPO, self.src, onto_head=True, arch="9.0",
                                 python=str(stub))  # fmt: skip
        self.assertEqual(rc, 0)
        (self.src / "build").mkdir()
        (self.src / "build/CMakeCache.txt").write_text("left by the build\n")  # untracked
        out = stack(REPO, self.src, onto_head=True, only=["pipelining"])
        self.assertEqual(
            list(self.topic_branches()), ["torch-overlay/2.15.0", "torch-overlay/pipelining"]
        )
        self.assertEqual(
            git("branch", "--show-current", cwd=self.src).strip(), "torch-overlay/2.15.0"
        )

    def test_stack_refuses_without_an_identity_or_over_existing_branches(self):
        git("config", "--unset", "user.email", cwd=self.src)
        before = checkout_state(self.src)
        env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
        with mock.patch.dict(os.environ, env):
            with self.assertRaisesRegex(OverlayError, "has no git identity"):
                stack(REPO, self.src, onto_head=True)
        self.assertEqual(checkout_state(self.src), before)
        git("config", "user.email", "ada@pytorch.invalid", cwd=self.src)
        git("branch", "torch-overlay/dynamo", cwd=self.src)
        before = checkout_state(self.src)
        with self.assertRaisesRegex(OverlayError, "torch-overlay/dynamo already exists"):
            stack(REPO, self.src, onto_head=True)
        self.assertEqual(checkout_state(self.src), before)

    def test_a_dependent_topic_is_stacked_on_the_one_it_needs(self):
        repo = copy_project(self.tmp / "project")
        topics_file = repo / "patches/topics.json"
        data = json.loads(topics_file.read_text())
        for entry in data["topics"]:
            if entry["name"] == "aot-autograd":
                entry["depends"] = "dynamo"
        topics_file.write_text(json.dumps(data))
        out = stack(repo, self.src, onto_head=True, only=["aot-autograd"])
        branches = self.topic_branches()
        self.assertEqual(sorted(branches), ["torch-overlay/aot-autograd", "torch-overlay/dynamo"])
        self.assertEqual(
            git(
                "merge-base", "torch-overlay/dynamo", "torch-overlay/aot-autograd", cwd=self.src
            ).strip(),  # fmt: skip
            git("rev-parse", "torch-overlay/dynamo", cwd=self.src).strip(),
        )
        found = read_topics(repo)
        self.assertEqual(
            len(branches["torch-overlay/aot-autograd"]),
            len(found.submitted(found.topics["dynamo"]))
            + len(found.submitted(found.topics["aot-autograd"])),
        )
        # One stack: its submit command covers both topics.
        self.assertIn("git checkout torch-overlay/aot-autograd && ghstack submit", out)
        self.assertNotIn("git checkout torch-overlay/dynamo && ghstack submit", out)

    def test_stack_refuses_a_patch_the_start_commit_already_has(self):
        """git am -3 makes no commit for a patch already applied: nothing else may be amended."""
        found = read_topics(REPO)
        pin = read_pin(REPO)
        # the last patch of the branch that git am can find again: a source-only patch's
        # preimage is not a blob this checkout has, so git refuses it as a conflict
        name = [
            n
            for n in found.submitted(found.topics["dynamo"])
            if not is_source_only(pin, (REPO / "patches" / n).read_bytes())
        ][-1]
        git("am", "-q", "-3", str(REPO / "patches" / name), cwd=self.src)
        before = checkout_state(self.src)
        with self.assertRaisesRegex(OverlayError, f"{name} is already in .*nothing was changed"):
            stack(REPO, self.src, onto_head=True, only=["dynamo"])
        self.assertEqual(checkout_state(self.src), before)

    def test_stack_refuses_bad_names_and_files_in_the_way(self):
        before = checkout_state(self.src)
        for prefix in ("my topic", "x..y", "-b"):
            with self.assertRaisesRegex(OverlayError, "not a valid branch name"):
                stack(REPO, self.src, onto_head=True, prefix=prefix)
        git("branch", "torch-overlay/dynamo/old", cwd=self.src)
        with self.assertRaisesRegex(OverlayError, "torch-overlay/dynamo already exists"):
            stack(REPO, self.src, onto_head=True, only=["dynamo"])
        git("branch", "-D", "torch-overlay/dynamo/old", cwd=self.src)
        # A file git ignores, where a PR's test goes, is the user's: never overwritten.
        test = stack_module.tests_for(REPO, read_topics(REPO).topics["dynamo"].patches[0])[0]
        (self.src / ".git/info/exclude").write_text(f"/{test}\n")
        (self.src / test).parent.mkdir(parents=True, exist_ok=True)
        (self.src / test).write_text("# mine\n")
        with self.assertRaisesRegex(OverlayError, f"in the way of the branch: {test}"):
            stack(REPO, self.src, onto_head=True, only=["dynamo"])
        self.assertEqual((self.src / test).read_text(), "# mine\n")
        self.assertEqual(checkout_state(self.src), before)

    def test_stack_keeps_a_real_author_and_refuses_unready_messages(self):
        repo = copy_project(self.tmp / "project")
        found = read_topics(repo)
        name = found.submitted(found.topics["dynamo"])[-1]  # the branch's head commit
        patch = repo / "patches" / name
        text = patch.read_text()
        patch.write_text(text.replace("From: torch-overlay <torch-overlay@localhost>",
                                      "From: Grace Hopper <grace@pytorch.invalid>", 1))  # fmt: skip
        stack(repo, self.src, onto_head=True, only=["dynamo"])
        author, committer, date = git(
            "log", "-1", "--format=%an <%ae>%x00%cn <%ce>%x00%at", "torch-overlay/dynamo",
            cwd=self.src,
        ).split("\0")  # fmt: skip
        self.assertEqual(author, "Grace Hopper <grace@pytorch.invalid>")
        self.assertEqual(committer, IDENTITY)
        self.assertGreater(int(date), time.time() - 3600)  # not the overlay's 2000-01-01
        git("branch", "-D", "torch-overlay/dynamo", cwd=self.src)
        patch.write_text(text.replace("Summary:\n", "Summary:\nMeasured on stock torch.\n", 1))
        before = checkout_state(self.src)
        with self.assertRaisesRegex(OverlayError, "(?s)not ready.*the PR text names 'stock'"):
            stack(repo, self.src, onto_head=True, only=["dynamo"])
        self.assertEqual(checkout_state(self.src), before)

    def test_a_topic_over_one_that_submits_nothing_stacks_on_the_one_below(self):
        repo = copy_project(self.tmp / "project")
        found = read_topics(repo)
        for carried in found.topics["dynamo"].patches:  # dynamo submits nothing
            patch = repo / "patches" / carried
            patch.write_text(patch.read_text().replace("\nTopic: dynamo\n",
                                                       "\nTopic: dynamo\nCarried-Only: ours\n", 1))  # fmt: skip

        def chain(topics):
            for entry in topics:
                if entry["name"] == "dynamo":
                    entry["depends"] = "dtensor-compile"
                if entry["name"] == "aot-autograd":
                    entry["depends"] = "dynamo"

        topics_file = repo / "patches/topics.json"
        data = json.loads(topics_file.read_text())
        chain(data["topics"])
        topics_file.write_text(json.dumps(data))
        out = stack(repo, self.src, onto_head=True, only=["aot-autograd"])
        self.assertEqual(
            sorted(self.topic_branches()),
            ["torch-overlay/aot-autograd", "torch-overlay/dtensor-compile"],
        )
        self.assertEqual(
            git("rev-parse", "torch-overlay/aot-autograd~1", cwd=self.src),
            git("rev-parse", "torch-overlay/dtensor-compile", cwd=self.src),
        )
        self.assertIn("git checkout torch-overlay/aot-autograd && ghstack submit", out)

    def test_ghstack_trailers_recorded_in_the_notes_reach_the_commit(self):
        message = ("[x] y\n\nSummary:\ns\n\nOverlay notes:\nfigures\n"
                   "ghstack-source-id: 1234abcd\n"
                   "Pull-Request: https://github.com/pytorch/pytorch/pull/180000\n"
                   "Topic: dynamo\n")  # fmt: skip
        self.assertEqual(
            stack_module.upstream_message(message),
            "[x] y\n\nSummary:\ns\n\nghstack-source-id: 1234abcd\n"
            "Pull-Request: https://github.com/pytorch/pytorch/pull/180000\n",
        )

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
