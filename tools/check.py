"""`torch-overlay check`: the series applies to the pinned base, nothing is unexported, every
touched file has upstream tests mapped in ``patches/upstream.json``, and every patch message
reads as an upstream PyTorch PR.

A message may not point at another PR by its place in the series ("next PR", "previous
PR", "(previous)"...): the series gets reordered, and upstream each patch is a PR of its own,
so such a phrase goes stale silently. Name the other PR by its title, or leave it out. Every
upstream issue that ``patches/upstream.json`` declares for a patch needs its ``Fixes #N``.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import re
import tempfile
from pathlib import Path

from tools import overlay_repo, topics
from tools.active import materialize
from tools.base import (
    NOTES_HEADING,
    OVERLAY_DIR,
    PATCH_GLOB,
    PIN_FILE,
    PLACEHOLDER_IDENTITY,
    PROJECT_TRAILERS,
    SERIES_FILE,
    UNASSIGNED_AUTHOR,
    UNASSIGNED_DATE,
    UPSTREAM_MAP_FILE,
    WHEEL_STOPGAP_TRAILER,
    InstalledTorch,
    OverlayError,
    UpstreamMap,
    check_installed,
    installed_torch,
    patch_message,
    patch_slug,
    pr_text,
    read_patch,
    read_pin,
    read_series,
    read_upstream_map,
    series_subjects,
    wheel_file,
    wheel_stopgaps,
)
from tools.export import pending

SUBJECT = re.compile(r"^(\[[A-Za-z][^\]]*\])+ \S")
FIXES = re.compile(
    r"^Fixes (#\d+|pytorch/pytorch#\d+|https://github\.com/pytorch/pytorch/issues/\d+)$"
)
RELATIVE_REFERENCE = re.compile(
    r"\b(?:previous|next|earlier|later|prior|preceding|following)\s+"
    r"(?:PRs?|patch(?:es)?|commits?)\b"
    r"|\((?:previous|next|earlier|later)\)",
    re.I,
)
TEST_COMMAND = re.compile(r"(?:python|pytest)\S*\s+(?:-m pytest\s+)?(test/\S+\.py)")


# What the PR text (tools/base.py: pr_text) may not contain: this project's tools, files
# and framing, and copies of upstream files from forks. They belong under "Overlay notes:".
SCAFFOLDING = {
    r"torch[-_]overlay|\boverlay\b": "this project's tool",
    r"\.upstream-tests|tools/reproducers": "this project's files",
    r"\b(?:the|this|our) series\b(?!\s+(?:of|expansion)\b)": (
        "this project's framing (upstream sees one PR)"
    ),
    r"\bstock\b": "this project's framing (say 'main' or 'without this PR')",
    # Upstream cannot look up this project's reviews ("rev25d", "ReviewRev25b") or issues
    # ("issue 24b"; upstream's are "#123456"): say what was found instead.
    r"\brev\d{2}[a-z]?\b|\bReviewRev\d+|(?<!#)\bissue\s+\d{1,3}[a-z]?\b": (
        "this project's review or issue label (upstream cannot look it up)"
    ),
    # forks of pytorch/pytorch, by owner/repo@sha, URL or "owner/pytorch at sha"
    r"\b(?!pytorch/)[\w.-]+/pytorch(?:-[\w.]+)?(?:@|/blob/|/tree/|/commit/|\s+at\s+)[0-9a-f]{7,40}\b"
    r"|\(stored copy|\bstored copies\b": "a copy of an upstream file (fork or stored copy)",
    # ghstack takes this anywhere in a message for "update that PR"
    r"(?:Pull Request resolved|Pull-Request-resolved|Pull-Request): https?://\S+": (
        "ghstack's pull-request line (it would update that PR)"
    ),
    r"^\W*overlay\s*notes\W*$": "a misspelt notes heading (it must read exactly 'Overlay notes:')",
}
# This project's trailers, spelt otherwise: silently ignored (a "Carried-only:" patch would
# be submitted).
MISSPELT_TRAILER = re.compile(
    r"^(topic|wheel[- _]?stopgap|requires[- _]?source[- _]?build|carried[- _]?only)\s*:",
    re.I | re.M,
)


def scaffolding_problems(repo: Path, name: str, text: str) -> list[str]:
    """Project scaffolding in the PR text that upstream would receive."""
    rules = dict(SCAFFOLDING)
    version = re.escape(read_pin(repo).version)  # the base release: upstream reads "main"
    short = re.escape(read_pin(repo).version.rsplit(".", 1)[0])
    rules[rf"\b(?:py)?torch\s*(?:==|v)?\s*(?:{version}|{short})\b|\b{version}\b"] = (
        "the base release (upstream reads 'on main')"
    )
    own = sorted(p.name for p in (repo / "benchmarks").glob("*.py"))
    if own:
        rules[r"benchmarks/(?:" + "|".join(map(re.escape, own)) + ")"] = "this project's benchmark"
    problems = []
    for pattern, what in rules.items():
        for found in dict.fromkeys(m.group() for m in re.finditer(pattern, text, re.I | re.M)):
            problems.append(
                f"{name}: the PR text names {found.strip()!r} ({what}); move it under "
                f"'{NOTES_HEADING}' or reword"
            )
    return problems


def message_problems(
    repo: Path, name: str, text: bytes, known_issues: list[int] | tuple[int, ...] = ()
) -> list[str]:
    """Problems with one patch message as upstream receives it (``pr_text``);
    ``known_issues`` are the upstream issues it fixes."""
    subject, body = patch_message(text)
    body = pr_text(body)
    problems = scaffolding_problems(repo, name, f"{subject}\n{body}")
    if not SUBJECT.match(subject):
        problems.append(
            f"{name}: subject {subject!r} should read '[Area] title', e.g. '[DTensor] …'"
        )
    summary = re.search(r"^Summary:(.*?)(?:^Test Plan:|\Z)", body, re.M | re.S)
    if not summary or not summary.group(1).strip():
        problems.append(f"{name}: no 'Summary:' section (problem, root cause, fix)")
    plan = re.search(r"^Test Plan:\s*\n?(.+)", body, re.M | re.S)
    tests = TEST_COMMAND.findall(plan.group(1)) if plan else []
    if not tests:
        problems.append(f"{name}: 'Test Plan:' must name the command that runs this repo's test")
    problems += [f"{name}: Test Plan names {t}, which is not in this repo" for t in tests
                 if not (repo / t).is_file()]  # fmt: skip
    fixed = set()
    for line in body.splitlines():
        if re.match(r"Fixes\s*[:#]|Fixes\s+(?:pytorch/|https?://)", line) and not FIXES.match(
            line.strip()
        ):
            problems.append(f"{name}: {line.strip()!r} should read 'Fixes #N'")
        elif FIXES.match(line.strip()):
            fixed.add(int(re.findall(r"\d+", line)[-1]))
    problems += [f"{name}: {UPSTREAM_MAP_FILE} says it fixes #{n}; add the line 'Fixes #{n}'"
                 for n in known_issues if n not in fixed]  # fmt: skip
    for reference in RELATIVE_REFERENCE.finditer(body):
        problems.append(
            f"{name}: {' '.join(reference.group().split())!r} points at a PR by its place in "
            "the series; name that PR by its title or remove the reference"
        )
    return problems


def upstream_map_problems(upstream: UpstreamMap, touched: set[str], series: list[str]) -> list[str]:
    """Touched files without mapped upstream tests, and issues declared for missing patches."""
    problems = [
        f"{path}: a patch touches it, but no upstream test file maps to it in {UPSTREAM_MAP_FILE}"
        for path in sorted(touched)
        if not upstream.tests.get(path)
    ]
    problems += [
        f'{UPSTREAM_MAP_FILE}: "issues" names {name}, which is not in {SERIES_FILE}'
        for name in upstream.issues
        if name not in {patch_slug(n) for n in series}
    ]
    return problems


def check(repo: Path) -> list[str]:
    """All problems found; empty when the series is good."""
    pin = read_pin(repo)
    torch = installed_torch()
    check_installed(pin, torch)
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        # Refuses (OverlayError) on drift or on the first patch that does not apply.
        overlay_repo.build(repo, Path(scratch) / "overlay", pin, torch)
        changed = {f for c in overlay_repo.commits(Path(scratch) / "overlay") for f in c.files}
        try:  # what `run` activates on a wheel: held-back patches must come out cleanly
            materialize(repo, Path(scratch) / "active", overlay=Path(scratch) / "overlay")
        except OverlayError as error:
            problems.append(f"on a wheel: {error}")
    for commit in overlay_repo.source_only_commits(repo, pin):
        changed.update(commit.files)
    problems += [f"{p}: in {PIN_FILE}'s source_only, but the wheel ships it" for p in
                 pin.source_only if shipped(torch, p)]  # fmt: skip
    if overlay_repo.exists(repo / OVERLAY_DIR):
        problems += pending(repo)
    upstream = read_upstream_map(repo)
    series = read_series(repo)
    problems += [f"patches/{p.name}: not named in {SERIES_FILE} (add it there, or delete it)"
                 for p in sorted((repo / "patches").glob(PATCH_GLOB)) if p.name not in series]  # fmt: skip
    problems += upstream_map_problems(upstream, set(pin.files) | changed, series)
    topic_problems = topics.problems(repo)
    problems += topic_problems
    if not topic_problems:
        problems += overlay_repo.form_problems(repo, pin, torch, submitted_forms(repo))
    problems += author_problems(repo, series)
    problems += trailer_problems(repo, series)
    if not topic_problems:
        problems += shared_test_problems(repo)
    for name in series:
        text = read_patch(repo, name)
        if topics.carried_reason(text):  # never submitted: its message is ours alone
            continue
        problems += message_problems(repo, name, text, upstream.issues_of(name))
    subjects = set(series_subjects(repo).values())
    problems += [f"{name}: its {WHEEL_STOPGAP_TRAILER} names {by!r}, which is not a patch "
                 "of the series" for name, by in wheel_stopgaps(repo).items()
                 if by not in subjects]  # fmt: skip
    return problems


def shipped(torch: InstalledTorch, path: str) -> bool:
    """Whether the wheel ships the upstream file at source path ``path``."""
    try:
        return wheel_file(torch, path).exists()
    except OverlayError:  # not a kind of file a wheel ships (e.g. a .cpp source)
        return False


def submitted_forms(repo: Path) -> dict[str, list[str]]:
    """Every form of the series that something applies to a base on its own: what ``build``
    applies (no wheel stopgaps), each topic as ``stack`` submits it (no carried patch), and
    each topic with its carried patches (what a wheel runs of it alone)."""
    found = topics.read_topics(repo)
    stopgaps = wheel_stopgaps(repo)
    forms = {"the source-build form (build: no wheel stopgaps)":
             [n for n in read_series(repo) if n not in stopgaps]}  # fmt: skip
    for name in found.topics:
        chain = found.chain(name)
        forms[f"topic {name!r} as stack submits it"] = [
            patch for topic in chain for patch in found.submitted(topic)
        ]
        forms[f"topic {name!r} alone on the base"] = [p for t in chain for p in t.patches]
    return forms


def patch_author(text: bytes) -> tuple[str, str]:
    """The ``From:`` identity and the ``Date:`` of a ``git format-patch`` file."""
    message = email.message_from_bytes(text, policy=email.policy.default)
    return " ".join(str(message["From"]).split()), str(message["Date"])


def author_problems(repo: Path, series: list[str]) -> list[str]:
    """Patches whose author is a placeholder. The overlay's own identity (tools/base.py
    GIT_ENV) means "no author yet" and is fine: build and stack author such a patch as the
    checkout's git identity, dated when they commit it."""
    unassigned = UNASSIGNED_AUTHOR
    problems = []
    for name in series:
        author, date = patch_author((repo / "patches" / name).read_bytes())
        if author == unassigned:
            continue
        if PLACEHOLDER_IDENTITY.search(author):
            problems.append(
                f"{name}: author {author!r} is a placeholder; give the commit its real author "
                f"(git commit --amend --author=...) or the unassigned {unassigned!r}"
            )
        elif (when := email.utils.parsedate_to_datetime(date)).year < 2016 and (
            when.date().isoformat() != UNASSIGNED_DATE  # no date yet: build and stack date it
        ):
            problems.append(f"{name}: author date {date!r} is not a real date")
    return problems


def trailer_problems(repo: Path, series: list[str]) -> list[str]:
    """This project's trailers spelt otherwise, which every verb would silently ignore."""
    problems = []
    for name in series:
        message = patch_message(read_patch(repo, name))[1]
        for found in MISSPELT_TRAILER.finditer(message):
            line = message[found.start() :].split("\n", 1)[0]
            if not any(line.startswith(f"{t}:") for t in PROJECT_TRAILERS):
                problems.append(
                    f"{name}: {line.strip()!r} is not read; the project's lines are spelt "
                    + ", ".join(f"'{t}:'" for t in PROJECT_TRAILERS)
                )
    return problems


def shared_test_problems(repo: Path) -> list[str]:
    """A test file named by two PRs of one topic: stack places the file as it is now in
    both, so the earlier PR would carry (and fail on) the later one's tests."""
    from tools.stack import tests_for

    found = topics.read_topics(repo)
    problems = []
    for topic in found.topics.values():
        seen: dict[str, str] = {}
        for name in found.submitted(topic):
            for test in tests_for(repo, name):
                if test in seen:
                    problems.append(
                        f"{name}: its Test Plan names {test}, as {seen[test]} does; give each "
                        "PR of a topic its own test file"
                    )
                seen.setdefault(test, name)
    return problems
