"""The `torch-overlay` command: one subcommand per verb, each in its own module.

Exit codes: 0 ok; 1 findings (check problems, verify/upstream-test/sweep failures); 2 usage
(bad arguments); 3 refusal (one line saying why; nothing was changed); 4 internal error (a
bug: one line, the traceback with TORCH_OVERLAY_DEBUG=1); 130 interrupted. ``run`` exits with
its command's status instead (128+N for a signal N, 127 for a missing command).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from tools.base import OverlayError, find_repo

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_REFUSED, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
DEBUG_VAR = "TORCH_OVERLAY_DEBUG"
SWEEP_DTYPES = ",".join(("float32", "float64", "bfloat16", "int64", "bool"))
EXIT_CODES = f"""\
exit codes:
  0    ok
  1    findings: check problems, verify / upstream-test / sweep failures
  2    usage: bad arguments
  3    refused: one line says why; nothing was changed
  4    internal error (a bug): one line; {DEBUG_VAR}=1 prints the traceback
  130  interrupted
  run exits with its command's status (128+N when signal N killed it, 127 when not found)
"""
MAIN_EPILOG = f"""\
typical session:
  torch-overlay sync                      # torch_overlay/ from the wheel + patches/
  cd torch_overlay && $EDITOR torch/... && git commit -a && cd ..
  torch-overlay run -- python -m pytest test/distributed/...
  torch-overlay export && torch-overlay check

{EXIT_CODES}"""
# Per verb: (one-line help, description, epilog with examples).
HELP = {
    "sync": (
        "bring torch_overlay/ up to date with the wheel + patches/",
        "Materialize torch_overlay/ (a git repo: a base commit of upstream files from the "
        "installed wheel, then one commit per patch) or bring it up to date after patches/ "
        "changed (a pull). Keeps the overlay's own work: with only local changes there is "
        "nothing to sync; when both sides changed it refuses, naming them. Stashes, branches, "
        "tags and the reflog of torch_overlay/ survive.",
        "examples:\n  git pull && torch-overlay sync\n"
        "  torch-overlay sync --force   # rebuild anyway; edits go to git stash, commits to a "
        "saved/... branch",
    ),
    "add": (
        "bring upstream files into the overlay to edit them",
        "Add upstream files from the installed wheel to the overlay's base commit (the patch "
        "commits are replayed on top unchanged).",
        "examples:\n  torch-overlay add torch/distributed/tensor/_ops/_tensor_ops.py\n"
        "  torch-overlay add ./torch/distributed/tensor/_api.py\n"
        "  torch-overlay add $VIRTUAL_ENV/lib/python3.11/site-packages/torch/distributed/_x.py",
    ),
    "export": (
        "write the overlay's commits back to patches/",
        "Regenerate patches/ (series, one file per commit, base.json) from torch_overlay/, "
        "deterministically. Refuses when patches/ changed since the last sync (run sync "
        "first): it never writes over a pulled patch.",
        "example:\n  torch-overlay export && git add patches && git commit",
    ),
    "check": (
        "series applies, nothing unexported, messages upstream-ready",
        "Materialize the series against the pinned base in a scratch directory and report every "
        "problem: a patch that does not apply, a patch file that patches/series does not name, "
        "unexported overlay work, messages that are not upstream-ready, touched files without "
        "upstream tests in patches/upstream.json. Exits 1 when it finds any.",
        None,
    ),
    "run": (
        "run a command with the overlay active (like env)",
        "Run CMD with the overlay's Python files shadowing the installed torch, in CMD and in "
        "every Python process it starts. Signals (INT, TERM, HUP) reach CMD; run exits with its "
        "status. Refuses command lines that would bypass the overlay's hook (env PYTHONPATH=..., "
        "env -i, python -I/-E/-S).",
        "examples:\n  torch-overlay run -- python -m pytest test/distributed/tensor\n"
        "  PYTHONPATH=src torch-overlay run -- python train.py   # keep your own PYTHONPATH",
    ),
    "activate": (
        "make the overlay the venv's default",
        "Add site-packages/torch_overlay.pth so that every Python of this venv uses the "
        "overlay's active patches (from .overlay-active/). Refuses when base files drifted. "
        "Re-run it after editing the overlay (status says when it is stale).",
        None,
    ),
    "deactivate": ("undo activate", "Remove what activate added; the venv is as before.", None),
    "status": (
        "base, drift, overlay vs patches/, active and held-back patches",
        "Show the pinned base and whether the installed torch matches it (and which base files "
        "drifted, with both hashes), whether torch_overlay/ is behind patches/ or holds work "
        "not exported, whether the venv's activation is stale, which patches are active or "
        "held back, and which modules are overlaid.",
        None,
    ),
    "verify": (
        "every reproducer on stock torch and the overlay",
        "Run each reproducer in tools/reproducers/ on stock torch and with the overlay; write "
        "reports/verify.md and verify.json. Exits 1 when a bug is not fixed.",
        None,
    ),
    "upstream-test": (
        "upstream's tests for the touched modules, stock vs overlay",
        "Run upstream's test files mapped in patches/upstream.json once on stock torch and once "
        "with the overlay and report what differs. Exits 1 on a regression.",
        "examples:\n  torch-overlay upstream-test --pytorch-src ~/pytorch\n"
        "  torch-overlay upstream-test -k fill test/distributed/tensor/test_tensor_ops.py",
    ),
    "sweep": (
        "upstream's strategy validator over every registered op, stock vs overlay",
        "Check DTensor's sharding rules with upstream's validator, stock vs overlay. Exits 1 "
        "when the overlay leaves an incorrect rule or an op it could not run. --missing "
        "reports the rules DTensor lacks instead (exit 0).",
        "examples:\n  torch-overlay sweep --ops view,norm --dtypes float32\n"
        "  torch-overlay sweep --missing --ops add,sum --dtypes float32,int64",
    ),
    "compile-cpp": (
        "compile each C++ file a patch changes, before and after it",
        "Type-check (g++ -fsyntax-only, a torch extension's flags) every C++ file a patch "
        "changes against the installed wheel's headers, without and with the patch; report "
        "only errors the patch adds. A source file the wheel does not ship is read from a "
        "git-ignored copy in .upstream-src/ (--fetch, --pytorch-src or --add); without one it "
        "says so and compiles nothing.",
        "examples:\n  torch-overlay compile-cpp --fetch --pytorch-src ~/pytorch\n"
        "  torch-overlay compile-cpp",
    ),
    "build": (
        "apply the series as a branch of a PyTorch checkout and build it with CUDA",
        "Create a branch of a PyTorch checkout with one commit per patch (all but the wheel "
        "stopgaps), authored by the checkout's git identity, and build it into the Python of a "
        "separate build environment.",
        "examples:\n  torch-overlay build --pytorch-src ~/pytorch --dry-run\n"
        "  torch-overlay build --pytorch-src ~/pytorch --python ~/pytorch-build/bin/python",
    ),
    "stack": (
        "one branch per topic in a PyTorch checkout, ready for ghstack submit",
        "Create one branch per topic (patches/topics.json), each a ghstack stack based on the "
        "start commit (a dependent topic's on the topic it needs), with each PR's tests added, "
        "messages reduced to the PR text, carried patches left out, and every commit authored "
        "by the checkout's git identity; rehearse each submission offline and print one "
        "ghstack submit command per stack.",
        "examples:\n  torch-overlay stack --pytorch-src ~/pytorch --dry-run\n"
        "  torch-overlay stack --pytorch-src ~/pytorch --topic pipelining",
    ),
}


class Formatter(argparse.HelpFormatter):
    """Wraps a one-paragraph description; keeps multi-line text (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("torch-overlay")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def verb_parser(verbs: argparse._SubParsersAction, verb: str) -> argparse.ArgumentParser:
    text, description, epilog = HELP[verb]
    return verbs.add_parser(
        verb, help=text, description=description, epilog=epilog,
        formatter_class=Formatter,
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-overlay",
        description="Carry PyTorch distributed fixes as a patch series over an installed torch.",
        epilog=MAIN_EPILOG,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"torch-overlay {version()}")
    parser.add_argument("--repo", type=Path, help="project checkout (default: found from cwd)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    sync = verb_parser(verbs, "sync")
    sync.add_argument("--force", action="store_true",
                      help="rebuild from patches/ even over the overlay's own work (kept: edits "
                      "in git stash, commits on a saved/... branch)")  # fmt: skip
    add = verb_parser(verbs, "add")
    add.add_argument("paths", nargs="+", metavar="PATH",
                     help="torch/... source path, ./-relative, or absolute in site-packages")  # fmt: skip
    verb_parser(verbs, "export")
    verb_parser(verbs, "check")
    run = verb_parser(verbs, "run")
    run.add_argument("--topic", metavar="NAME",
                     help="only this topic's patches (and those it depends on), from patches/")  # fmt: skip
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS…]")
    verb_parser(verbs, "activate")
    verb_parser(verbs, "deactivate")
    verb_parser(verbs, "status")
    verify = verb_parser(verbs, "verify")
    verify.add_argument("--out", type=Path, help="report directory (default: REPO/reports)")
    gate = verb_parser(verbs, "upstream-test")
    source = gate.add_mutually_exclusive_group()
    source.add_argument("--pytorch-src", type=Path, metavar="DIR", help="a PyTorch checkout")
    source.add_argument("--tests", type=Path, metavar="DIR",
                        help="a tree with upstream's test/ layout (default: .upstream-tests/)")  # fmt: skip
    gate.add_argument("-k", dest="select", help="pytest -k expression, added to each file's own")
    gate.add_argument("--timeout", type=float, default=1800, help="seconds per file and variant")
    gate.add_argument("--test-timeout", type=float, default=600, help="seconds per test")
    gate.add_argument("--out", type=Path, help="report directory (default: REPO/reports)")
    gate.add_argument("--resume", action="store_true",
                      help="reuse a file's earlier result when overlay, file and options match")  # fmt: skip
    gate.add_argument("files", nargs="*", metavar="TEST_FILE", help="only these mapped files")
    gate.add_argument("--fetch", action="store_true",
                      help="fill .upstream-tests/ at the base commit (--from, or --pytorch-src)")  # fmt: skip
    gate.add_argument("--from", dest="from_url", metavar="BASE",
                      help="with --fetch: read BASE/<commit>/<path> (default: raw.githubusercontent.com/pytorch/pytorch)")  # fmt: skip
    gate.add_argument("--expect", type=Path, metavar="MANIFEST",
                      help="with --fetch: refuse files whose sha256 differs from this manifest")  # fmt: skip
    sweep = verb_parser(verbs, "sweep")
    sweep.add_argument("--dtypes", default=SWEEP_DTYPES,
                       help="comma-separated torch dtypes")  # fmt: skip
    sweep.add_argument("--ops", help="comma-separated OpInfo names (default: every registered op)")
    sweep.add_argument("--max-samples", type=int, default=6, help="samples per OpInfo")
    sweep.add_argument("--world-size", type=int, default=2, help="simulated ranks")
    sweep.add_argument("--batch-size", type=int, default=200,
                       help="(dtype, op) pairs per worker process (every dtype in one process)")  # fmt: skip
    sweep.add_argument("--op-timeout", type=float, default=300, help="seconds per op")
    sweep.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    sweep.add_argument("--out", type=Path, help="report directory (default: REPO/reports)")
    sweep.add_argument("--configs",
                       help="comma-separated configurations (1d-2, 1d-3, 1d-2-noncontiguous, "
                       "or 'all'), each sampled; writes sweep-<config>.md and sweep.md")  # fmt: skip
    sweep.add_argument("--resume", action="store_true",
                       help="keep, per (dtype, op), the results of the earlier report of the "
                       "same settings: stock's if stock torch and the worker are the same, the "
                       "overlay's if the overlay files are; run the rest")  # fmt: skip
    sweep.add_argument("--mutations", action="store_true",
                       help="the corpus of wrong rules (tools/strategy_mutations.json): kill "
                       "rate per family, stock vs overlay; --dtypes/--ops narrow it")  # fmt: skip
    sweep.add_argument("--missing", action="store_true",
                       help="the validator's full mode: rules DTensor could have but lacks, "
                       "per configuration (--configs, default 1d-2; --max-samples default "
                       "3), stock vs overlay; writes sweep-missing.md/json")  # fmt: skip
    build, stack = verb_parser(verbs, "build"), verb_parser(verbs, "stack")
    for sub in (build, stack):
        sub.add_argument("--pytorch-src", type=Path, required=True, metavar="DIR",
                         help="a PyTorch git checkout")  # fmt: skip
        sub.add_argument("--onto-head", action="store_true",
                         help="start from the checkout's HEAD with a 3-way apply, not the pinned base")  # fmt: skip
        sub.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    build.add_argument("--branch", help="branch to create (default: torch-overlay/VERSION)")
    build.add_argument("--arch", help="TORCH_CUDA_ARCH_LIST (default: the local GPUs')")
    build.add_argument("--jobs", type=int, help="MAX_JOBS (default: from cores and memory)")
    build.add_argument("--python", help="the Python of a separate build environment to build "
                       "into (required; never this project's .venv)")  # fmt: skip
    stack.add_argument("--prefix", help="branch names are PREFIX/TOPIC (default: torch-overlay)")
    stack.add_argument("--topic", action="append", dest="topics", metavar="NAME",
                       help="only this topic (and those it depends on); repeatable")  # fmt: skip
    compile_cpp = verb_parser(verbs, "compile-cpp")
    compile_cpp.add_argument("patches", nargs="*", metavar="PATCH", help="only these patch files")
    compile_cpp.add_argument("--pytorch-src", type=Path, metavar="DIR",
                             help="read source files from this checkout at the base commit")  # fmt: skip
    compile_cpp.add_argument("--fetch", action="store_true",
                             help="fill .upstream-src/ at the base commit (--from, or --pytorch-src)")  # fmt: skip
    compile_cpp.add_argument("--from", dest="from_url", metavar="BASE",
                             help="with --fetch: read BASE/<commit>/<path> (default: raw.githubusercontent.com/pytorch/pytorch)")  # fmt: skip
    compile_cpp.add_argument("--add", nargs=2, metavar=("PATH", "FILE"),
                             help="record FILE as the copy of source path PATH (with --origin)")  # fmt: skip
    compile_cpp.add_argument("--origin", metavar="OWNER/NAME@COMMIT",
                             help="with --add: the repository and commit FILE is from")  # fmt: skip
    return parser


def verb_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(verbs.choices)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb == "run":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not args.command:
            verb_parsers(parser)["run"].error(
                "give a command after --, e.g. torch-overlay run -- python -m pytest test"
            )

    try:
        repo = (args.repo or find_repo()).resolve()
        return dispatch(repo, args)
    except OverlayError as error:
        print(f"torch-overlay {args.verb}: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print(f"torch-overlay {args.verb}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # a bug: say so in one line, distinct from a refusal
        if os.environ.get(DEBUG_VAR):
            traceback.print_exc()
        first = (str(error).splitlines() or [""])[0]
        print(
            f"torch-overlay {args.verb}: internal error: {type(error).__name__}: {first} "
            f"(a bug; {DEBUG_VAR}=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def warn_if_behind(repo: Path, verb: str) -> None:
    from tools.sync_state import behind_warning

    warning = behind_warning(repo)
    if warning:
        print(f"torch-overlay {verb}: {warning}", file=sys.stderr)


def dispatch(repo: Path, args: argparse.Namespace) -> int:
    if args.verb == "sync":
        from tools.sync import sync

        count = sync(repo, force=args.force, say=print)
        print(f"torch_overlay/ materialized: base + {count} patch commit(s)")
    elif args.verb == "add":
        from tools.add import add

        for path in add(repo, args.paths) or ["(nothing new: already in the base)"]:
            print(f"added {path}")
    elif args.verb == "export":
        from tools.export import export

        print("\n".join(export(repo)) or "patches/ is up to date")
    elif args.verb == "check":
        from tools.check import check
        from tools.compile_cpp import notes

        problems = check(repo)
        for note in notes(repo):
            print(f"note: {note}")
        for problem in problems:
            print(problem)
        print(f"check: {len(problems)} problem(s)" if problems else "check: ok")
        return 1 if problems else 0
    elif args.verb == "run":
        from tools.run import run

        warn_if_behind(repo, args.verb)
        return run(repo, args.command, topic=args.topic)
    elif args.verb == "activate":
        from tools.activate import activate

        warn_if_behind(repo, args.verb)
        plan = activate(repo)
        print(f"activated: {plan.summary()}; re-run activate after editing torch_overlay/")
    elif args.verb == "deactivate":
        from tools.activate import deactivate

        print("deactivated" if deactivate(repo) else "was not active")
    elif args.verb == "status":
        from tools.status import status

        print(status(repo), end="")
    elif args.verb == "build":
        from tools.build import build

        return build(
            repo, args.pytorch_src, branch=args.branch, onto_head=args.onto_head,
            arch=args.arch, jobs=args.jobs, python=args.python, dry_run=args.dry_run,
        )  # fmt: skip
    elif args.verb == "stack":
        from tools.stack import stack

        print(
            stack(
                repo, args.pytorch_src, prefix=args.prefix, onto_head=args.onto_head,
                only=args.topics, dry_run=args.dry_run,
            ),
            end="",
        )  # fmt: skip
    elif args.verb == "verify":
        from tools.verify import verify

        warn_if_behind(repo, args.verb)
        return verify(repo, args.out or repo / "reports")
    elif args.verb == "sweep" and args.mutations:
        from tools.sweep import sweep_mutations

        dtypes_given = args.dtypes != SWEEP_DTYPES
        return sweep_mutations(
            repo, args.out or repo / "reports",
            dtypes=args.dtypes.split(",") if dtypes_given else (),
            only=args.ops.split(",") if args.ops else (), jobs=args.jobs,
            world_size=args.world_size,
        )  # fmt: skip
    elif args.verb == "sweep" and (args.missing or args.configs):
        from tools.sweep import CONFIGS, sweep_configs, sweep_missing

        configs = ["1d-2"] if not args.configs else (
            list(CONFIGS) if args.configs == "all" else args.configs.split(","))  # fmt: skip
        dtypes_given = args.dtypes != SWEEP_DTYPES
        return (sweep_missing if args.missing else sweep_configs)(
            repo, args.out or repo / "reports", configs,
            only=args.ops.split(",") if args.ops else (),
            dtypes=args.dtypes.split(",") if dtypes_given else None,
            max_samples=args.max_samples if args.max_samples != 6 else None,
            resume=args.resume, batch_size=args.batch_size, op_timeout=args.op_timeout,
            jobs=args.jobs,
        )  # fmt: skip
    elif args.verb == "sweep":
        from tools.sweep import sweep

        return sweep(
            repo, args.out or repo / "reports", dtypes=args.dtypes.split(","),
            only=args.ops.split(",") if args.ops else (), max_samples=args.max_samples,
            world_size=args.world_size, batch_size=args.batch_size,
            op_timeout=args.op_timeout, jobs=args.jobs, resume=args.resume,
        )  # fmt: skip
    elif args.verb == "compile-cpp":
        from tools import compile_cpp

        if args.add or args.fetch:
            if args.patches or (args.add and (args.fetch or args.pytorch_src or args.from_url)):
                raise OverlayError(
                    "--fetch takes only --from or --pytorch-src; --add only --origin"
                )
            if args.add:
                if not args.origin:
                    raise OverlayError("--add PATH FILE needs --origin OWNER/NAME@COMMIT")
                print(compile_cpp.add(repo, args.add[0], Path(args.add[1]), args.origin))
            else:
                print(compile_cpp.fetch(repo, base=args.from_url, pytorch_src=args.pytorch_src))
            return 0
        if args.from_url or args.origin:
            raise OverlayError("--from goes with --fetch, --origin with --add")
        return compile_cpp.compile_cpp(repo, pytorch_src=args.pytorch_src, only=args.patches)
    elif args.verb == "upstream-test" and args.fetch:
        from tools.fetch_upstream_tests import fetch

        if args.tests or args.files or args.select or args.resume:
            raise OverlayError("--fetch takes only --from, --pytorch-src and --expect")
        print(fetch(repo, base=args.from_url, pytorch_src=args.pytorch_src, expect=args.expect))
    elif args.verb == "upstream-test":
        from tools.upstream_test import upstream_test

        if args.from_url or args.expect:
            raise OverlayError("--from and --expect go with --fetch")
        return upstream_test(
            repo, pytorch_src=args.pytorch_src, tests=args.tests, only=args.files,
            select=args.select, timeout=args.timeout, test_timeout=args.test_timeout,
            out=args.out, resume=args.resume,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
