"""The `torch-overlay` command: one subcommand per verb, each in its own module."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tools.base import OverlayError, find_repo

sweep_dtypes_default = ",".join(("float32", "float64", "bfloat16", "int64", "bool"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torch-overlay",
        description="Carry PyTorch distributed fixes as a patch series over an installed torch.",
    )
    parser.add_argument("--repo", type=Path, help="project checkout (default: found from cwd)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    sync = verbs.add_parser("sync", help="materialize torch_overlay/ from the wheel + patches")
    sync.add_argument("--force", action="store_true", help="discard unexported overlay work")
    add = verbs.add_parser("add", help="bring upstream files into the overlay to edit them")
    add.add_argument("paths", nargs="+", metavar="PATH", help="e.g. torch/distributed/...py")
    verbs.add_parser("export", help="write the overlay's commits back to patches/")
    verbs.add_parser("check", help="series applies, nothing unexported, messages upstream-ready")
    run = verbs.add_parser("run", help="run a command with the overlay active")
    run.add_argument("--topic", metavar="NAME",
                     help="only this topic's patches (and those it depends on), from patches/")  # fmt: skip
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS…]")
    verbs.add_parser("activate", help="make the overlay the venv's default")
    verbs.add_parser("deactivate", help="undo activate")
    verbs.add_parser("status", help="base, active patches, held-back patches, overlaid modules")
    verify = verbs.add_parser("verify", help="every reproducer on stock torch and the overlay")
    verify.add_argument("--out", type=Path, help="report directory (default: REPO/reports)")
    gate = verbs.add_parser(
        "upstream-test", help="upstream's tests for the touched modules, stock vs overlay"
    )
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
    sweep = verbs.add_parser(
        "sweep", help="upstream's strategy validator over every registered op, stock vs overlay"
    )
    sweep.add_argument("--dtypes", default=sweep_dtypes_default,
                       help="comma-separated torch dtypes")  # fmt: skip
    sweep.add_argument("--ops", help="comma-separated OpInfo names (default: every registered op)")
    sweep.add_argument("--max-samples", type=int, default=6, help="samples per OpInfo")
    sweep.add_argument("--world-size", type=int, default=2)
    sweep.add_argument("--batch-size", type=int, default=40, help="ops per worker process")
    sweep.add_argument("--op-timeout", type=float, default=300, help="seconds per op")
    sweep.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    sweep.add_argument("--out", type=Path, help="report directory (default: REPO/reports)")
    sweep.add_argument("--configs",
                       help="comma-separated configurations (1d-2, 1d-3, 1d-2-noncontiguous, "
                       "or 'all'), each sampled; writes sweep-<config>.md and sweep.md")  # fmt: skip
    sweep.add_argument("--resume", action="store_true",
                       help="with --configs: keep a configuration's report made with the same "
                       "overlay files and settings")  # fmt: skip
    sweep.add_argument("--mutations", action="store_true",
                       help="the corpus of wrong rules (tools/strategy_mutations.json): kill "
                       "rate per family, stock vs overlay; --dtypes/--ops narrow it")  # fmt: skip
    build = verbs.add_parser(
        "build", help="apply the series as a branch of a PyTorch checkout and build it with CUDA"
    )
    stack = verbs.add_parser(
        "stack", help="one branch per topic in a PyTorch checkout, ready for ghstack submit"
    )
    for sub in (build, stack):
        sub.add_argument("--pytorch-src", type=Path, required=True, metavar="DIR")
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
    args = parser.parse_args(argv)

    try:
        repo = (args.repo or find_repo()).resolve()
        return dispatch(repo, args)
    except OverlayError as error:
        print(f"torch-overlay {args.verb}: error: {error}", file=sys.stderr)
        return 2


def dispatch(repo: Path, args: argparse.Namespace) -> int:
    if args.verb == "sync":
        from tools.sync import sync

        count = sync(repo, force=args.force)
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

        problems = check(repo)
        for problem in problems:
            print(problem)
        print(f"check: {len(problems)} problem(s)" if problems else "check: ok")
        return 1 if problems else 0
    elif args.verb == "run":
        from tools.run import run

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return run(repo, command, topic=args.topic)
    elif args.verb == "activate":
        from tools.activate import activate

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

        return verify(repo, args.out or repo / "reports")
    elif args.verb == "sweep" and args.mutations:
        from tools.sweep import sweep_mutations

        dtypes_given = args.dtypes != sweep_dtypes_default
        return sweep_mutations(
            repo, args.out or repo / "reports",
            dtypes=args.dtypes.split(",") if dtypes_given else (),
            only=args.ops.split(",") if args.ops else (), jobs=args.jobs,
        )  # fmt: skip
    elif args.verb == "sweep" and args.configs:
        from tools.sweep import CONFIGS, sweep_configs

        configs = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
        dtypes_given = args.dtypes != sweep_dtypes_default
        return sweep_configs(
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
            op_timeout=args.op_timeout, jobs=args.jobs,
        )  # fmt: skip
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
