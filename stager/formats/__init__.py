"""How a sample is found in what was staged and decoded from it, one module per format family.

``files`` is the family of one sample per file: its decoders (``raw``,
``npy``, ``hdf5``, ``image``, or a ``module:function`` of the user's) are
chosen by name from ``LOADERS`` (``dataset.loader``); ``images`` decodes
JPEG and PNG.

May import: ``errors``.
"""

from .files import (LOADERS, EmptySample, check_loader_name, load_hdf5, load_image, load_npy, load_raw, make_loader,
                    resolve_loader)

__all__ = ["EmptySample", "LOADERS", "check_loader_name", "load_hdf5", "load_image", "load_npy", "load_raw",
           "make_loader", "resolve_loader"]
