"""Stage 3 decoders: turn one staged file into one sample.

Chosen by name from a small registry; ``module:function`` names a user
callable that takes the file's path and returns the sample.
"""

import importlib

import numpy as np

from .errors import ConfigError


def load_raw(path, options):
    """Returns the file's bytes."""
    with open(path, "rb") as fh:
        return fh.read()


def load_npy(path, options):
    """Returns the array stored in a ``.npy`` file (no pickled objects)."""
    return np.load(path, allow_pickle=False)


def load_hdf5(path, options):
    """Returns the dataset ``options['hdf5_key']`` of a per-sample HDF5 file."""
    import h5py  # deferred: only users of HDF5 pay for the import

    with h5py.File(path, "r") as fh:
        if options["hdf5_key"] not in fh:
            raise KeyError(f"HDF5 file has no dataset {options['hdf5_key']!r}; it has {sorted(fh.keys())}")
        return fh[options["hdf5_key"]][()]


LOADERS = {"raw": load_raw, "npy": load_npy, "hdf5": load_hdf5}


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
    if isinstance(fn, str):
        builtin = LOADERS[fn]
        return lambda path: builtin(path, options)
    return fn
