"""`torch-overlay verify`: run every reproducer on stock torch and with the overlay, print a
table, write it as Markdown and JSON, and fail if any reproducer fails with the overlay."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.active import environment, materialize
from tools.reproducers import load_all


def run_reproducers(repo: Path, tree: Path | None) -> dict[str, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.reproducers"],
        cwd=repo,
        env=environment(tree),
        capture_output=True,
        text=True,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            results[result["name"]] = result
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"reproducers crashed ({'overlay' if tree else 'stock'} torch)")
    return results


def cell(result: dict, width: int = 160) -> str:
    detail = result["detail"]
    detail = detail if len(detail) <= width else detail[: width - 1] + "…"
    return ("ok: " if result["ok"] else "WRONG: ") + detail


def verify(repo: Path, out_dir: Path) -> int:
    registry = load_all()
    with tempfile.TemporaryDirectory(prefix="torch-overlay-verify-") as scratch:
        tree = Path(scratch) / "tree"
        plan = materialize(repo, tree)
        print(f"torch-overlay: {plan.summary()}")
        if not plan.commits:
            print("the series is empty: there are no patches, so there is nothing to verify")
        stock = run_reproducers(repo, None) if registry else {}
        overlay = run_reproducers(repo, tree) if registry else {}
    held_back = {c.subject for c in plan.held_back}
    rows = []
    for name, rep in sorted(registry.items()):
        if rep.patch in held_back:
            verdict = "SKIP (fix needs a source build)"
        else:
            verdict = "PASS" if overlay[name]["ok"] else "FAIL"
        rows.append({
            "name": name, "bug": rep.bug, "upstream": rep.upstream, "patch": rep.patch,
            "stock": cell(stock[name]), "overlay": cell(overlay[name]), "verdict": verdict,
            "stock_shows_bug": not stock[name]["ok"],
        })  # fmt: skip
    header = ["bug", "upstream", "stock torch", "with overlay", "verdict"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["bug"], row["upstream"], row["stock"], row["overlay"], row["verdict"]]
        table.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "verify.md").write_text("\n".join(table) + "\n")
    (out_dir / "verify.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(table))
    failed = [r["name"] for r in rows if r["verdict"] == "FAIL"]
    passed = [r["name"] for r in rows if r["verdict"] == "PASS"]
    unshown = [r["name"] for r in rows if not r["stock_shows_bug"]]
    if unshown:
        print(f"note: stock torch did not show the bug in: {', '.join(unshown)}")
    skipped = len(rows) - len(passed) - len(failed)
    print(f"{len(passed)} of {len(rows)} reproducer(s) pass with the overlay, {len(failed)} fail, "
          f"{skipped} skipped (fix needs a source build); "
          f"report written to {out_dir}/verify.md and verify.json")  # fmt: skip
    return 1 if failed else 0
