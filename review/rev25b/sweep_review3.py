"""Run `sweep --mutations` (tools.sweep.sweep_mutations, the CLI's path) on the corpus
entries of review rev25b only, at world size 2 and 3; stock vs overlay."""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "/work/wt-rev25b")
from tools import mutations  # noqa: E402
from tools.sweep import sweep_mutations  # noqa: E402

REPO = Path("/work/wt-rev25b")
prefix = sys.argv[1] if len(sys.argv) > 1 else "review3-"
corpus = mutations.load()
subset = [e for e in corpus["entries"] if e["id"].startswith(prefix)]
for ws in (2, 3):
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "corpus.json"
        path.write_text(json.dumps({**corpus, "world_size": ws, "entries": subset}))
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = sweep_mutations(REPO, Path(scratch), corpus_path=path)
        report = json.loads((Path(scratch) / "sweep-mutations.json").read_text())
    print(f"== world size {ws}: exit {code}; lost (killed on stock, not with the overlay): {len(report['lost'])}")
    for e in subset:
        s = report["results"]["stock"].get(e["id"], {})
        o = report["results"]["overlay"].get(e["id"], {})
        print(f"  {e['id']}: stock {s.get('verdict', s.get('status'))}, overlay "
              f"{o.get('verdict', o.get('status'))} {o.get('detail', '')[:60]}")
