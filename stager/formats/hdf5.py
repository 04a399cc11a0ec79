"""HDF5 containers: datasets whose first axis indexes samples, many samples per file.

The user names the datasets (``dataset.keys``: ``x``, ``y``, ...); sample
``i`` of a file is row ``i`` of each. Indexing a file reads its metadata
only: the datasets' shapes, which must agree on the first axis.
"""

from ..errors import CatalogError


def index_hdf5(fileobj, name, keys):
    """The number of samples (rows) in one HDF5 container.

    Args:
        fileobj: The file, opened for binary reading (h5py reads it through
            this object, so any source's bytes will do).
        name: Its relative path, for messages.
        keys: The datasets whose first axis indexes samples.

    Raises:
        CatalogError: A file that is not HDF5, lacks a dataset, or whose
            datasets disagree on their first axis; naming the file and keys.
    """
    import h5py  # deferred: only users of HDF5 pay for the import

    try:
        with h5py.File(fileobj, "r") as fh:
            rows = {}
            for key in keys:
                if key not in fh or not isinstance(fh[key], h5py.Dataset):
                    raise CatalogError(f"HDF5 file {name} has no dataset {key!r} (dataset.keys); it has "
                                       f"{sorted(fh.keys())}")
                shape = fh[key].shape
                if not shape:
                    raise CatalogError(f"HDF5 file {name}: dataset {key!r} is a scalar; dataset.keys name datasets "
                                       "whose first axis indexes samples")
                rows[key] = shape[0]
    except OSError as exc:
        raise CatalogError(f"HDF5 file {name} cannot be read: {exc}") from None
    if len(set(rows.values())) > 1:
        raise CatalogError(f"HDF5 file {name}: the datasets' first axes disagree ("
                           + ", ".join(f"{k} has {n}" for k, n in rows.items())
                           + "): each row must be one sample of every dataset in dataset.keys")
    return next(iter(rows.values()))
