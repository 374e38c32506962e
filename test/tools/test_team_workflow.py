# Owner(s): ["module: tools"]
"""The overlay tools as a team uses them: a pulled patch is picked up and never reverted,
nothing in torch_overlay/ is lost by sync, and bad input gets one line and a distinct exit
code (issue 23). Scratch projects as in test_overlay_tools.py."""

import fcntl
import io
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

from test_overlay_tools import GOOD_MESSAGE, REPO_ROOT, TARGET, OverlayProject, snapshot
from torch.testing._internal.common_utils import TestCase, run_tests

from tools import cli, overlay_repo
from tools.activate import activate
from tools.add import add
from tools.base import PIN_FILE, SERIES_FILE, OverlayError, git, installed_torch
from tools.export import export
from tools.status import status
from tools.sync import sync
from tools.sync_state import LOCK_FILE, STATE_FILE, behind_warning

PATCH = "0001-pipelining-Add-a-marker.patch"
TEAMMATE = "A teammate's clearer summary of the marker."


def main(*args: str) -> tuple[int, str, str]:
    """The CLI in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exit:  # argparse
            code = exit.code
    return code, out.getvalue(), err.getvalue()


class TeamProject(OverlayProject):
    """A scratch project whose one patch is exported and synced, as after a clone."""

    def __init__(self, root: Path):
        super().__init__(root)
        sync(root)
        self.commit_edit(TARGET, "import collections",
                         'OVERLAY_MARKER = "hello"\nimport collections', GOOD_MESSAGE)  # fmt: skip
        export(root)

    def pull_teammate_summary(self, summary: str = TEAMMATE) -> None:
        """What `git pull` of a teammate's reworded patch does to patches/."""
        patch = self.root / "patches" / PATCH
        text, count = re.subn(r"(?m)(^Summary:\n).*\n", rf"\g<1>{summary}\n", patch.read_text())
        assert count == 1
        patch.write_text(text)

    def git(self, *args: str) -> str:
        return git(*args, cwd=self.overlay, fixed_identity=False).strip()

    def head_message(self) -> str:
        return self.git("log", "-1", "--format=%B")


class TeamTestCase(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-team-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.project = TeamProject(self.tmp)


class PullSafeSyncTest(TeamTestCase):
    def test_pulled_patch_is_picked_up_not_reverted(self):
        self.project.pull_teammate_summary()
        pulled = snapshot(self.tmp / "patches")
        # export before sync would write the overlay's old summary over the teammate's.
        with self.assertRaisesRegex(OverlayError, rf"patches/{PATCH} \(changed\).*sync first"):
            export(self.tmp)
        self.assertEqual(snapshot(self.tmp / "patches"), pulled)
        # run, status and verify say the overlay is behind.
        self.assertIn(f"behind patches/ (changed since the last sync: patches/{PATCH} (changed)",
                      behind_warning(self.tmp))  # fmt: skip
        self.assertIn(f"BEHIND patches/: changed since the last sync: patches/{PATCH} (changed)",
                      status(self.tmp))  # fmt: skip
        # sync rebuilds the overlay from the pulled patch, without --force.
        sync(self.tmp)
        self.assertIn(TEAMMATE, self.project.head_message())
        self.assertEqual(behind_warning(self.tmp), "")
        self.assertNotIn("BEHIND", status(self.tmp))
        export(self.tmp)
        self.assertEqual(snapshot(self.tmp / "patches"), pulled)

    def test_both_sides_changed_refuses_naming_them(self):
        self.project.pull_teammate_summary()
        self.project.commit_edit(
            TARGET, 'OVERLAY_MARKER = "hello"', 'OVERLAY_MARKER = "mine"',
            GOOD_MESSAGE.replace("Add a marker", "Change the marker"),
        )  # fmt: skip
        before = self.project.state()
        with self.assertRaisesRegex(
            OverlayError,
            rf"both sides changed.*patches/{PATCH} \(changed\).*"
            r"patches/0002-pipelining-Change-the-marker.patch \(new\)",
        ):
            sync(self.tmp)
        self.assertEqual(self.project.state(), before)
        with self.assertRaisesRegex(OverlayError, f"patches/{PATCH}"):
            export(self.tmp)
        self.assertEqual(self.project.state(), before)
        # --force takes the pulled series and keeps the local commit on a branch.
        said = []
        sync(self.tmp, force=True, say=said.append)
        self.assertIn(TEAMMATE, self.project.head_message())
        (saved,) = [line.split()[-1] for line in said if "saved/" in line]
        self.assertEqual(self.project.git("rev-parse", saved), before[0].strip())

    def test_an_overlay_without_a_record_is_never_guessed_about(self):
        record = self.project.overlay / ".git" / STATE_FILE
        record.unlink()  # as made by an older torch-overlay
        sync(self.tmp)  # same as patches/: rebuilt, and recorded from now on
        self.assertTrue(record.exists())
        record.unlink()
        self.project.pull_teammate_summary()
        before = self.project.state()
        with self.assertRaisesRegex(OverlayError, "predates the record.*sync --force"):
            sync(self.tmp)
        self.assertEqual(self.project.state(), before)
        sync(self.tmp, force=True)
        self.assertIn(TEAMMATE, self.project.head_message())

    def test_force_keeps_uncommitted_edits_in_the_stash(self):
        target = self.project.overlay / TARGET
        target.write_text(target.read_text().replace('"hello"', '"edited"'))
        said = []
        sync(self.tmp, force=True, say=said.append)
        self.assertIn('"hello"', target.read_text())
        self.assertIn("torch-overlay sync --force", self.project.git("stash", "list"))
        self.assertIn('"edited"', self.project.git("stash", "show", "-p"))
        self.assertIn("git stash", said[0])

    def test_stashes_branches_tags_and_reflog_survive_sync(self):
        # The natural route: export needs a clean tree, so stash, export, sync.
        target = self.project.overlay / TARGET
        target.write_text(target.read_text().replace('"hello"', '"wip"'))
        self.project.git("stash", "push", "-m", "my wip")
        old_head = self.project.git("rev-parse", "HEAD")
        self.project.git("branch", "side")
        self.project.git("tag", "mine")
        export(self.tmp)
        for force in (False, True):
            summary = f"{TEAMMATE} (force={force})"
            self.project.pull_teammate_summary(summary)  # so that sync really rebuilds
            sync(self.tmp, force=force)
            self.assertIn(summary, self.project.head_message())
            self.assertIn("my wip", self.project.git("stash", "list"))
            self.assertEqual(self.project.git("rev-parse", "side"), old_head)
            self.assertEqual(self.project.git("rev-parse", "mine^{commit}"), old_head)
            self.assertIn(old_head, self.project.git("reflog", "--format=%H"))
            self.assertEqual(self.project.git("symbolic-ref", "--short", "HEAD"), "main")
            export(self.tmp)

    def test_sigint_at_any_step_of_the_swap_leaves_an_overlay(self):
        self.project.pull_teammate_summary()
        self.project.git("stash", "list")
        old_head = self.project.git("rev-parse", "HEAD")
        real_build, real_run, real_rename = overlay_repo.build, subprocess.run, os.rename
        armed, calls = [False], [0]

        def build(*args, **kwargs):  # the scratch build may be interrupted: nothing to see
            real_build(*args, **kwargs)
            armed[0] = True

        def interrupt_at(step, real):
            def call(*args, **kwargs):
                if armed[0]:
                    calls[0] += 1
                    if calls[0] == step:
                        os.kill(os.getpid(), signal.SIGINT)
                return real(*args, **kwargs)

            return call

        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        step = 0
        while True:
            step += 1
            armed[0], calls[0] = False, 0
            try:
                with mock.patch("tools.overlay_repo.build", build), \
                        mock.patch("subprocess.run", interrupt_at(step, real_run)), \
                        mock.patch("os.rename", interrupt_at(step, real_rename)):  # fmt: skip
                    sync(self.tmp)
            except KeyboardInterrupt:
                interrupted = True
            else:
                interrupted = False
            head = self.project.git("rev-parse", "HEAD")
            self.assertTrue(head == old_head or TEAMMATE in self.project.head_message(), step)
            self.assertEqual(self.project.git("status", "--porcelain"), "", step)
            self.assertEqual([p for p in self.tmp.glob(".torch_overlay.*") if p.is_dir()], [])
            if not interrupted:
                break
        self.assertGreater(step, 3)  # the interrupts did land inside the swap
        self.assertIn(TEAMMATE, self.project.head_message())

    def test_a_second_sync_waits_for_the_first(self):
        with open(self.tmp / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # as a running sync holds it
            err = io.StringIO()
            with redirect_stderr(err):
                second = threading.Thread(target=sync, args=(self.tmp,))
                second.start()
                time.sleep(1)
                self.assertTrue(second.is_alive())
                fcntl.flock(lock, fcntl.LOCK_UN)
                second.join(60)
        self.assertFalse(second.is_alive())
        self.assertIn("waiting for another torch-overlay command", err.getvalue())
        self.assertEqual(self.project.git("status", "--porcelain"), "")

    def test_recovers_an_overlay_left_aside_by_an_interrupted_swap(self):
        old_head = self.project.git("rev-parse", "HEAD")
        self.project.git("branch", "side")
        leftover = self.tmp / ".torch_overlay.abc123"
        leftover.mkdir()
        os.rename(self.project.overlay, leftover / "old")  # SIGINT between the two renames
        said = []
        sync(self.tmp, say=said.append)
        self.assertIn("recovered torch_overlay/", said[0])
        self.assertEqual(self.project.git("rev-parse", "side"), old_head)
        self.assertFalse(leftover.exists())


class OneLineErrorsTest(TeamTestCase):
    def assert_one_line(self, code: int, verb: str, *args: str, text: str = "") -> str:
        got, _, err = main("--repo", str(self.tmp), verb, *args)
        self.assertEqual(got, code, err)
        self.assertNotIn("Traceback", err)
        lines = err.splitlines()
        self.assertTrue(all(line.startswith("torch-overlay") for line in lines), err)
        self.assertIn(text, lines[-1])
        return lines[-1]

    def test_patch_deleted_but_still_in_series(self):
        (self.tmp / "patches" / PATCH).unlink()
        for verb, args in (("sync", ()), ("status", ()), ("run", ("--", "true")), ("export", ()),
                           ("check", ())):  # fmt: skip
            self.assert_one_line(3, verb, *args, text=PATCH)

    def test_non_utf8_patch(self):
        patch = self.tmp / "patches" / PATCH
        patch.write_bytes(patch.read_bytes().replace(b"The marker", b"The \xe9marker"))
        for verb in ("check", "status"):
            self.assert_one_line(3, verb, text=f"patches/{PATCH} line 7: b'\\xe9' is not UTF-8")

    def test_invalid_or_incomplete_base_json(self):
        pin = self.tmp / PIN_FILE
        data = json.loads(pin.read_text())
        pin.write_text("{not json")
        self.assert_one_line(3, "status", text="patches/base.json is not valid JSON")
        del data["git_version"]
        pin.write_text(json.dumps(data))
        self.assert_one_line(3, "status", text="patches/base.json has no 'git_version' key")
        pin.write_text("[]")
        self.assert_one_line(3, "sync", text="patches/base.json should be an object")

    def test_check_names_orphan_patches_and_duplicate_series_lines(self):
        orphan = self.tmp / "patches" / "0002-orphan.patch"
        shutil.copy(self.tmp / "patches" / PATCH, orphan)
        code, out, _ = main("--repo", str(self.tmp), "check")
        self.assertEqual(code, 1)
        self.assertIn(f"patches/0002-orphan.patch: not named in {SERIES_FILE}", out)
        orphan.unlink()
        series = self.tmp / SERIES_FILE
        series.write_text(series.read_text() + PATCH + "\n")
        self.assert_one_line(3, "check", text=f"{SERIES_FILE} line 3 names {PATCH} again "
                             "(first on line 2)")  # fmt: skip

    def test_exit_codes(self):
        self.assertEqual(main("--repo", str(self.tmp), "no-such-verb")[0], 2)
        self.assertEqual(main("--repo", str(self.tmp), "run")[0], 2)
        with mock.patch("tools.status.status", side_effect=RuntimeError("boom\nmore")):
            line = self.assert_one_line(4, "status")
            self.assertEqual(line, "torch-overlay status: internal error: RuntimeError: boom "
                             "(a bug; TORCH_OVERLAY_DEBUG=1 shows the traceback)")  # fmt: skip
            with mock.patch.dict(os.environ, {"TORCH_OVERLAY_DEBUG": "1"}):
                code, _, err = main("--repo", str(self.tmp), "status")
            self.assertEqual(code, 4)
            self.assertIn("Traceback", err)

    def test_add_accepts_relative_and_absolute_paths_and_explains_the_rest(self):
        site = installed_torch().site
        self.assertEqual(add(self.tmp, ["./torch/distributed/pipelining/_utils.py"]),
                         ["torch/distributed/pipelining/_utils.py"])  # fmt: skip
        absolute = site / "torch/distributed/pipelining/stage.py"
        self.assertEqual(add(self.tmp, [str(absolute)]), ["torch/distributed/pipelining/stage.py"])
        header = site / "torch/include/torch/csrc/autograd/utils/grad_layout_contract.h"
        self.assertEqual(add(self.tmp, [str(header)]),
                         ["torch/csrc/autograd/utils/grad_layout_contract.h"])  # fmt: skip
        before = self.project.state()
        for given, message in (
            ("torch.distributed.pipelining.schedules",
             "is a module name; give its file: torch/distributed/pipelining/schedules.py"),
            ("torch.distributed.pipelining",
             "is a module name; give its file: torch/distributed/pipelining/__init__.py"),
            ("torch/distributed/pipelining", "is a directory"),
            ("/etc/hostname", "not in the installed torch"),
        ):  # fmt: skip
            with self.assertRaisesRegex(OverlayError, message):
                add(self.tmp, [given])
        self.assertEqual(self.project.state(), before)


class DriftAndStaleStatesTest(TeamTestCase):
    def drift(self) -> str:
        """Make base.json disagree with the wheel (never edit the shared site-packages)."""
        pin = json.loads((self.tmp / PIN_FILE).read_text())
        pin["files"][TARGET] = "0" * 64
        (self.tmp / PIN_FILE).write_text(json.dumps(pin))
        return (installed_torch().site / TARGET).read_bytes()

    def test_status_shows_drift_and_activate_refuses(self):
        from tools.base import sha256

        actual = sha256(self.drift())
        text = status(self.tmp)
        self.assertIn(f"DRIFT: {TARGET}: the wheel's sha256 {actual[:16]}…, base.json's "
                      f"{'0' * 16}…", text)  # fmt: skip
        hint = f"{sys.executable} -m pip install --force-reinstall --no-deps torch==2.15.0"
        self.assertIn(hint, text)
        pth = self.tmp / "venv.pth"
        with mock.patch("tools.activate.pth_path", return_value=pth):
            with self.assertRaisesRegex(OverlayError, f"differ from patches/base.json.*{hint}"):
                activate(self.tmp)
        self.assertFalse(pth.exists())
        self.assertFalse((self.tmp / ".overlay-active").exists())

    def test_status_shows_a_stale_activation(self):
        pth = self.tmp / "venv.pth"
        with mock.patch("tools.activate.pth_path", return_value=pth), \
                mock.patch("tools.status.pth_path", return_value=pth):  # fmt: skip
            activate(self.tmp)
            self.assertIn("up to date with torch_overlay/", status(self.tmp))
            target = self.project.overlay / TARGET
            target.write_text(target.read_text().replace('"hello"', '"edited"'))
            self.assertIn("venv: STALE: .overlay-active/ (the last activate) differs",
                          status(self.tmp))  # fmt: skip


class HelpTest(TestCase):
    def test_every_verb_and_option_has_help_and_there_is_a_version(self):
        code, out, _ = main("--version")
        self.assertEqual(code, 0)
        self.assertRegex(out, r"^torch-overlay \S+")
        code, out, _ = main("--help")
        self.assertIn("exit codes:", out)
        verbs = cli.verb_parsers(cli.build_parser())
        self.assertEqual(set(verbs), set(cli.HELP))
        for verb, parser in verbs.items():
            self.assertTrue(parser.description, verb)
            for action in parser._actions:
                self.assertTrue(action.help, f"{verb} {action.dest}")
        self.assertIn("example", main("run", "--help")[1])


CHILD = """\
import os, signal, sys, time
def record(signum, frame):
    with open(sys.argv[1], "w") as f:
        f.write(str(signum))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of it, as a command without a handler would
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, record)
open(sys.argv[2], "w").close()
time.sleep(60)
"""

COUNT_SIGINT = """\
import signal, sys, time
count = []
signal.signal(signal.SIGINT, lambda signum, frame: count.append(signum))
open(sys.argv[1], "w").close()
while not count:
    time.sleep(0.05)
time.sleep(1)  # a second, forwarded SIGINT would arrive meanwhile
sys.exit(len(count))
"""


class RunLikeEnvTest(TestCase):
    """`run` in real processes (none imports torch)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = Path(tempfile.mkdtemp(prefix="overlay-run-env-test-"))
        cls.project = TeamProject(cls.tmp)
        (cls.tmp / "child.py").write_text(CHILD)
        cls.tmpdir = cls.tmp / "tmpdir"  # where run puts its scratch tree
        cls.tmpdir.mkdir()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)
        super().tearDownClass()

    def start(self, *command: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "--repo", str(self.tmp), "run", "--", *command],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TMPDIR": str(self.tmpdir)},
            start_new_session=True,  # no terminal: as under a scheduler
        )  # fmt: skip

    def test_signals_reach_the_command_and_its_status_comes_back(self):
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            got, ready = self.tmp / f"got-{signum}", self.tmp / f"ready-{signum}"
            proc = self.start(sys.executable, str(self.tmp / "child.py"), str(got), str(ready))
            deadline = time.monotonic() + 60
            while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.send_signal(signum)
            _, err = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, 128 + signum, err)
            self.assertEqual(got.read_text(), str(int(signum)))
            self.assertEqual(list(self.tmpdir.iterdir()), [])  # the scratch tree is gone

    def test_ctrl_c_in_a_terminal_reaches_the_command_once(self):
        (self.tmp / "count.py").write_text(COUNT_SIGINT)
        ready = self.tmp / "count-ready"
        pid, terminal = pty.fork()  # run is the terminal's foreground process group
        if pid == 0:
            os.chdir(REPO_ROOT)
            os.execv(sys.executable, [sys.executable, "-m", "tools.cli", "--repo", str(self.tmp),
                     "run", "--", sys.executable, str(self.tmp / "count.py"), str(ready)])  # fmt: skip
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.write(terminal, b"\x03")  # Ctrl-C: the terminal signals the whole group
        while True:
            try:
                if not os.read(terminal, 1024):
                    break
            except OSError:  # the terminal closed
                break
        _, wait_status = os.waitpid(pid, 0)
        os.close(terminal)
        self.assertEqual(os.waitstatus_to_exitcode(wait_status), 1)  # one SIGINT, not two

    def test_missing_command_and_leaked_trees(self):
        leaked = self.tmpdir / "torch-overlay-run-999999999-abc"  # its run was SIGKILLed
        leaked.mkdir()
        proc = self.start("no-such-command-xyz")
        _, err = proc.communicate(timeout=60)
        self.assertEqual((proc.returncode, err),
                         (127, "torch-overlay run: no-such-command-xyz: command not found\n"))  # fmt: skip
        proc = self.start(sys.executable, "-c", "import sys; sys.exit(5)")
        self.assertEqual(proc.wait(timeout=60), 5)
        self.assertEqual(list(self.tmpdir.iterdir()), [])

    def test_refuses_command_lines_that_would_run_stock_torch(self):
        for command, text in (
            (
                ["env", "PYTHONPATH=src", sys.executable, "-c", "pass"],
                "env PYTHONPATH=src replaces",
            ),
            ([sys.executable, "-I", "-c", "pass"], "python -I ignores PYTHONPATH"),
            ([sys.executable, "-E", "-c", "pass"], "python -E ignores PYTHONPATH"),
            ([sys.executable, "-S", "-c", "pass"], "python -S skips the site module"),
        ):
            proc = self.start(*command)
            _, err = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, 3, err)
            (line,) = err.splitlines()
            self.assertIn(f"torch-overlay run: error: {text}", line)
        # Setting PYTHONPATH before run keeps it, after the hook.
        code = "import os, sys; sys.exit(0 if 'torch_overlay_finder' in sys.modules else 9)"
        proc = subprocess.run(
            [sys.executable, "-m", "tools.cli", "--repo", str(self.tmp), "run", "--",
             sys.executable, "-c", code],
            cwd=REPO_ROOT, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": f"{self.tmp}{os.pathsep}{REPO_ROOT}"},
        )  # fmt: skip
        self.assertEqual(proc.returncode, 0, proc.stderr)


if __name__ == "__main__":
    run_tests()
