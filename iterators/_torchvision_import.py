"""Imports torchvision where its C++ operators cannot load (one place for the workaround).

PyPI's torchvision 0.28.0 is built against PyPI's CUDA torch; beside a
CPU-only torch 2.13.0 its ``_C`` library cannot load (it links
``libtorch_cuda``). torchvision means to work without it (datasets,
transforms and models are Python; only ``torchvision.ops`` needs the
library), but 0.28's ``_meta_registrations`` registers fake kernels for
``torchvision::nms`` and ``qnms`` without checking, so the import fails.
Defining those two schemas first lets it import; calling ``nms`` then
raises torch's own "no kernel" error, which is what a missing library
means. Where the library loads, nothing here runs.
"""

import sys

_schemas = None  # the Library holding the two schemas: alive as long as the process


def import_torchvision():
    """Returns the ``torchvision`` module, or None where it is not installed."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    global _schemas
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package, so that it is imported again whole
    _schemas = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        _schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
    return torchvision


torchvision = import_torchvision()
