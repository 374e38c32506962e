"""Loaded by every Python process that ``torch-overlay run`` starts (through PYTHONPATH)."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "torch_overlay_finder", os.path.join(os.path.dirname(_here), "torch_overlay_finder.py")
)
_finder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_finder)
sys.modules.setdefault("torch_overlay_finder", _finder)
# An empty value means stock torch, even in a venv where the overlay is activated.
_finder.install(os.environ.get("TORCH_OVERLAY_ACTIVE", ""))

# Chain to the sitecustomize this one shadows, if the environment has one.
_others = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
