"""`torch-overlay verify`: run every reproducer on stock torch and with the overlay, print a
table, write it as Markdown and JSON, and fail if any reproducer fails with the overlay.

Below the table it shows upstream's gates, so a reader sees whether the series is ready to
submit: upstream's own tests (from the last `upstream-test` report), upstream's lint rules on
the patched files (run now), and the worst ratio of `benchmarks/dtensor_dispatch.py` (from
its last report). A report made with other overlay files is shown as stale, not as a result;
for upstream's tests the last whole run's verdict is shown, with its age.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from tools import lint_upstream, topics
from tools.active import overlay_digest, run_stock_and_overlay
from tools.reproducers import load_all


def parse_results(stdout: str) -> dict[str, dict]:
    """The reproducers' results: one JSON object per line."""
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {result["name"]: result for result in results}


def cell(result: dict, width: int = 160) -> str:
    detail = result["detail"]
    detail = detail if len(detail) <= width else detail[: width - 1] + "…"
    return ("ok: " if result["ok"] else "WRONG: ") + detail


def saved_report(path: Path, digest: str, how: str) -> tuple[dict | None, str]:
    """A gate's last report, or None and why it cannot be used."""
    if not path.is_file():
        return None, f"not run: {how}"
    data = json.loads(path.read_text())
    if data.get("overlay_files") != digest:
        return None, f"stale (made with other overlay files): {how}"
    return data, ""


def age(report: dict, now: datetime | None = None) -> str:
    """How long ago a report was written, e.g. "3 h ago"."""
    if "written" not in report:
        return "at an unknown time"
    elapsed = (now or datetime.now(timezone.utc)) - datetime.fromisoformat(report["written"])
    minutes = max(0, int(elapsed.total_seconds() // 60))
    for unit, size in (("d", 1440), ("h", 60)):
        if minutes >= size:
            return f"{minutes // size} {unit} ago"
    return f"{minutes} min ago"


def upstream_tests_row(out_dir: Path, digest: str) -> dict:
    """The last whole `upstream-test` run's verdict. A narrowed run (files or -k) writes its own
    report and never stands in for it; one made since is named after it."""
    path = out_dir / "upstream-test.json"
    if not path.is_file():
        return {"gate": "upstream's tests", "ok": None,
                "detail": "not run: torch-overlay upstream-test"}  # fmt: skip
    data = json.loads(path.read_text())
    names = [f"{f['path']}::{t}" for f in data["files"] for t in f["regressions"]]
    unseen = data["not_compared"]
    detail = (f"last whole run {age(data)}: {len(data['files'])} file(s) run, "
              f"{data['regressions']} regression(s)" + (f" ({', '.join(names)})" if names else "")
              + f", {data['fixed']} fixed")  # fmt: skip
    if unseen:
        detail += f"; not compared: {', '.join(unseen)}"
    if data.get("narrowed"):  # a report written before narrowed runs had their own
        detail += "; a narrowed run (files or -k given)"
    # A regression fails the gate; without one it passes only if everything was compared.
    ok = False if names else (None if unseen or data.get("narrowed") else True)
    if data.get("overlay_files") != digest:
        detail, ok = f"stale (made with other overlay files): {detail}", None
    subset = out_dir / "upstream-test-subset.json"
    if subset.is_file():
        later = json.loads(subset.read_text())
        if later.get("written", "") > data.get("written", ""):
            stale = "" if later.get("overlay_files") == digest else ", stale"
            detail += f"; a later narrowed run ({age(later)}{stale}): {later.get('verdict', '?')}"
    return {"gate": "upstream's tests", "ok": ok, "detail": detail, "regressions": names}


def gates(repo: Path, out_dir: Path) -> list[dict]:
    """One row per gate: name, ok (None when there is no current result) and detail."""
    digest = overlay_digest(repo)
    rows = [upstream_tests_row(out_dir, digest)]
    findings = [json.loads(m) for m in lint_upstream.lint(repo)]
    rows.append({
        "gate": "upstream's lint rules on patched files", "ok": not findings,
        "detail": f"{len(findings)} new warning(s)" + "".join(
            f"; {f['path'].removeprefix('patches/')}: {f['description'].splitlines()[0]}"
            for f in findings),
    })  # fmt: skip
    data, why = saved_report(out_dir / "dtensor_dispatch.json", digest,
                             "python benchmarks/dtensor_dispatch.py")  # fmt: skip
    if data is None or not data.get("worst"):
        rows.append({"gate": "DTensor dispatch cost", "ok": None, "detail": why or "no rows"})
    else:
        worst, limit = data["worst"], data["ratio_limit"]
        detail = (f"worst {worst['ratio']:.2f}x ({worst['row']}); "
                  f"{len(data['flagged'])} row(s) over {limit}x or growing a cache")  # fmt: skip
        ok = not data["flagged"]
        if data["partial"]:  # --only or --quick: rows missing or too few repetitions
            detail, ok = detail + "; a partial run (--only or --quick)", ok and None
        rows.append({"gate": "DTensor dispatch cost", "ok": ok, "detail": detail})
    return rows


def gate_table(rows: list[dict]) -> list[str]:
    table = ["## Upstream's gates", "", "| gate | result | detail |", "|---|---|---|"]
    for row in rows:
        cells = [row["gate"], {True: "PASS", False: "FAIL", None: "—"}[row["ok"]], row["detail"]]
        table.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    ready = all(row["ok"] for row in rows)
    table += ["", "Ready to submit upstream: " + ("yes" if ready else "no")]
    return table


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
    gate_rows = gates(repo, out_dir)
    table += ["", *gate_table(gate_rows)]
    patch_rows = topics.patch_rows(repo, held_back)
    table += [
        "",
        "## Patches",
        "",
        "| patch | topic | upstream | on this wheel |",
        "|---|---|---|---|",
    ]
    table += [f"| {r['patch']} | {r['topic']} | {r['upstream']} | {r['wheel']} |"
              for r in patch_rows]  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "verify.md").write_text("\n".join(table) + "\n")
    report = {"reproducers": rows, "gates": gate_rows, "patches": patch_rows}
    (out_dir / "verify.json").write_text(json.dumps(report, indent=2) + "\n")
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
