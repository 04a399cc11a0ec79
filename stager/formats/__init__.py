"""How a sample is found in what was staged and decoded from it, one module per format family.

``files`` is the family of one sample per file: its decoders (``raw``,
``npy``, ``hdf5``, ``image``, or a ``module:function`` of the user's) are
chosen by name from ``LOADERS`` (``dataset.loader``); ``images`` decodes
JPEG and PNG. ``tar`` and ``hdf5`` index containers of many samples, and
``shards`` takes a sample out of a staged container (``ShardDecoder``). ``decoder`` is what readers call for every sample: a
``SampleDecoder`` (a front end's, which runs the user's own dataset code
with the sample's index and epoch), or a path loader made one.

May import: ``errors``.
"""

from .decoder import PathDecoder, SampleDecoder, decoded_kind, is_decoder, make_decoder
from .files import (LOADERS, EmptySample, check_loader_name, load_hdf5, load_image, load_npy, load_raw, make_loader,
                    resolve_loader)

__all__ = ["EmptySample", "LOADERS", "PathDecoder", "SampleDecoder", "check_loader_name", "decoded_kind", "is_decoder",
           "load_hdf5", "load_image", "load_npy", "load_raw", "make_decoder", "make_loader", "resolve_loader"]
