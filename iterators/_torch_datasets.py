"""PyTorch datasets that read one file per sample, as stager's catalog and decoder.

stager stages files, so ``StagedLoader`` takes a dataset that can name the
file behind each index and build the sample from a (staged) copy of it:

- torchvision's ``DatasetFolder`` and its subclasses (``ImageFolder``,
  ``ImageNet``...): the file is ``samples[i][0]``; the sample is what the
  dataset's own ``__getitem__(i)`` returns on a shallow copy whose
  ``samples[i]`` names the staged file (so its ``loader``, ``transform``,
  ``target_transform`` and any override of ``__getitem__`` apply);
- any map-style dataset with the two methods of the protocol below (samples
  that name the same file are packed in it: the file is staged once for
  all of them, as for ``ShardDataset``'s tar shards and HDF5 containers);
- ``Subset`` and ``ConcatDataset`` of those, nested as deep as you like.

The protocol, for datasets of your own::

    class MyDataset(torch.utils.data.Dataset):
        def stager_path(self, index):        # the file sample ``index`` is read from
            return self.files[index]
        def stager_load(self, path, index):  # the sample, built from that file (or its staged copy)
            return decode(path), self.labels[index]
        def __getitem__(self, index):        # what DataLoader calls: the same thing on the original
            return self.stager_load(self.stager_path(index), index)

A protocol dataset whose decoding is pure may also take the node's decoded
tier (``staging.decoded``): it says so with a true ``stager_keeps_decoded``
attribute, and its ``stager_load`` then takes ``tier=(tier, catalog index)``
and calls ``tier.load(catalog index, path, load)`` where it would call
``load(path)`` (``ShardDataset`` with the ``image`` loader does).

Datasets whose samples are in memory (``TensorDataset``, lists) or that
stream (``IterableDataset``) have nothing to stage and are refused with a
``TypeError`` that points to ``DataLoader``.
"""

import os
import stat

import numpy as np
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Subset, default_collate, default_convert
from torch.utils.data._utils import worker as torch_worker  # where get_worker_info() looks

from stager import Catalog, ShardCatalog
from stager.formats.shards import ShardLayout
from stager.sources import check_relpath, parallel, reading

from ._torchvision_import import import_torchvision

# torchvision is the ``vision`` extra: without it, no DatasetFolder can be given.
torchvision = import_torchvision()
DatasetFolder = torchvision.datasets.DatasetFolder if torchvision is not None else None

FOLDER, PROTOCOL = "folder", "protocol"
STAT_THREADS = 16  # stats in flight on the shared file system while the catalog is made


def _refusal(dataset, why):
    return TypeError(
        f"StagedLoader stages files, so its dataset must name the file behind each sample: torchvision's "
        f"DatasetFolder or ImageFolder, a dataset with stager_path(index) and stager_load(path, index) (see "
        f"iterators.pytorch), or a Subset or ConcatDataset of those. {type(dataset).__name__} {why}: use "
        f"torch.utils.data.DataLoader for it instead.")


def _kind(dataset):
    """``FOLDER`` or ``PROTOCOL`` for a dataset stager can stage, else None."""
    if callable(getattr(dataset, "stager_path", None)) and callable(getattr(dataset, "stager_load", None)):
        return PROTOCOL
    if DatasetFolder is not None and isinstance(dataset, DatasetFolder):
        return FOLDER
    return None


def _flatten(dataset, leaves):
    """Each sample of ``dataset`` as ``(leaf number, index in that leaf)`` arrays; leaves appended to ``leaves``."""
    if isinstance(dataset, IterableDataset):
        raise _refusal(dataset, "is an IterableDataset, which streams its samples in an order of its own")
    if isinstance(dataset, Subset):
        inner, where = _flatten(dataset.dataset, leaves)
        chosen = np.asarray(list(dataset.indices), dtype=np.int64)
        if len(chosen) and (chosen.min() < -len(inner) or chosen.max() >= len(inner)):
            raise IndexError(f"Subset index {int(chosen.max())} out of range for a dataset of {len(inner)} samples")
        return inner[chosen], where[chosen]
    if isinstance(dataset, ConcatDataset):
        parts = [_flatten(child, leaves) for child in dataset.datasets]
        return (np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64),
                np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64))
    kind = _kind(dataset)
    if kind is None:
        if not isinstance(dataset, Dataset):
            raise _refusal(dataset, "is not a torch Dataset (a list or array held in memory)")
        raise _refusal(dataset, "holds its samples in memory or reads them in a way stager cannot see")
    leaves.append((kind, dataset))
    n = len(dataset)
    return np.full(n, len(leaves) - 1, dtype=np.int64), np.arange(n, dtype=np.int64)


def _in_store(leaves):
    """The ``DatasetConfig`` of the object store the datasets read (``ShardDataset("s3://...")``), else None.

    Raises:
        TypeError: An object store's dataset beside other datasets: staging
            reads one source.
    """
    stores = [dataset.stager_dataset for _, dataset in leaves if getattr(dataset, "stager_store", False)]
    if not stores:
        return None
    if len(leaves) > 1:
        raise TypeError(f"StagedLoader stages from one source: a ShardDataset over {stores[0].source} can be given "
                        f"alone or in a Subset, not in a ConcatDataset ({len(leaves)} datasets)")
    return stores[0]


def _path(kind, dataset, index):
    if kind == FOLDER:
        return dataset.samples[index][0]
    path = dataset.stager_path(index)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{type(dataset).__name__}.stager_path({index}) returned {path!r}, not a path")
    return os.fspath(path)


class TorchFiles:
    """What stager needs from a PyTorch dataset: its files, and how to decode each.

    Args:
        dataset: The dataset given to ``StagedLoader``.

    Raises:
        TypeError: If it (or a dataset inside it) cannot name its files.
    """

    def __init__(self, dataset):
        self.name = type(dataset).__name__
        self.leaves = []
        self.leaf_of, self.index_in = _flatten(dataset, self.leaves)
        if not len(self.leaf_of):
            raise ValueError(f"{self.name} has no samples")
        self.store = _in_store(self.leaves)
        if self.store is not None:
            # An object store's shards have no local paths to stat: the dataset's own catalog names them.
            self._store_files = self.leaves[0][1].catalog.files
            self._file_of = self.leaves[0][1].catalog.layout.file_of[self.index_in]
            self.root = self._store_files.root
            self.rels = [self._store_files.path(k) for k in self._file_of.tolist()]
            return
        full = [os.path.abspath(_path(*self.leaves[leaf], index))
                for leaf, index in zip(self.leaf_of.tolist(), self.index_in.tolist())]
        self.root = os.path.commonpath([os.path.dirname(f) for f in full])
        self.rels = [check_relpath(os.path.relpath(f, self.root), f"{self.name} sample {i}")
                     for i, f in enumerate(full)]

    def __len__(self):
        return len(self.rels)

    def catalog(self):
        """The samples as a ``stager.Catalog``: one entry per sample, one ``stat`` per distinct file.

        Raises:
            FileNotFoundError: Naming the first sample whose file cannot be read.
        """
        if self.store is not None:
            layout = ShardLayout("custom", self._file_of, np.arange(len(self._file_of)), ())
            return ShardCatalog(self._store_files, layout)
        distinct = list(dict.fromkeys(self.rels))

        def look(rel):
            path = os.path.join(self.root, rel)
            try:
                with reading("stat", path):
                    return rel, os.stat(path)
            except OSError as exc:
                return rel, exc

        found = dict(parallel(look, distinct, STAT_THREADS, "stager-stat"))
        for i, rel in enumerate(self.rels):
            st = found[rel]
            path = os.path.join(self.root, rel)
            if isinstance(st, OSError):
                raise FileNotFoundError(f"{self.name} sample {i}: cannot read {path}: {st.strerror}")
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(f"{self.name} sample {i}: {path} is not a regular file")
        if len(distinct) < len(self.rels):
            return self._packed(distinct, found)
        sizes = [found[rel].st_size for rel in self.rels]
        mtimes = [found[rel].st_mtime_ns for rel in self.rels]
        return Catalog.from_paths(self.root, self.rels, sizes, None, mtimes)

    def _packed(self, distinct, found):
        """Samples that share files (packed in containers): the files' catalog, and which file each sample is in."""
        files = Catalog.from_paths(self.root, distinct, [found[rel].st_size for rel in distinct], None,
                                   [found[rel].st_mtime_ns for rel in distinct])
        number = {rel: k for k, rel in enumerate(distinct)}
        file_of = np.array([number[rel] for rel in self.rels], dtype=np.int64)
        return ShardCatalog(files, ShardLayout("custom", file_of, np.arange(len(file_of), dtype=np.int64), ()))

    def source_settings(self):
        """The ``dataset`` keys staging reads the source with: its object store's, or none for a file tree."""
        if self.store is None:
            return {}
        return {"endpoint_url": self.store.endpoint_url, "retries": self.store.retries,
                "request_timeout_s": self.store.request_timeout_s}

    def shard_window(self):
        """The ``shards`` shuffle's window when every dataset inside packs its samples (``ShardDataset``), else None."""
        windows = [getattr(dataset, "stager_window", None) for _, dataset in self.leaves]
        return max(windows) if windows and None not in windows else None


class Collate:
    """A loader's ``collate_fn`` as its readers call it: on the minibatch's samples, or on its one sample.

    DataLoader's workers collate; so do stager's readers, and the training
    process takes each minibatch as it arrives (a view of the reader's ring
    slot). ``single``: the loader yields samples one by one
    (``batch_size=None``), so the function gets the sample itself.
    """

    def __init__(self, fn, single=False):
        self.fn, self.single = fn, single

    def __call__(self, samples):
        info = torch_worker._worker_info
        if self.fn in (default_collate, default_convert):
            # Inside a worker, torch's own collation stacks into new shared memory, which serves
            # DataLoader's hand-over by file descriptor: 6x the cost of a plain stack (21 against 3.2
            # ms for 32 images of 224x224). The ring copies the result anyway, so it stacks as outside.
            torch_worker._worker_info = None
        try:
            return self.fn(samples[0]) if self.single else self.fn(samples)
        finally:
            torch_worker._worker_info = info

    def __repr__(self):
        return f"collate_fn {getattr(self.fn, '__qualname__', self.fn)!s}"
