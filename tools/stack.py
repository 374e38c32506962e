"""`torch-overlay stack --pytorch-src DIR`: the contribution branch prepared for
`ghstack submit`, and an offline rehearsal of the pull requests ghstack would open.

Each commit is one patch plus the tests its Test Plan names, placed at their upstream paths
(``test/...`` here mirrors upstream's ``test/``), together with files beside a test that
share its name (e.g. ``test_x.cpp``). An upstream file is never overwritten. The rehearsal
runs ghstack's own fake GitHub (``ghstack.github_fake``) against scratch repositories that
borrow the checkout's objects through git alternates, so nothing is pushed anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path

from tools import source_branch
from tools.base import OverlayError, git, patch_message
from tools.check import TEST_COMMAND
from tools.overlay_repo import NEEDS_BUILD_TRAILER


def tests_for(repo: Path, patch_name: str) -> list[str]:
    """Repo-relative test files of a patch: those its Test Plan names, and their siblings."""
    _, body = patch_message((repo / "patches" / patch_name).read_bytes())
    plan = body.split("Test Plan:", 1)[-1]
    files = []
    for test in dict.fromkeys(TEST_COMMAND.findall(plan)):
        path = repo / test
        files += sorted(p.relative_to(repo).as_posix() for p in path.parent.glob(f"{path.stem}.*"))
    return files


def upstream_message(message: str) -> str:
    """The commit message without this project's own trailer."""
    message = re.sub(rf"^{NEEDS_BUILD_TRAILER}:.*\n?", "", message, flags=re.M)
    return message.rstrip() + "\n"


def prepare(repo: Path, src: Path, branch: str | None, onto_head: bool) -> source_branch.BranchPlan:
    branch_plan = source_branch.plan(repo, src, branch, onto_head)
    checkout = branch_plan.checkout
    tests = {name: tests_for(repo, name) for name, _ in branch_plan.patches}
    clashes = [
        test
        for files in tests.values()
        for test in files
        if git("ls-tree", "--name-only", branch_plan.base, "--", test, cwd=checkout).strip()
    ]
    if clashes:
        raise OverlayError(
            "these tests would overwrite upstream files; rename them here first: "
            + ", ".join(clashes)
        )

    def add_tests(name: str) -> None:
        for test in tests[name]:
            target = checkout / test
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / test, target)
            git("add", test, cwd=checkout)
        message = upstream_message(git("log", "-1", "--format=%B", cwd=checkout))
        git("commit", "-q", "--amend", "-m", message, cwd=checkout, fixed_identity=False)

    source_branch.create(repo, branch_plan, amend=add_tests)
    return branch_plan


async def _rehearse(checkout: Path, base: str, head: str, scratch: Path) -> list[dict]:
    import ghstack.github_fake
    import ghstack.shell
    import ghstack.submit

    upstream_sh = ghstack.shell.Shell(cwd=str(scratch / "upstream"), testing=True)
    (scratch / "upstream").mkdir()
    github = ghstack.github_fake.FakeGitHubEndpoint(upstream_sh)
    await github.state.initialize()
    # Borrow the checkout's objects instead of copying a multi-GB history.
    common_dir = git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=checkout)
    alternates = scratch / "upstream" / "objects" / "info" / "alternates"
    alternates.write_text(f"{Path(common_dir.strip()) / 'objects'}\n")
    await upstream_sh.agit("update-ref", "refs/heads/main", base)
    local = scratch / "local"
    local.mkdir()
    sh = ghstack.shell.Shell(cwd=str(local), testing=True)
    await sh.agit("clone", "-q", "--shared", str(scratch / "upstream"), ".")
    await sh.agit("checkout", "-q", "-b", "stack", head)
    await ghstack.submit.main(
        msg="Initial submit", username="you", github=github, sh=sh, stack_header="Stack",
        repo_owner_opt="pytorch", repo_name_opt="pytorch", short=False, direct_opt=False,
        no_skip=False, github_url="github.com", remote_name="origin", base_opt=None, revs=(),
        stack=True, check_invariants=True,
    )  # fmt: skip
    result = await github.graphql(
        'query { repository(name: "pytorch", owner: "pytorch") { pullRequests { nodes '
        "{ number title baseRefName headRefName body } } } }"
    )
    return result["data"]["repository"]["pullRequests"]["nodes"]


def rehearse(checkout: Path, base: str, head: str) -> list[dict]:
    """The pull requests `ghstack submit` would open, from ghstack's offline fake GitHub."""
    with tempfile.TemporaryDirectory(prefix="torch-overlay-ghstack-") as scratch:
        # ghstack reports to stdout as if it had pushed; keep that out of our output.
        with contextlib.redirect_stdout(io.StringIO()):
            return asyncio.run(_rehearse(checkout, base, head, Path(scratch)))


def stack(repo: Path, src: Path, *, branch: str | None = None, onto_head: bool = False) -> str:
    branch_plan = prepare(repo, src, branch, onto_head)
    checkout = branch_plan.checkout
    head = git("rev-parse", "HEAD", cwd=checkout).strip()
    lines = [f"prepared {branch_plan.branch} in {checkout}:", *branch_plan.describe()[1:]]
    for sha in git("rev-list", "--reverse", f"{branch_plan.base}..{head}", cwd=checkout).split():
        files = git("diff-tree", "--no-commit-id", "--name-only", "-r", sha, cwd=checkout).split()
        lines.append(f"  {sha[:12]} {' '.join(files)}")
    lines.append("rehearsal (ghstack's fake GitHub, offline; nothing was pushed):")
    for pr in sorted(rehearse(checkout, branch_plan.base, head), key=lambda pr: pr["number"]):
        lines.append(
            f"  #{pr['number']} {pr['title']}  ({pr['headRefName']} -> {pr['baseRefName']})"
        )
    lines.append(f"to submit for real: cd {checkout} && ghstack submit")
    return "\n".join(lines) + "\n"
