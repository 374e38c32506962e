"""Run reproducers in this process and print one JSON object per line.

`torch-overlay verify` runs this twice: once on stock torch and once with the overlay.
"""

from __future__ import annotations

import argparse
import json
import traceback

from tools.reproducers import load_all


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.reproducers")
    parser.add_argument("names", nargs="*", help="reproducers to run (default: all)")
    args = parser.parse_args()
    registry = load_all()
    for name in args.names or sorted(registry):
        try:
            outcome = registry[name].run()
            result = {"name": name, "ok": outcome.ok, "detail": outcome.detail}
        except Exception as error:  # a crash is a result too: the bug may be an exception
            last = traceback.extract_tb(error.__traceback__)[-1]
            detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            result = {"name": name, "ok": False, "detail": f"{detail} ({last.name})"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
