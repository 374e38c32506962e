"""Topics: the series as independent upstream stacks.

Upstream lands work in small ghstack stacks per area, each based on main, so the series is
organised the same way. ``patches/topics.json`` declares the topics, in order, each with a
title and the topics it needs (``depends``, at most one); every patch names its topic with a
``Topic:`` line in its message (it travels with the commit through rebases and renumbering).
A topic is its patches in series order. It applies to the pinned base on top of the topic it
depends on and of no other, and ``stack`` makes one branch per topic, a dependent topic's
branch starting at the head of the one it needs.

A patch's upstream status is "submit", unless it is carried here only: a wheel stopgap, or a
patch with a ``Carried-Only: <reason>`` line. ``stack`` never submits a carried patch;
``build`` (a source build for our own use) keeps every patch but the wheel stopgaps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tools.base import (
    CARRIED_TRAILER,
    TOPIC_TRAILER,
    OverlayError,
    patch_field,
    read_patch,
    read_series,
    wheel_stopgap,
)

TOPICS_FILE = Path("patches/topics.json")
TOPIC_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class Topic:
    name: str
    title: str
    depends: str  # the topic this one is stacked on, or ""
    patches: tuple[str, ...]  # patch file names, in series order


@dataclass(frozen=True)
class Topics:
    topics: dict[str, Topic]  # in declaration order
    of_patch: dict[str, str]  # patch file name -> topic name
    carried: dict[str, str]  # patch file name -> why it is not submitted upstream

    def chain(self, name: str) -> list[Topic]:
        """The topic and those it stands on, the bottom of the stack first."""
        chain = [self.topics[name]]
        while chain[0].depends:
            chain.insert(0, self.topics[chain[0].depends])
        return chain

    def submitted(self, topic: Topic) -> list[str]:
        """The topic's patches that go upstream, in order."""
        return [name for name in topic.patches if name not in self.carried]

    def status(self, name: str) -> str:
        """A patch's upstream status, as `status` and `verify` show it."""
        reason = self.carried.get(name)
        return f"carried only: {reason}" if reason else "submit"


def carried_reason(text: bytes) -> str:
    """Why a patch is not submitted upstream ("" when it is)."""
    stands_for = wheel_stopgap(text)
    if stands_for:
        return f"wheel stopgap for {stands_for!r}; build and stack leave it out"
    return patch_field(text, CARRIED_TRAILER)


def declared(repo: Path) -> list[dict]:
    """The topic declarations of ``patches/topics.json``."""
    path = repo / TOPICS_FILE
    try:
        data = json.loads(path.read_text())
        entries = data["topics"]
        return [{"name": e["name"], "title": e["title"], "depends": e.get("depends", "")}
                for e in entries]  # fmt: skip
    except FileNotFoundError:
        raise OverlayError(f"no topics file at {path}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise OverlayError(
            f"{path} must hold {{'topics': [{{'name', 'title', 'depends'?}}, ...]}}: {error!r}"
        ) from None


def problems(repo: Path) -> list[str]:
    """Everything wrong with the topics; empty when ``read_topics`` will succeed."""
    found = []
    try:
        entries = declared(repo)
    except OverlayError as error:
        return [str(error)]
    names = [e["name"] for e in entries]
    for entry in entries:
        name, depends = entry["name"], entry["depends"]
        if not TOPIC_NAME.match(name):
            found.append(f"{TOPICS_FILE}: topic name {name!r} should be lower-case-with-dashes")
        if names.count(name) > 1:
            found.append(f"{TOPICS_FILE}: topic {name!r} is declared twice")
        if depends and depends not in names:
            found.append(f"{TOPICS_FILE}: {name!r} depends on {depends!r}, which is not declared")
        elif depends and names.index(depends) > names.index(name):
            found.append(f"{TOPICS_FILE}: {name!r} depends on {depends!r}, declared after it")
    dependents = [e["depends"] for e in entries if e["depends"]]
    found += [
        f"{TOPICS_FILE}: {needed!r} is needed by more than one topic; ghstack submits a "
        "dependent topic together with the one it needs, so chain them instead"
        for needed in sorted({d for d in dependents if dependents.count(d) > 1})
    ]
    used = set()
    for name in read_series(repo):
        topic = patch_field(read_patch(repo, name), TOPIC_TRAILER)
        used.add(topic)
        if not topic:
            found.append(f"{name}: no '{TOPIC_TRAILER}: <name>' line (topics: {', '.join(names)})")
        elif topic not in names:
            found.append(f"{name}: topic {topic!r} is not declared in {TOPICS_FILE}")
    found += [f"{TOPICS_FILE}: topic {n!r} has no patch" for n in names if n not in used]
    return found


def read_topics(repo: Path) -> Topics:
    """The topics of the series; refuses (OverlayError) when ``problems`` finds any."""
    found = problems(repo)
    if found:
        raise OverlayError("the series' topics are not consistent:\n  " + "\n  ".join(found))
    members: dict[str, list[str]] = {e["name"]: [] for e in declared(repo)}
    of_patch, carried = {}, {}
    for name in read_series(repo):
        text = read_patch(repo, name)
        of_patch[name] = patch_field(text, TOPIC_TRAILER)
        members[of_patch[name]].append(name)
        if carried_reason(text):
            carried[name] = carried_reason(text)
    topics = {
        e["name"]: Topic(e["name"], e["title"], e["depends"], tuple(members[e["name"]]))
        for e in declared(repo)
    }
    return Topics(topics, of_patch, carried)


def patch_rows(repo: Path, held_back: set[str]) -> list[dict]:
    """One row per patch: subject, topic, upstream status, and whether it is active on this
    wheel (``held_back``: subjects that need a source build). Empty if the topics are
    inconsistent (``check`` names why)."""
    from tools.base import series_subjects

    if problems(repo):
        return []
    found = read_topics(repo)
    return [
        {
            "patch": subject,
            "topic": found.of_patch[name],
            "upstream": found.status(name),
            "wheel": "held back" if subject in held_back else "active",
        }
        for name, subject in series_subjects(repo).items()
    ]
