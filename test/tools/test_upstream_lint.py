# Owner(s): ["module: tools"]
"""UPSTREAMLINT: upstream's lint rules on patched files, counting only what a patch adds."""

import json
import shutil
import tempfile
from pathlib import Path

from test_overlay_tools import TARGET, OverlayProject
from torch.testing._internal.common_utils import TestCase, run_tests

from tools.base import git
from tools.export import export
from tools.lint_upstream import flake8, lint, new_findings
from tools.sync import sync


class UpstreamLintTest(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="upstream-lint-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.project = OverlayProject(self.tmp)
        sync(self.tmp)

    def messages(self) -> list[dict]:
        export(self.tmp)
        return [json.loads(line) for line in lint(self.tmp)]

    def test_clean_patch_gives_no_message(self):
        self.project.commit_edit(
            TARGET, "\n\ndef reverse_closure(", "\n\nNAME = logger.name\n\n\ndef reverse_closure(",
            "[pipelining] A",
        )  # fmt: skip
        self.assertEqual(self.messages(), [])

    def test_too_many_blank_lines_is_flagged_against_its_patch(self):
        self.project.commit_edit(
            TARGET, "\n\n\ndef reverse_closure(", "\n\n\n\ndef reverse_closure(", "[pipelining] A"
        )
        self.project.commit_edit(
            TARGET, "def construct_reverse_graph(", "@torch.no_grad()\n\ndef construct_reverse_graph(",
            "[pipelining] B",
        )  # fmt: skip
        messages = self.messages()
        first, second = sorted(p.name for p in (self.tmp / "patches").glob("0*.patch"))
        # E303 itself is off in upstream's flake8 and preview-only in ruff; upstream catches the
        # extra blank line with its formatter, reported as PYFMT.
        self.assertEqual(
            {(m["path"], m["description"].split(" ")[1]) for m in messages},
            {(f"patches/{first}", "PYFMT"), (f"patches/{second}", "E304"),
             (f"patches/{second}", "PYFMT")},
        )  # fmt: skip
        self.assertTrue(all(m["description"].startswith(f"{TARGET}:") for m in messages))

    def test_warning_before_the_patch_is_not_flagged_when_the_patch_shifts_it(self):
        # The first patch adds an unused import; the second moves it down by two lines.
        self.project.commit_edit(
            TARGET, "import collections", "import collections\nimport sys", "[pipelining] A"
        )
        file = self.project.overlay / TARGET
        text = file.read_text().replace("import collections", "import collections\nimport copy")
        file.write_text(text.replace("logger = ", "COPY = copy.copy\nlogger = "))
        git("commit", "-q", "-a", "-m", "[pipelining] B", cwd=self.project.overlay)
        (message,) = self.messages()
        self.assertEqual(message["path"], "patches/0001-pipelining-A.patch")
        self.assertTrue(message["description"].startswith(f"{TARGET}:4: F401 "))
        self.assertIn("[flake8, ruff, upstream settings]", message["description"])

    def test_warning_in_the_base_file_is_not_flagged_when_the_patch_shifts_it(self):
        path = "torch/distributed/pipelining/microbatch.py"
        self.project.commit_edit(
            path, "logger = ", "NAME = __name__\n\nlogger = ", "[pipelining] Shift a warning"
        )
        stock = git("show", "HEAD^:" + path, cwd=self.project.overlay).encode()
        self.assertIn("B903", {f.code for f in flake8(stock, path, self.tmp)})  # upstream's own
        self.assertEqual(self.messages(), [])

    def test_a_repeated_warning_counts_once_per_occurrence(self):
        base = b"f = lambda: 0\n"
        shifted = b'"""Doc."""\n\nf = lambda: 0\n'
        path = "torch/distributed/probe.py"
        self.assertEqual(new_findings(base, shifted, path, self.tmp, {}), [])
        repeated = shifted + b"f = lambda: 0\n"
        self.assertEqual(
            {(f.tool, f.code, f.line) for f in new_findings(base, repeated, path, self.tmp, {})},
            {("flake8", "E731", 4), ("ruff", "E731", 4)},
        )


if __name__ == "__main__":
    run_tests()
