#!/usr/bin/env bash
# Set up the project on a fresh machine (or refresh it): the venv with the pinned torch and
# tools, then torch_overlay/ from the wheel + patches. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
.venv/bin/torch-overlay sync
