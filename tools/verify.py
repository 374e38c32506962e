"""`torch-overlay verify`: run every reproducer on stock torch and with the overlay, print a
table, write it as Markdown and JSON, and fail if any reproducer fails with the overlay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools.active import run_stock_and_overlay
from tools.reproducers import load_all


def parse_results(stdout: str) -> dict[str, dict]:
    """The reproducers' results: one JSON object per line."""
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {result["name"]: result for result in results}


def cell(result: dict, width: int = 160) -> str:
    detail = result["detail"]
    detail = detail if len(detail) <= width else detail[: width - 1] + "…"
    return ("ok: " if result["ok"] else "WRONG: ") + detail


def verify(repo: Path, out_dir: Path) -> int:
    registry = load_all()
    plan, stock_out, overlay_out = run_stock_and_overlay(
        repo, [sys.executable, "-m", "tools.reproducers"]
    )
    print(f"torch-overlay: {plan.summary()}")
    if not plan.commits:
        print("the series is empty: there are no patches, so there is nothing to verify")
    stock, overlay = parse_results(stock_out), parse_results(overlay_out)
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
