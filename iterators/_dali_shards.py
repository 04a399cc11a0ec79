"""The samples of shards (tar, MDS) as DALI readers give them, as a dataset stager can stage.

``fn.readers.webdataset(paths=..., ext=[...])`` reads WebDataset tar
shards: each output is one of a sample's parts (the member's name after the
first dot of its base name), as raw bytes, the shards in the order given and
the samples in their order inside each. ``EncodedParts.tar`` gives the same
over ``ShardDataset``: a shard is staged once for all its samples, and the
``shards`` shuffle reads shard by shard, as sharded readers do.
``EncodedParts.shards`` gives the chosen parts (tar) or columns (MosaicML
Streaming's MDS, as the bytes stored, not decoded) of every sample of a
``ShardDataset`` source, a directory or an object store.

Tar parts are matched without regard to case (stager's tar index
lower-cases them), and every sample must hold every part: a sample without
one is refused when the reader is built, naming the shard and the sample.
"""

import os

import numpy as np

from stager.formats.shards import HDF5, TAR, ShardReader

from ._torch_shards import ShardDataset


def _parts(ext):
    ext = [ext] if isinstance(ext, str) else list(ext)
    if not ext or not all(isinstance(e, str) and e for e in ext):
        raise TypeError(f"ext must be a part's extension or a list of them, not {ext!r}")
    for e in ext:
        if ";" in e:
            raise ValueError(f"ext {e!r}: alternative extensions of one output are not served; every sample must "
                             "hold each output's part under one extension")
    return [e.lower() for e in ext]


def _order(shards, paths):
    """The samples' indices: the shards in the order of ``paths``, each shard's samples in its order."""
    catalog = shards.catalog
    mine = {}
    for index in range(len(catalog)):
        mine.setdefault(os.path.join(catalog.root, catalog.path(index)), []).append(index)
    out = []
    for path in paths:
        found = mine.get(os.path.abspath(path))
        if found is None:
            raise FileNotFoundError(f"webdataset path {path}: not a tar shard that stager found under "
                                    f"{catalog.root} (or it holds no sample)")
        out += found
    return np.asarray(out, dtype=np.int64)


class EncodedParts:
    """Chosen parts of the samples of shards, each as a one-dimensional array: stager's dataset protocol.

    Made by ``tar`` or ``shards``.

    Args:
        shards: The ``ShardDataset``.
        indices: Its samples, in the order read unshuffled.
        parts: Each output's part or column.
        dtypes: Each output's numpy dtype (default ``uint8``).
    """

    def __init__(self, shards, indices, parts, dtypes=None):
        self.shards, self.indices, self.parts = shards, indices, parts
        self.dtypes = [np.dtype(np.uint8)] * len(parts) if dtypes is None else [np.dtype(d) for d in dtypes]
        if len(self.dtypes) != len(parts):
            raise ValueError(f"dtypes has {len(self.dtypes)} types for {len(parts)} outputs")
        missing = [p for p in parts if p not in shards.catalog.layout.parts]
        if missing:
            raise ValueError(f"{shards.catalog.root}: its samples have no {', '.join(missing)} part (they have "
                             f"{', '.join(shards.catalog.layout.parts)})")
        self.stager_window = shards.stager_window
        if len(indices) == len(shards) and np.array_equal(indices, np.arange(len(shards))):
            # Every sample in the catalog's order: an object store's shards are staged as ShardDataset's are.
            self.stager_store, self.stager_dataset = shards.stager_store, shards.stager_dataset
            self.catalog = shards.catalog
        self._reader = None

    @classmethod
    def tar(cls, paths, ext, dtypes=None):
        """The tar shards ``paths``, in that order, each output one part of ``ext``."""
        paths = [paths] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
        if not paths:
            raise ValueError("webdataset paths is empty")
        for path in paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"webdataset path {path} is not a file")
        parts = _parts(ext)
        root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
        shards = ShardDataset(root, format="tar", parts=parts)
        return cls(shards, _order(shards, paths), parts, dtypes)

    @classmethod
    def everything(cls, source, parts, format="auto", dtypes=None, endpoint_url=None):
        """Every sample of the shards under ``source`` (``ShardDataset``'s), each output one part or column."""
        parts = [parts] if isinstance(parts, str) else list(parts)
        if not parts:
            raise ValueError("parts is empty: name each output's part (tar) or column (mds)")
        shards = ShardDataset(source, format=format, endpoint_url=endpoint_url,
                              parts=[p.lower() for p in parts] if format == TAR else ())
        if shards.catalog.layout.format == HDF5:
            raise ValueError(f"{source}: HDF5 containers hold arrays, not encoded samples: read them with "
                             "StagedLoader(ShardDataset(...)) rather than a DALI reader")
        if shards.catalog.layout.format == TAR:
            parts = [p.lower() for p in parts]
        return cls(shards, np.arange(len(shards), dtype=np.int64), parts, dtypes)

    def __len__(self):
        return len(self.indices)

    def stager_path(self, index):
        return self.shards.stager_path(int(self.indices[index]))

    def stager_load(self, path, index):
        if self._reader is None:
            self._reader = ShardReader(self.shards.catalog.layout, encoded=True)
        sample = self._reader.read(path, int(self.indices[index]))
        return tuple(self._array(sample, part, dtype, path) for part, dtype in zip(self.parts, self.dtypes))

    def _array(self, sample, part, dtype, path):
        data = sample[part]
        if len(data) % dtype.itemsize:
            raise ValueError(f"{path}: sample {sample.get('__key__', '')!r} part {part!r} holds {len(data)} bytes, "
                             f"not a whole number of {dtype} values")
        return np.frombuffer(data, dtype=dtype)

    def __getitem__(self, index):
        return self.stager_load(self.stager_path(index), index)

    def __getstate__(self):
        return {**self.__dict__, "_reader": None}  # open files stay with the process that opened them


def collate(samples):
    """A minibatch as DALI's external source takes it: one list of arrays per output."""
    return tuple(list(column) for column in zip(*samples))
