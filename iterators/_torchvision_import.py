"""Makes torchvision importable where its C++ operators cannot load (one place for the workaround).

PyPI's torchvision 0.28.0 is built against PyPI's CUDA torch; beside a
CPU-only torch 2.13.0 its ``_C`` library cannot load (it links
``libtorch_cuda``). torchvision means to work without it (datasets,
transforms and models are Python; only ``torchvision.ops`` needs the
library), but 0.28's ``_meta_registrations`` registers fake kernels for
``torchvision::nms`` and ``qnms`` without checking, so the import fails.
Defining those two schemas first lets it import; calling ``nms`` then
raises torch's own "no kernel" error, which is what a missing library
means. Where the library loads, nothing here changes anything.

Two ways in:

- ``install()``, from a ``.pth`` file that ``scripts/bootstrap.sh`` writes
  into the venv only where the plain import fails: a finder that waits for
  the first ``import torchvision`` (by the user's script, Lightning,
  torchmetrics, in any order, in every process) and defines the schemas
  just before it, if the library does not load. It costs nothing until
  then: torch is imported only when torchvision is.
- ``import_torchvision()``, from stager's own modules, for installs
  without that file.
"""

import importlib.machinery
import importlib.util
import os
import sys

_schemas = None  # the Library holding the two schemas: alive as long as the process


def _library_loads(package_dir):
    """True when torchvision's ``_C`` library loads beside this torch."""
    import torch

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(package_dir, "_C" + suffix)
        if os.path.exists(path):
            try:
                torch.ops.load_library(path)
                return True
            except OSError:
                return False
    return False


def _define_schemas():
    global _schemas
    if _schemas is not None:
        return
    import torch

    _schemas = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        _schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _BeforeTorchvision:
    """A meta-path finder that prepares torch for torchvision at its first import, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec("torchvision")
        if spec is not None and spec.submodule_search_locations:
            if not _library_loads(spec.submodule_search_locations[0]):
                _define_schemas()
        return spec


def install():
    """Prepares the first ``import torchvision`` of this interpreter (called by the venv's ``.pth`` file)."""
    if "torchvision" not in sys.modules and not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


def import_torchvision():
    """Returns the ``torchvision`` module, or None where it is not installed."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package, so that it is imported again whole
    _define_schemas()
    import torchvision
    return torchvision
