"""`torch-overlay run -- CMD…`: run a command with the overlay's Python files shadowing the
installed torch, in that process and every Python process it starts (spawned children,
torchrun workers, subprocesses), through PYTHONPATH and an import hook.

It behaves like ``env``: the command keeps the terminal (same process group), SIGINT,
SIGTERM and SIGHUP sent to ``run`` reach it, ``run`` exits with its status (128+N when a
signal N killed it, 127 when it does not exist, 126 when it cannot be executed), and the
scratch tree of Python files is removed however ``run`` ends (a tree left by a ``run``
killed with SIGKILL is removed by the next one).

The hook loads through PYTHONPATH (``tools/boot/run/sitecustomize.py``), so a command that
replaces PYTHONPATH or starts Python with ``-I``, ``-E`` or ``-S`` would silently get stock
torch. ``run`` refuses such a command line (``env PYTHONPATH=…``, ``env -i``,
``env -u PYTHONPATH``, ``python -I/-E/-S``) and says what to do instead. It cannot see inside
scripts: a process started deeper down that way runs stock torch; ``torch-overlay activate``
(a ``.pth`` file, which ``-I`` and ``-E`` still load) covers those.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import overlay_repo, topics
from tools.active import BOOT_DIR, ENV_VAR, environment, materialize
from tools.base import OverlayError, installed_torch, read_pin

TREE_PREFIX = "torch-overlay-run-"  # then the pid of the run that owns it
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PYTHON = re.compile(r"python[0-9.]*")


def run(repo: Path, argv: list[str], topic: str | None = None) -> int:
    refusal = hook_bypass(argv)
    if refusal:
        raise OverlayError(refusal)
    program = argv[0]
    if "/" not in program and shutil.which(program) is None:
        print(f"torch-overlay run: {program}: command not found", file=sys.stderr)
        return 127
    remove_leaked_trees()
    child: list[subprocess.Popen] = []
    pending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if not child:
            pending.append(signum)  # not started yet: stop before starting it
        elif not sent_by_terminal(signum):
            child[0].send_signal(signum)  # a no-op once it has exited

    previous = {signum: signal.signal(signum, on_signal) for signum in FORWARDED}
    try:
        with tempfile.TemporaryDirectory(prefix=f"{TREE_PREFIX}{os.getpid()}-") as scratch:
            tree = Path(scratch) / "tree"
            overlay = topic_overlay(repo, topic, Path(scratch) / "overlay") if topic else None
            plan = materialize(repo, tree, overlay=overlay)
            print(f"torch-overlay: {plan.summary()}", file=sys.stderr)
            if pending:
                return 128 + pending[0]
            try:
                child.append(subprocess.Popen(argv, env=environment(tree)))
            except FileNotFoundError:
                print(f"torch-overlay run: {program}: command not found", file=sys.stderr)
                return 127
            except PermissionError:
                print(f"torch-overlay run: {program}: permission denied", file=sys.stderr)
                return 126
            for signum in pending:  # arrived while it was starting
                on_signal(signum, None)
            status = child[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - status if status < 0 else status


def sent_by_terminal(signum: int) -> bool:
    """Whether the terminal delivered this signal to our whole (foreground) process group,
    the command included: forwarding it would deliver it twice (a second Ctrl-C makes pytest
    stop without its summary)."""
    if signum not in (signal.SIGINT, signal.SIGHUP):
        return False
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)


def remove_leaked_trees() -> None:
    """Remove scratch trees of runs that were killed (SIGKILL leaves no chance to clean)."""
    for tree in Path(tempfile.gettempdir()).glob(TREE_PREFIX + "*"):
        pid = tree.name[len(TREE_PREFIX) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or tree.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tree, ignore_errors=True)
        except OSError:  # alive under another user, or gone meanwhile
            continue


def hook_bypass(argv: list[str]) -> str:
    """Why the command line would run without the overlay's import hook, or ""."""
    args = list(argv)
    if args and os.path.basename(args[0]) == "env":
        args = env_command(args[1:])
        if isinstance(args, str):
            return args
    if not args or not PYTHON.fullmatch(os.path.basename(args[0])):
        return ""
    words = iter(args[1:])
    for word in words:
        if word in ("--", "-") or not word.startswith("-"):
            return ""  # the script: the interpreter's options end here
        if word.startswith("--"):
            if word == "--check-hash-based-pycs":
                next(words, None)
            continue
        for at, letter in enumerate(word[1:], 2):
            if letter in "IE":
                return (
                    f"python -{letter} ignores PYTHONPATH, which loads the overlay's hook, so it "
                    "would import stock torch; drop the flag, or use torch-overlay activate "
                    "(a .pth file that -I and -E still load) and run the command without run"
                )
            if letter == "S":
                return (
                    "python -S skips the site module, which loads the overlay's hook, so it "
                    "would import stock torch; drop the flag"
                )
            if letter in "cm":  # -c CODE / -m MODULE: the interpreter's options end here
                return ""
            if letter in "XW":  # takes a value: the rest of the word, or the next word
                if at == len(word):
                    next(words, None)
                break
    return ""


def env_command(args: list[str]) -> list[str] | str:
    """The command that ``env ARGS`` runs, or why ``env`` would drop the overlay's hook."""
    hook_path = str(BOOT_DIR / "run")
    while args:
        arg, args = args[0], args[1:]
        if arg in ("-i", "--ignore-environment", "-"):
            return f"env {arg} empties the environment that carries the overlay's hook; drop it"
        unset = ""
        if arg in ("-u", "--unset") and args:
            unset, args = args[0], args[1:]
        elif arg.startswith("--unset="):
            unset = arg.split("=", 1)[1]
        elif arg.startswith("-u"):
            unset = arg[2:]
        if unset in ("PYTHONPATH", ENV_VAR):
            return f"env -u {unset} removes the overlay's hook; drop it"
        if arg in ("-C", "--chdir", "-S", "--split-string"):
            args = args[1:]
        elif "=" in arg and not arg.startswith("-"):
            name, value = arg.split("=", 1)
            if name == "PYTHONPATH" and hook_path not in value.split(os.pathsep):
                return (
                    f"env PYTHONPATH={value} replaces the PYTHONPATH that loads the overlay's "
                    "hook, so Python would import stock torch; set it before run instead "
                    "(PYTHONPATH=… torch-overlay run -- CMD keeps it after the hook)"
                )
            if name == ENV_VAR:
                return f"env {ENV_VAR}=… overrides which overlay is active; drop it"
        elif not arg.startswith("-"):
            return [arg, *args]
    return []


def topic_overlay(repo: Path, topic: str, dest: Path) -> Path:
    """An overlay of one topic and those it depends on, from ``patches/`` (so a topic is
    tested as it lands upstream: without the other topics)."""
    found = topics.read_topics(repo)
    if topic not in found.topics:
        raise OverlayError(f"no topic {topic!r}; topics: {', '.join(found.topics)}")
    pin, torch = read_pin(repo), installed_torch()
    names = [name for t in found.chain(topic) for name in t.patches]
    overlay_repo.build(repo, dest, pin, torch, names=names)
    return dest
