#!/usr/bin/env bash
# Set up the project on a fresh machine (or refresh it): the venv with the pinned torch and
# tools, then torch_overlay/ from the wheel + patches. Safe to run again. One line per step,
# so a first run (about 3 GB of downloads) never looks stuck.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "bootstrap: $*" >&2; }
if [ -x .venv/bin/python ]; then
  step "1/3 venv: .venv exists"
else
  step "1/3 venv: creating .venv"
  python3 -m venv .venv
fi
step "2/3 pip: installing torch 2.15.0 and the tools (pip install -e .; the first run downloads ~3 GB)"
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
step "3/3 sync: torch_overlay/ from the wheel + patches/ (keeps the overlay's own work)"
.venv/bin/torch-overlay sync
step "done: .venv/bin/torch-overlay status shows the state"
