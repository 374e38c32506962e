"""`torch-overlay stack --pytorch-src DIR`: one branch per topic (tools/topics.py), each a
stack for `ghstack submit`, and an offline rehearsal of the pull requests ghstack would open.

Upstream lands small stacks per area, each based on main: a topic's branch starts at the
base (a dependent topic's at the head of the topic it needs) and holds the patches the topic
submits; carried patches (wheel stopgaps, ``Carried-Only:``) are left out. Each commit is
authored by the checkout's identity unless the patch names a real author, and its message is
the PR text alone (tools/base.py: pr_text). Each commit is one patch plus the tests its Test Plan names, placed at their upstream paths
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
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools import source_branch, topics
from tools.base import (
    NOTES_HEADING,
    OverlayError,
    git,
    patch_message,
    pr_text,
    read_upstream_map,
    series_subjects,
)
from tools.check import TEST_COMMAND


def tests_for(repo: Path, patch_name: str) -> list[str]:
    """Repo-relative test files of a patch: those its Test Plan names, and their siblings
    that git tracks here (a stray ``test_x.py.orig`` never reaches a PR)."""
    _, body = patch_message((repo / "patches" / patch_name).read_bytes())
    plan = pr_text(body).split("Test Plan:", 1)[-1]
    files = []
    for test in dict.fromkeys(TEST_COMMAND.findall(plan)):
        path = repo / test
        siblings = sorted(
            p.relative_to(repo).as_posix() for p in path.parent.glob(f"{path.stem}.*")
        )
        tracked = git("ls-files", "--", *siblings, cwd=repo, check=False).split()
        files += [f for f in siblings if f in tracked] if (repo / ".git").exists() else siblings
    return files


# ghstack's own trailers. After a first `ghstack submit`, copying them from the submitted
# commit into the patch's "Overlay notes:" makes the next `stack` + `ghstack submit` update
# those pull requests instead of opening new ones.
GHSTACK_TRAILERS = re.compile(r"^(?:ghstack-source-id|Pull-Request): \S+$", re.M)


def upstream_message(message: str) -> str:
    """The commit message as the PR text: without "Overlay notes:" and project trailers,
    with ghstack's trailers if the notes record them."""
    parts = re.split(rf"^{re.escape(NOTES_HEADING)}[ \t]*$", message, maxsplit=1, flags=re.M)
    kept = GHSTACK_TRAILERS.findall(parts[1]) if len(parts) > 1 else []
    return pr_text(message) + ("\n" + "\n".join(kept) + "\n" if kept else "")


@dataclass(frozen=True)
class StackPlan:
    branches: list[source_branch.BranchPlan]  # in dependency order
    topics: dict[str, str]  # branch -> topic name
    tests: dict[str, list[str]]  # patch file name -> test files placed with it
    carried: list[tuple[str, str]]  # (subject, why it is not submitted)
    leaves: list[str]  # branches no other branch is stacked on: one ghstack submit each

    def describe(self) -> list[str]:
        lines = []
        for branch_plan in self.branches:
            topic = self.topics[branch_plan.branch]
            lines.append(f"topic {topic}:")
            lines += [f"  {line}" for line in branch_plan.describe()[1:]]
        if self.carried:
            lines.append("not submitted (carried here only):")
            lines += [f"  {subject}  ({why})" for subject, why in self.carried]
        return lines


def prepare(
    repo: Path, src: Path, prefix: str | None, onto_head: bool, only: list[str] | None = None
) -> StackPlan:
    """Check everything and plan one branch per topic; changes nothing."""
    found = topics.read_topics(repo)
    src = source_branch.validate_checkout(src)
    source_branch.require_identity(src)
    base = source_branch.start_commit(repo, src, onto_head)
    prefix = prefix or "torch-overlay"
    unknown = [name for name in only or [] if name not in found.topics]
    if unknown:
        raise OverlayError(
            f"no topic {', '.join(map(repr, unknown))}; topics: {', '.join(found.topics)}"
        )
    wanted = {t.name for name in only or found.topics for t in found.chain(name)}
    subjects = series_subjects(repo)
    branch_of: dict[str, str] = {}  # topic -> branch, for topics that submit something
    plans = []
    for topic in found.topics.values():
        patches = found.submitted(topic)
        if topic.name not in wanted or not patches:
            continue
        # A topic whose dependency submits nothing starts from the base like any other.
        # Stacked on the nearest topic below it that submits something (one that submits
        # nothing has no branch); check applies the same chain.
        below = [t.name for t in found.chain(topic.name)[:-1] if t.name in branch_of]
        parent = branch_of[below[-1]] if below else ""
        branch_of[topic.name] = f"{prefix}/{topic.name}"
        chain = [p for t in found.chain(topic.name) for p in found.submitted(t)]
        source_branch.check_applies(repo, src, base, chain, three_way=onto_head)
        plans.append(source_branch.BranchPlan(
            src, branch_of[topic.name], base, onto_head,
            [(name, subjects[name]) for name in patches], [], parent,
        ))  # fmt: skip
    if not plans:
        raise OverlayError("no topic has a patch to submit; nothing was changed")
    submitted = [name for bp in plans for name, _ in bp.patches]
    problems = submission_problems(repo, submitted)
    if problems:
        raise OverlayError(
            "what would be submitted is not ready (torch-overlay check lists the same); "
            "nothing was changed:\n  " + "\n  ".join(problems)
        )
    source_branch.refuse_existing(src, [bp.branch for bp in plans])
    tests = {name: tests_for(repo, name) for bp in plans for name, _ in bp.patches}
    clashes = [
        test
        for files in tests.values()
        for test in files
        if git("ls-tree", "--name-only", base, "--", test, cwd=src).strip()
    ]
    if clashes:
        raise OverlayError(
            "these tests would overwrite upstream files; rename them here first: "
            + ", ".join(clashes)
        )
    source_branch.refuse_untracked(repo, src, plans, [t for f in tests.values() for t in f])
    parents = {bp.parent for bp in plans}
    carried = [(subjects[name], why) for name, why in found.carried.items()
               if found.of_patch[name] in wanted]  # fmt: skip
    return StackPlan(
        plans,
        {branch: topic for topic, branch in branch_of.items()},
        tests,
        carried,
        [bp.branch for bp in plans if bp.branch not in parents],
    )


def submission_problems(repo: Path, names: list[str]) -> list[str]:
    """What `check` finds in the messages and authors of the patches to submit."""
    from tools.check import author_problems, message_problems

    upstream = read_upstream_map(repo)
    problems = author_problems(repo, names)
    for name in names:
        text = (repo / "patches" / name).read_bytes()
        problems += message_problems(repo, name, text, upstream.issues_of(name))
    return problems


def create(repo: Path, stack_plan: StackPlan) -> None:
    """Make every branch, then check out what was checked out before."""
    src = stack_plan.branches[0].checkout
    original = source_branch.current(src)

    def add_tests(name: str) -> None:
        for test in stack_plan.tests[name]:
            target = src / test
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / test, target)
            git("add", test, cwd=src)
        message = upstream_message(git("log", "-1", "--format=%B", cwd=src))
        git("commit", "-q", "--amend", "--cleanup=verbatim", "-m", message, cwd=src,
            fixed_identity=False)  # fmt: skip

    made = []
    try:
        for branch_plan in stack_plan.branches:
            source_branch.create(repo, branch_plan, amend=add_tests)
            made.append(branch_plan.branch)
    except BaseException:
        git("checkout", "-q", original, cwd=src, check=False)
        for branch in made:
            git("branch", "-q", "-D", branch, cwd=src, check=False)
        raise
    git("checkout", "-q", original, cwd=src)


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


def stack(
    repo: Path,
    src: Path,
    *,
    prefix: str | None = None,
    onto_head: bool = False,
    only: list[str] | None = None,
    dry_run: bool = False,
) -> str:
    stack_plan = prepare(repo, src, prefix, onto_head, only)
    src = stack_plan.branches[0].checkout
    head = "dry run, nothing changed" if dry_run else "prepared"
    lines = [f"stack plan ({head}): {len(stack_plan.branches)} topic branch(es) in {src}"]
    lines += stack_plan.describe()
    if dry_run:
        return "\n".join(lines) + "\n"
    create(repo, stack_plan)
    base = stack_plan.branches[0].base
    for branch in stack_plan.leaves:
        lines.append(f"rehearsal of {branch} (ghstack's fake GitHub, offline; nothing was pushed):")
        authors = dict(
            line.split("\0", 1)
            for line in git(
                "log", "--format=%s%x00%an <%ae>", f"{base}..{branch}", cwd=src
            ).splitlines()
        )
        head_sha = git("rev-parse", branch, cwd=src).strip()
        for pr in sorted(rehearse(src, base, head_sha), key=lambda pr: pr["number"]):
            lines.append(
                f"  #{pr['number']} {pr['title']}  ({pr['headRefName']} -> "
                f"{pr['baseRefName']}; author {authors.get(pr['title'], '?')})"
            )
    lines.append(
        "to submit for real, one stack per command (needs push rights to pytorch/pytorch):"
    )
    for branch in stack_plan.leaves:
        lines.append(
            f"  cd {shlex.quote(str(src))} && git checkout {shlex.quote(branch)} && ghstack submit"
        )
    return "\n".join(lines) + "\n"
