"""The samples of tar shards a DALI webdataset reader would read, as a dataset stager can stage.

``fn.readers.webdataset(paths=..., ext=[...])`` reads WebDataset tar
shards: each output is one of a sample's parts (the member's name after the
first dot of its base name), as raw bytes, the shards in the order given and
the samples in their order inside each. ``EncodedParts`` gives the same over
``ShardDataset``: a shard is staged once for all its samples, and the
``shards`` shuffle reads shard by shard, as sharded readers do.

Parts are matched without regard to case (stager's tar index lower-cases
them), and every sample must hold every part: a sample without one is
refused when the reader is built, naming the shard and the sample.
"""

import os

import numpy as np

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
    """Chosen parts of the samples of tar shards, each as a one-dimensional array: stager's dataset protocol.

    Args:
        paths: The tar shards, in the order to read them.
        ext: Each output's part.
        dtypes: Each output's numpy dtype (default ``uint8``).
    """

    def __init__(self, paths, ext, dtypes=None):
        paths = [paths] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
        if not paths:
            raise ValueError("webdataset paths is empty")
        for path in paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"webdataset path {path} is not a file")
        self.parts = _parts(ext)
        self.dtypes = [np.dtype(np.uint8)] * len(self.parts) if dtypes is None else [np.dtype(d) for d in dtypes]
        if len(self.dtypes) != len(self.parts):
            raise ValueError(f"dtypes has {len(self.dtypes)} types for {len(self.parts)} outputs (ext)")
        root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
        self.shards = ShardDataset(root, format="tar", parts=self.parts)
        self.indices = _order(self.shards, paths)
        self.stager_window = self.shards.stager_window

    def __len__(self):
        return len(self.indices)

    def stager_path(self, index):
        return self.shards.stager_path(int(self.indices[index]))

    def stager_load(self, path, index):
        sample = self.shards.stager_load(path, int(self.indices[index]))
        return tuple(self._array(sample, part, dtype, index) for part, dtype in zip(self.parts, self.dtypes))

    def _array(self, sample, part, dtype, index):
        data = sample[part]
        if len(data) % dtype.itemsize:
            raise ValueError(f"{self.stager_path(index)}: sample {sample['__key__']!r} part {part!r} holds "
                             f"{len(data)} bytes, not a whole number of {dtype} values")
        return np.frombuffer(data, dtype=dtype)

    def __getitem__(self, index):
        return self.stager_load(self.stager_path(index), index)


def collate(samples):
    """A minibatch as DALI's external source takes it: one list of arrays per output."""
    return tuple(list(column) for column in zip(*samples))
