"""Samples packed in tar or MDS shards or HDF5 containers, as a PyTorch map-style dataset.

``ShardDataset`` lists the containers of a source and indexes them once
(``stager.catalog.load_catalog``), then reads any sample in place: a plain
``DataLoader`` takes it as it is. ``StagedLoader`` takes it through the
dataset protocol: its samples name their container (``stager_path``), so
stager stages each container once for all the samples packed in it, and
``stager_load`` takes sample ``index`` out of the staged copy. Unless a
sampler says otherwise, ``StagedLoader`` reads it with the ``shards``
shuffle (containers, then samples within a window of ``window``
containers), as sharded loaders do, where ``DataLoader`` would draw a full
permutation and open a container for nearly every sample.

Over an object store (``s3://bucket/prefix``) a sample is read only from its
staged shard, so such a dataset goes to ``StagedLoader`` (alone or in a
``Subset``): the shards are fetched once each, never one sample at a time.
"""

import os

from torch.utils.data import Dataset

from stager.catalog import load_catalog
from stager.config import config_from_dict
from stager.formats.shards import ShardReader, decode_parts, kept_parts
from stager.sources import open_source


class ShardDataset(Dataset):
    """The samples of tar shards or HDF5 containers under ``source``.

    Args:
        source: The directory holding the containers, or an object store
            prefix (``s3://bucket/prefix``), read through ``StagedLoader``.
        format: ``tar``, ``hdf5``, ``mds`` or ``auto`` (``dataset.format``).
        keys: HDF5 datasets whose first axis indexes samples (``dataset.keys``).
        parts: Tar parts each sample keeps (``dataset.parts``); default: all.
        manifest: A manifest listing the containers (relative to
            ``source``), as ``stager pack`` writes; None: scan for them.
        loader: How parts are decoded (``dataset.loader``): ``raw`` (tar
            parts as bytes), ``npy``, ``image``, or a callable taking the
            sample's dict.
        transform: Called on each sample (a dict: ``__key__`` and the tar
            parts, or the HDF5 rows) after decoding.
        window: Containers the ``shards`` shuffle mixes (``plan.shard_window``).
        endpoint_url: For an object store that is not AWS, its URL
            (``dataset.endpoint_url``); credentials come from the AWS chain.
    """

    def __init__(self, source, format="auto", keys=(), parts=(), manifest=None, loader="raw", transform=None,
                 window=8, endpoint_url=None):
        dataset = config_from_dict({"dataset": {"source": os.fspath(source), "format": format, "keys": list(keys),
                                                "parts": list(parts), "manifest": manifest,
                                                "loader": loader if isinstance(loader, str) else "raw",
                                                "endpoint_url": endpoint_url}}).dataset
        catalog = load_catalog(dataset)
        if not hasattr(catalog, "layout"):
            raise ValueError(f"{source} holds one sample per file (dataset.format {format!r}): use ImageFolder or "
                             "your own dataset for it")
        self.catalog = catalog
        self.stager_dataset = dataset  # where StagedLoader stages from: the source and its store's settings
        self.stager_store = open_source(dataset.source, dataset).local_root is None  # no files to open in place
        self.loader = loader
        self.transform = transform
        self.stager_window = window
        self._reader = None

    def __len__(self):
        return len(self.catalog)

    def __getitem__(self, index):
        if self.stager_store:
            raise TypeError(f"ShardDataset over {self.stager_dataset.source}: its samples are read from staged "
                            "copies of their shards; give it to StagedLoader, which fetches each shard once "
                            "(read in place, every sample would fetch its whole shard)")
        return self.stager_load(self.stager_path(index), index)

    def stager_path(self, index):
        """The container sample ``index`` is packed in."""
        return os.path.join(self.catalog.root, self.catalog.path(index))

    @property
    def stager_keeps_decoded(self):
        """Whether ``stager_load`` can take a decoded tier: with the ``image`` loader, whose decoding is pure."""
        return self.loader == "image"

    def stager_load(self, path, index, tier=None):
        """Sample ``index`` from the container at ``path`` (the source's, or its staged copy).

        ``tier``: a ``decoded.DecodedTier`` and the sample's index in it, which keeps the decoded parts
        (``stager_keeps_decoded``), or None.
        """
        if self._reader is None:
            self._reader = ShardReader(self.catalog.layout)
        if tier is not None and self.stager_keeps_decoded:
            sample = kept_parts(tier[0], tier[1], path, lambda p: self._reader.read(p, index), self.loader,
                                {"layout": "hwc"})
        else:
            sample = decode_parts(self._reader.read(path, index), self.loader, {"layout": "hwc"})
        return self.transform(sample) if self.transform is not None else sample

    def __getstate__(self):
        return {**self.__dict__, "_reader": None}  # open files stay with the process that opened them
