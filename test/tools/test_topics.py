# Owner(s): ["module: tools"]
"""Topics, upstream status, authorship and the PR text: what `check` verifies of what
`stack` submits, on copies of this project's series."""

import json
import shutil
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

from tools import overlay_repo, stack
from tools.base import (
    SERIES_FILE,
    git,
    installed_torch,
    pr_text,
    read_pin,
    read_series,
)
from tools.check import (
    author_problems,
    message_problems,
    shared_test_problems,
    submitted_forms,
    trailer_problems,
)
from tools.topics import TOPICS_FILE, patch_rows, problems, read_topics

REPO = Path(__file__).resolve().parents[2]


class TopicsTest(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-topics-test-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.repo = self.tmp / "project"
        shutil.copytree(REPO / "patches", self.repo / "patches")
        shutil.copytree(REPO / "test", self.repo / "test",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip

    def edit_topics(self, edit) -> None:
        path = self.repo / TOPICS_FILE
        data = json.loads(path.read_text())
        edit(data["topics"])
        path.write_text(json.dumps(data))

    def test_the_series_topics_are_consistent(self):
        self.assertEqual(problems(REPO), [])
        found = read_topics(REPO)
        self.assertGreaterEqual(len([t for t in found.topics.values() if found.submitted(t)]), 3)
        self.assertEqual(sorted(found.of_patch), sorted(read_series(REPO)))
        # 0001 is carried (its reason recorded), the stopgap too; both stay in the overlay.
        carried = {name.split("-", 2)[1]: why for name, why in found.carried.items()}
        self.assertEqual(sorted(carried), ["DTensor", "autograd"])
        self.assertIn("#180511", carried["autograd"])
        self.assertTrue(carried["DTensor"].startswith("wheel stopgap for "))

    def test_status_and_verify_rows_name_topic_and_upstream_status(self):
        rows = {r["patch"][:40]: r for r in patch_rows(REPO, {"x"})}
        self.assertEqual(len(rows), len(read_series(REPO)))
        clone = rows["[autograd] clone_obey_contract: a single"]
        self.assertEqual(clone["topic"], "autograd")
        self.assertTrue(clone["upstream"].startswith("carried only: #180511"))
        self.assertEqual(rows["[dynamo] Guard that an attribute found t"]["upstream"], "submit")
        (self.repo / TOPICS_FILE).unlink()  # inconsistent topics: no rows (check says why)
        self.assertEqual(patch_rows(self.repo, set()), [])

    def test_topic_problems_are_named(self):
        name = read_series(self.repo)[3]
        patch = self.repo / "patches" / name
        patch.write_bytes(patch.read_bytes().replace(b"\nTopic: dtensor-partial\n", b"\n", 1))

        def edit(topics):
            topics.append({"name": "Bad Name", "title": "x", "depends": "dynamo"})
            topics.append({"name": "late", "title": "x", "depends": "later"})
            topics.append({"name": "later", "title": "x", "depends": "dynamo"})

        self.edit_topics(edit)
        self.assertExpectedInline(
            "\n".join(problems(self.repo)).replace(name, "PATCH"),
            """\
patches/topics.json: topic name 'Bad Name' should be lower-case-with-dashes
patches/topics.json: 'late' depends on 'later', declared after it
patches/topics.json: 'dynamo' is needed by more than one topic; ghstack submits a dependent topic together with the one it needs, so chain them instead
PATCH: no 'Topic: <name>' line (topics: autograd, dtensor-partial, pipelining, dtensor-compile, dynamo, aot-autograd, strategy-validator, local-tensor, Bad Name, late, later)
patches/topics.json: topic 'Bad Name' has no patch
patches/topics.json: topic 'late' has no patch
patches/topics.json: topic 'later' has no patch""",
        )
        (self.repo / TOPICS_FILE).write_text("{not json")
        self.assertIn("must hold {'topics'", problems(self.repo)[0])

    def test_check_applies_what_stack_submits(self):
        """Work committed after the wheel stopgap, next to its lines, applies on a wheel but
        not where build and stack leave the stopgap out: check names the patch and file."""
        pin, torch = read_pin(self.repo), installed_torch()
        overlay = self.tmp / "overlay"
        overlay_repo.build(self.repo, overlay, pin, torch)
        path = overlay / "torch/distributed/tensor/_dispatch.py"
        text = path.read_text()
        anchor = "        tracing = _are_we_tracing()\n"
        self.assertIn(anchor, text)
        path.write_text(text.replace(anchor, anchor + "        _ = tracing  # new work\n", 1))
        message = ("[DTensor] New work\n\nSummary:\nx\n\nTest Plan:\n"
                   "python test/distributed/tensor/test_partial_copy.py\n\n"
                   "Overlay notes:\nTopic: dtensor-compile\n")  # fmt: skip
        git("commit", "-q", "-am", message, cwd=overlay)
        new = git("format-patch", "-1", "-o", str(self.repo / "patches"), cwd=overlay).strip()
        name = Path(new).name
        with open(self.repo / SERIES_FILE, "a") as series:
            series.write(f"{name}\n")
        self.assertEqual(
            overlay_repo.form_problems(self.repo, pin, torch, submitted_forms(self.repo)),
            [
                f"{name} does not apply in the source-build form (build: no wheel stopgaps) "
                "(conflicts in: torch/distributed/tensor/_dispatch.py)",
                f"{name} does not apply in topic 'dtensor-compile' as stack submits it "
                "(conflicts in: torch/distributed/tensor/_dispatch.py)",
            ],
        )
        # The series as it is has every form applying.
        shutil.copy(REPO / SERIES_FILE, self.repo / SERIES_FILE)
        self.assertEqual(
            overlay_repo.form_problems(self.repo, pin, torch, submitted_forms(self.repo)), []
        )

    def test_check_reports_misspelt_trailers_and_shared_test_files(self):
        names = read_series(self.repo)
        carried = next(
            n for n in names if "Carried-Only:" in (self.repo / "patches" / n).read_text()
        )
        patch = self.repo / "patches" / carried
        patch.write_text(patch.read_text().replace("Carried-Only:", "Carried-only:", 1))
        found = trailer_problems(self.repo, names)
        self.assertEqual(len(found), 1, found)
        self.assertTrue(found[0].startswith(f'{carried}: "Carried-only: #180511'), found)
        self.assertIn("is not read; the project's lines are spelt", found[0])
        self.assertEqual(shared_test_problems(self.repo), [])
        found_topics = read_topics(REPO)
        first, second = found_topics.submitted(found_topics.topics["pipelining"])[:2]
        test = stack.tests_for(self.repo, first)[0]
        patch = self.repo / "patches" / second
        plan = patch.read_text().split("Test Plan:\n", 1)
        patch.write_text(f"{plan[0]}Test Plan:\npython {test}\n{plan[1]}")
        self.assertEqual(
            shared_test_problems(self.repo),
            [
                f"{second}: its Test Plan names {test}, as {first} does; give each PR of a topic "
                "its own test file"
            ],
        )

    def test_check_reports_placeholder_authors_and_fake_dates(self):
        names = read_series(self.repo)
        self.assertEqual(author_problems(self.repo, names), [])  # unassigned: fine
        placeholders = {
            names[
                0
            ]: "From: Seed e7163124 maintainers\n <maintainers@users.noreply.a-seed-e7163124.example>",
            names[1]: "From: Jane Doe <jane@example.com>",
            names[
                2
            ]: "From: Grace Hopper <grace@pytorch.invalid>\nDate: Thu, 1 Jan 1970 00:00:00 +0000",
            # a real author on the overlay's "no date yet": build and stack date it
            names[3]: "From: Ada Lovelace <ada@pytorch.invalid>",
        }
        for name, line in placeholders.items():
            patch = self.repo / "patches" / name
            text = patch.read_text().replace(
                "From: torch-overlay <torch-overlay@localhost>", line, 1
            )
            if "Date:" in line:
                text = text.replace("Date: Sat, 1 Jan 2000 00:00:00 +0000\n", "", 1)
            patch.write_text(text)
        found = author_problems(self.repo, names)
        self.assertEqual(len(found), 3, found)
        self.assertIn(
            "'Seed e7163124 maintainers <maintainers@users.noreply.a-seed-e7163124.example>' is a placeholder",
            found[0],
        )
        self.assertIn("'Jane Doe <jane@example.com>' is a placeholder", found[1])
        self.assertIn("author date 'Thu, 01 Jan 1970 00:00:00 +0000' is not a real date", found[2])

    def test_the_pr_text_is_checked_and_the_notes_are_not(self):
        body = (
            "Summary:\nRepairs a thing on torch 2.15.0 (stock) with the series.\n\n"
            "Test Plan:\npython test/distributed/tensor/test_partial_copy.py\n\n"
            "Overlay notes:\nstock vs overlay: torch-overlay upstream-test, "
            "someone/pytorch@0123abcd; benchmarks/dtensor_dispatch.py\n"
            "Topic: dtensor-partial\nWheel-Stopgap: x\n"
        )
        text = f"Subject: [PATCH] [DTensor] Do it\n\n{body}---\n diff\n".encode()
        self.assertEqual(
            [p.split("(", 1)[0] for p in message_problems(self.repo, "p.patch", text)],
            [
                "p.patch: the PR text names 'the series' ",
                "p.patch: the PR text names 'stock' ",
                "p.patch: the PR text names 'torch 2.15.0' ",
            ],
        )
        self.assertEqual(
            pr_text(body),
            "Summary:\nRepairs a thing on torch 2.15.0 (stock) with the series.\n\n"
            "Test Plan:\npython test/distributed/tensor/test_partial_copy.py\n",
        )
        # What else reads as this project's, or as a ghstack update, and what does not.
        for leak in ("Measured on PyTorch 2.15.0.", "With torch==2.15.0 installed.",
                     "See https://github.com/kerer-ai/pytorch/blob/652b7f394e70/test/x.py.",
                     "Copied from kerer-ai/pytorch at 652b7f3.", "As this series does.",
                     "With our overlay active.", "Overlay Notes:",
                     "Pull Request resolved: https://github.com/pytorch/pytorch/pull/180511",
                     "As review rev25d found.", "See ReviewRev25bTest.",
                     "Issue 24b, item 1."):  # fmt: skip
            leaky = text.replace(b"Repairs a thing", leak.encode())
            self.assertTrue(
                any(
                    "the PR text names" in p for p in message_problems(self.repo, "p.patch", leaky)
                ),
                leak,
            )
        for fine in ("Since torch 2.0 the series of views is kept.", "See pytorch/pytorch@0123abcd.",
                     "Uses NVIDIA/cutlass@0123abcd.", "Fixes the guard so that it holds.",
                     "See issue #172421 and the review on #183363."):  # fmt: skip
            clean = text.replace(
                b"Repairs a thing on torch 2.15.0 (stock) with the series.", fine.encode()
            )
            self.assertEqual(message_problems(self.repo, "p.patch", clean), [], fine)
        # Fixes lines count only in the PR text.
        text = text.replace(b"Topic:", b"Fixes #1\nTopic:")
        self.assertIn(
            "p.patch: patches/upstream.json says it fixes #1; add the line 'Fixes #1'",
            message_problems(self.repo, "p.patch", text, [1]),
        )


if __name__ == "__main__":
    run_tests()
