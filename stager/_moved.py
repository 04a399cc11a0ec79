"""The import paths of modules that moved into rooms in 0.2, kept working for one release.

``import stager.pipeline`` (and every other path below) still works and
gives the same objects, with a ``DeprecationWarning`` naming the new path;
0.3 removes them. Each old module is an alias: a module object of its own
whose attributes are looked up in the module(s) its contents went to, so
``stager.pipeline.Pipeline is stager.engine.Pipeline``.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

REMOVED_IN = "0.3"

# old module -> the modules its names now live in, searched in order.
MOVED = {
    "stager.catalog_build": ("stager.catalog.build",),
    "stager.catalog_file": ("stager.catalog.mapped", "stager.catalog.broadcast"),
    "stager.torchcomm": ("stager.world.torchcomm",),
    "stager.basedir": ("stager.storage.basedir",),
    "stager.jobdir": ("stager.storage.jobdir",),
    "stager.janitor": ("stager.storage.janitor",),
    "stager.leftovers": ("stager.storage.leftovers",),
    "stager.loaders": ("stager.formats.files",),
    "stager.images": ("stager.formats.images",),
    "stager.stats": ("stager.telemetry.stats",),
    "stager.report": ("stager.telemetry",),
    "stager.report.accounting": ("stager.telemetry.accounting",),
    "stager.report.advice": ("stager.telemetry.advice",),
    "stager.report.collect": ("stager.telemetry.collect",),
    "stager.report.plots": ("stager.telemetry.plots",),
    "stager.report.summary": ("stager.telemetry.summary",),
    "stager.cli_insight": ("stager.cli.insight",),
    "stager.messages": ("stager.engine.messages", "stager.telemetry.events"),
    "stager.peers": ("stager.engine.peers",),
    "stager.model.equations": ("stager.engine.perf.equations",),
    "stager.model.tune": ("stager.engine.perf.tune",),
}
MOVED.update({f"stager.{name}": (f"stager.engine.{name}",) for name in (
    "autocounts", "coordinator", "deadlines", "forksafe", "inflight", "limits", "pipeline", "service",
    "service_loop", "shutdown", "stalls", "wire", "workerpool", "workers")})
MOVED.update({f"stager.peers.{name}": (f"stager.engine.peers.{name}",) for name in (
    "fetcher", "model", "node", "ownership", "protocol", "server")})
PACKAGES = {"stager.peers", "stager.report"}


def _warn(old, new, stacklevel=3):
    # The default points at the import statement: the import system's own frames are skipped.
    warnings.warn(f"{old} moved to {new}; the old name works until stager {REMOVED_IN}", DeprecationWarning,
                  stacklevel=stacklevel)


class _Alias(types.ModuleType):
    """An old module: its names are looked up in the modules they moved to."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        for target in self.__dict__.get("_stager_targets", ()):
            if hasattr(target, name):
                return getattr(target, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self):
        names = set()
        for target in self.__dict__.get("_stager_targets", ()):
            names.update(dir(target))
        return sorted(names)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in ``MOVED`` and loads each as an ``_Alias``."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in PACKAGES)

    def create_module(self, spec):
        return _Alias(spec.name)

    def exec_module(self, module):
        targets = MOVED[module.__name__]
        _warn(module.__name__, " and ".join(targets))
        module._stager_targets = tuple(importlib.import_module(t) for t in targets)


def moved_attribute(module, name, new_module, names):
    """A module's ``__getattr__`` for ``names`` that moved to ``new_module``: the object, with a warning.

    Raises:
        AttributeError: For any other name, as a module without it would.
    """
    if name not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{new_module}.{name}", stacklevel=4)  # the caller of the module's __getattr__
    return getattr(importlib.import_module(new_module), name)


def install():
    """Puts the finder for the old paths on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
