"""Import hook that makes overlaid torch modules shadow the installed ones.

Standard library only: it is loaded in every Python process of an activated environment
(from ``torch_overlay.pth``) or of a ``torch-overlay run`` (from ``run/sitecustomize.py``),
before torch is imported. Nothing in site-packages is modified.

The overlay is only correct on the release it was made for, and a child process may run
another interpreter than the one that started it. So at the first ``torch`` import it sees,
the hook checks the torch that this interpreter would import (its ``version.py``, read
without importing torch, and the sha256 of every file the overlay replaces) against the pin
that ``materialize`` wrote into the tree, and refuses with ImportError on any mismatch.
"""

import importlib.machinery
import importlib.util
import linecache
import os
import sys
import types

PYTHON_SUFFIX = ".py"
# Written by tools/active.py materialize(): the pinned release and the base sha256 of the
# files this tree replaces.
PIN_NAME = "torch-overlay-pin.json"
VERSION_FIELD = r"""^(__version__|git_version)\s*(?::[^=]*)?=\s*['"]([^'"]*)['"]"""


class OverlayLoader(importlib.machinery.SourceFileLoader):
    """Loads an overlay file as the installed module it replaces.

    The module's ``__file__`` and its code's ``co_filename`` name the installed file's path,
    because torch decides by path what is torch's own code: Dynamo skips or inlines a
    function by its file (``trace_rules.check_file``: ``torch/_dynamo`` is skipped,
    ``torch/distributed/tensor`` is inlined only where called, code outside torch is traced
    as the user's), and a module loaded from the overlay's tree would be traced as user
    code (more graph breaks, other graphs, other compile times than the patched torch).
    ``linecache`` gets the overlay's lines under that path, so tracebacks and ``inspect``
    show the source that runs."""

    def __init__(self, fullname, overlay_file, installed_file):
        super().__init__(fullname, overlay_file)
        self.installed_file = installed_file

    def get_code(self, fullname):
        # The bytecode cache stays in the tree; it records the overlay file's path.
        return renamed(super().get_code(fullname), self.installed_file)

    def exec_module(self, module):
        source = importlib.util.decode_source(self.get_data(self.path))
        lines = source.splitlines(True)
        # mtime None: linecache.checkcache() keeps the entry (it would re-read the
        # installed file, whose lines differ, if the entry were dropped).
        linecache.cache[self.installed_file] = (len(source), None, lines, self.installed_file)
        super().exec_module(module)


def renamed(code, filename):
    """``code`` and the code objects nested in it, with ``co_filename`` set to ``filename``."""
    consts = tuple(
        renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


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
        self.torch_checked = False

    def find_spec(self, fullname, path=None, target=None):
        if not self.torch_checked and fullname.partition(".")[0] == "torch":
            check_shadowed_torch(self.root)
            self.torch_checked = True
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
        if installed is not None and installed.origin and installed.has_location:
            installed_file = installed.origin
        else:  # a file the patches add: where the installed torch would have it
            installed_file = os.path.join(self.site_dir(), os.path.relpath(overlay_file, self.root))
        spec = importlib.util.spec_from_file_location(
            fullname,
            installed_file,
            loader=OverlayLoader(fullname, overlay_file, installed_file),
            submodule_search_locations=locations,
        )
        spec.cached = importlib.util.cache_from_source(overlay_file)
        return spec

    def site_dir(self):
        """The directory holding the installed ``torch`` package."""
        torch_spec = importlib.machinery.PathFinder.find_spec("torch")
        if torch_spec is None or not torch_spec.origin:
            return self.root
        return os.path.dirname(os.path.dirname(torch_spec.origin))

    def invalidate_caches(self):
        pass


def check_shadowed_torch(root):
    """Raise ImportError unless the torch this interpreter imports is the one the overlay at
    ``root`` was made for."""
    import hashlib  # here, not at the top: interpreters that never import torch skip them
    import json
    import re

    where = f"torch-overlay (this interpreter: {sys.executable})"
    try:
        with open(os.path.join(root, PIN_NAME)) as file:
            pin = json.load(file)
    except FileNotFoundError:
        raise ImportError(
            f"{where}: {root} has no {PIN_NAME} (made by an older torch-overlay, or removed "
            "since); re-run torch-overlay activate or run"
        ) from None
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        package = os.path.dirname(torch.__file__)
    else:
        spec = importlib.machinery.PathFinder.find_spec("torch")
        if spec is None or not spec.origin:
            return  # no torch to shadow: the import fails as it would without the overlay
        package = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(package, "version.py")) as file:
            found = dict(re.findall(VERSION_FIELD, file.read(), re.M))
    except FileNotFoundError:
        found = {}
    version = found.get("__version__", "unknown")
    git_version = found.get("git_version", "unknown")
    pinned = f"torch {pin['torch_version']} (git {pin['git_version'][:12]})"
    if version.split("+", 1)[0] != pin["torch_version"] or git_version != pin["git_version"]:
        raise ImportError(
            f"{where}: the torch it imports, {package}, is torch {version} (git "
            f"{git_version[:12]}), but the overlay is made for {pinned}; run this command "
            "with a Python whose torch is the pinned release, or without the overlay"
        )
    site = os.path.dirname(package)
    for rel, expected in sorted(pin["files"].items()):
        path = os.path.join(site, rel)
        try:
            with open(path, "rb") as file:
                actual = hashlib.sha256(file.read()).hexdigest()
        except FileNotFoundError:
            actual = None
        if actual != expected:
            state = f"has sha256 {actual[:16]}…" if actual else "is missing"
            raise ImportError(
                f"{where}: the overlay replaces {rel}, but {path} {state}, where the pinned "
                f"base ({pinned}) has sha256 {expected[:16]}…; reinstall it: {sys.executable} "
                f"-m pip install --force-reinstall --no-deps torch=={pin['torch_version']}"
            )


INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"
INDUCTOR_CACHE_LEAF = "torch-overlay-"


def separate_inductor_cache(finder):
    """Give the overlay at ``finder`` (None: stock torch) its own inductor cache directory.

    Inductor's on-disk caches (FX graph cache, AOTAutograd cache) key an artifact by a hash
    of the installed torch's source files (``torch_key``), which the overlay leaves as they
    are: an overlay process would load what stock torch compiled (an AOTAutograd graph with
    stock's runtime metadata, for instance) and stock would load the overlay's. So overlay
    processes use a subdirectory named by a hash of the overlaid files, and stock processes
    started from one get the parent back."""
    import hashlib
    import re

    current = os.environ.get(INDUCTOR_CACHE_VAR, "")
    if os.path.basename(current).startswith(INDUCTOR_CACHE_LEAF):
        current = os.path.dirname(current)  # inherited from an overlay process
    if finder is None:
        if current:
            os.environ[INDUCTOR_CACHE_VAR] = current
        return
    digest = hashlib.sha256()
    for name, path in sorted(finder.modules.items()):
        with open(path, "rb") as file:
            digest.update(name.encode() + b"\0" + hashlib.sha256(file.read()).digest())
    if not current:  # inductor's default_cache_dir()
        import getpass
        import tempfile

        try:
            user = getpass.getuser()
        except (KeyError, ModuleNotFoundError, OSError):
            user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
        user = re.sub(r'[\\/:*?"<>|]', "_", user)
        current = os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
    leaf = INDUCTOR_CACHE_LEAF + digest.hexdigest()[:16]
    os.environ[INDUCTOR_CACHE_VAR] = os.path.join(current, leaf)


def install(root):
    """Put a finder for ``root`` first on ``sys.meta_path``, replacing an earlier one, and
    give it its own inductor cache directory (see separate_inductor_cache)."""
    # Compared by name: the .pth and sitecustomize.py may each have loaded this file.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "OverlayFinder"]
    finder = None
    if root and os.path.isdir(root):
        finder = OverlayFinder(root)
        sys.meta_path.insert(0, finder)
    separate_inductor_cache(finder)


def active_finder():
    return next((f for f in sys.meta_path if type(f).__name__ == "OverlayFinder"), None)
