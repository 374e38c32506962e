"""Import hook that makes overlaid torch modules shadow the installed ones.

Standard library only: it is loaded in every Python process of an activated environment
(from ``torch_overlay.pth``) or of a ``torch-overlay run`` (from ``run/sitecustomize.py``),
before torch is imported. Nothing in site-packages is modified.
"""

import importlib.machinery
import importlib.util
import os
import sys

PYTHON_SUFFIX = ".py"


class OverlayFinder:
    """Serves ``torch.*`` modules whose source lies under ``root`` (at their package paths)."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.modules = {}  # module name -> overlay file
        for dirpath, _, filenames in os.walk(os.path.join(self.root, "torch")):
            for filename in filenames:
                if filename.endswith(PYTHON_SUFFIX):
                    path = os.path.join(dirpath, filename)
                    rel = os.path.relpath(path, self.root)[: -len(PYTHON_SUFFIX)]
                    parts = rel.split(os.sep)
                    if parts[-1] == "__init__":
                        parts.pop()
                    self.modules[".".join(parts)] = path

    def find_spec(self, fullname, path=None, target=None):
        overlay_file = self.modules.get(fullname)
        if overlay_file is None:
            return None
        installed = importlib.machinery.PathFinder.find_spec(fullname, path)
        if overlay_file.endswith("__init__.py"):
            # Other submodules of an overlaid package still come from the wheel.
            locations = installed.submodule_search_locations if installed else None
            locations = locations or [os.path.dirname(overlay_file)]
        else:
            locations = None
        return importlib.util.spec_from_file_location(
            fullname, overlay_file, submodule_search_locations=locations
        )

    def invalidate_caches(self):
        pass


def install(root):
    """Put a finder for ``root`` first on ``sys.meta_path``, replacing an earlier one."""
    # Compared by name: the .pth and sitecustomize.py may each have loaded this file.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "OverlayFinder"]
    if root and os.path.isdir(root):
        sys.meta_path.insert(0, OverlayFinder(root))


def active_finder():
    return next((f for f in sys.meta_path if type(f).__name__ == "OverlayFinder"), None)
