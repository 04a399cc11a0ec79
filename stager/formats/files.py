"""Stage 3 decoders: turn one staged file into one sample.

Chosen by name from a small registry (``image`` lives in ``images.py``);
``module:function`` names a user callable that takes the file's path and
returns the sample.

An empty (zero-byte) file is a sample like any other until it is decoded:
listed, staged and counted. ``raw`` returns it as ``b""``; every decoding
loader (``npy``, ``hdf5``, ``image``) refuses it with the same ``EmptySample``
error naming the file, whatever its own library would have said. A user
callable receives it as it is.
"""

import ast
import functools
import importlib
import os

import numpy as np
from numpy.lib import format as npy_format

from ..errors import ConfigError


def load_raw(path, options):
    """Returns the file's bytes."""
    with open(path, "rb") as fh:
        return fh.read()


_NPY_MAGIC = b"\x93NUMPY"
# numpy refuses (without allow_pickle) a header longer than this: parsing an
# arbitrarily long header with literal_eval could take unbounded time and memory.
_NPY_MAX_HEADER = getattr(npy_format, "_MAX_HEADER_SIZE", 10000)


class EmptySample(ValueError):
    """A decoding loader was given a zero-byte file."""


@functools.lru_cache(maxsize=256)
def _npy_layout(header, encoding):
    # A dataset's files share a handful of headers; parsing one costs more
    # than reading a 100 KB sample, so each is parsed once.
    fields = ast.literal_eval(header.decode(encoding))
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        return None
    dtype = npy_format.descr_to_dtype(fields["descr"])
    shape = tuple(fields["shape"])
    if dtype.hasobject or dtype.itemsize == 0 or not all(isinstance(n, int) and n >= 0 for n in shape):
        return None
    return dtype, shape, bool(fields["fortran_order"])


def load_npy(path, options):
    """Returns the array stored in a ``.npy`` file (no pickled objects).

    Equal to ``numpy.load(path, allow_pickle=False)``, about six times
    faster on small files: the header is parsed once per distinct header and
    the data is read straight into the array. Anything unusual (another
    format version, object arrays, a damaged header) goes to ``numpy.load``,
    which reads it or raises its own error.
    """
    with open(path, "rb", buffering=0) as fh:
        lead = fh.read(10)
        if len(lead) < 10 or lead[:6] != _NPY_MAGIC or lead[6] not in (1, 2, 3):
            return np.load(path, allow_pickle=False)
        if lead[6] == 1:
            size = int.from_bytes(lead[8:10], "little")
        else:
            lead += fh.read(2)
            size = int.from_bytes(lead[8:12], "little")
        if size > _NPY_MAX_HEADER:
            return np.load(path, allow_pickle=False)  # raises numpy's own error, as numpy.load would
        layout = _npy_layout(fh.read(size), "utf8" if lead[6] == 3 else "latin1")
        if layout is None:
            return np.load(path, allow_pickle=False)
        dtype, shape, fortran = layout
        count = 1
        for n in shape:
            count *= n
        data = np.empty(count * dtype.itemsize, dtype=np.uint8)
        view, got = memoryview(data), 0
        while got < len(data):
            n = fh.readinto(view[got:])
            if not n:
                raise ValueError(f"{path}: truncated .npy file: {got} of {len(data)} data bytes")
            got += n
    return data.view(dtype).reshape(shape, order="F" if fortran else "C")


def load_hdf5(path, options):
    """Returns the dataset ``options['hdf5_key']`` of a per-sample HDF5 file."""
    import h5py  # deferred: only users of HDF5 pay for the import

    with h5py.File(path, "r") as fh:
        if options["hdf5_key"] not in fh:
            raise KeyError(f"HDF5 file has no dataset {options['hdf5_key']!r}; it has {sorted(fh.keys())}")
        return fh[options["hdf5_key"]][()]


def load_image(path, options):
    """Returns a JPEG or PNG image as uint8 HWC or float32 CHW (``options['layout']``, ``images.py``)."""
    from .images import load_image as load  # deferred: PIL and simplejpeg only for image datasets

    return load(path, options)


LOADERS = {"raw": load_raw, "npy": load_npy, "hdf5": load_hdf5, "image": load_image}


def check_loader_name(name):
    """Rejects a loader name that is neither built in nor ``module:function``."""
    if name in LOADERS:
        return
    module, sep, func = name.partition(":")
    if not sep or not module or not func:
        raise ConfigError(f"dataset.loader: {name!r} is neither one of {sorted(LOADERS)} "
                          "nor 'module:function'")


def resolve_loader(spec):
    """Returns a callable ``(path) -> sample`` for a loader spec.

    Args:
        spec: A registry name, a ``module:function`` string or a callable
            taking one path.
    """
    if callable(spec):
        return spec
    if spec in LOADERS:
        return spec
    module, _, func = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"dataset.loader: cannot import {spec!r}: {exc}") from None


def make_loader(spec, options):
    """Returns a callable ``(path) -> sample`` for a loader spec and its options."""
    fn = resolve_loader(spec)
    if fn == "raw":
        return lambda path: load_raw(path, options)
    if isinstance(fn, str):
        return functools.partial(_decode, fn, LOADERS[fn], options)
    return fn


def image_rgb(options):
    """``path -> uint8 HWC array``: the ``image`` loader before its layout (``decoder.ImageDecoder``)."""
    from .images import read_rgb  # deferred: PIL and simplejpeg only for image datasets

    return functools.partial(_decode, "image", read_rgb, options)


def _decode(name, builtin, options, path):
    try:
        return builtin(path, options)
    except Exception:
        # Each library says something else about an empty file (EOFError,
        # "file signature not found", "cannot identify image file"): say one thing.
        if os.path.getsize(path) == 0:
            raise EmptySample(f"{path} is empty (0 bytes): the {name} loader has nothing to decode; remove it "
                              "from the dataset, or read it with loader raw") from None
        raise
