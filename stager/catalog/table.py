"""The list of samples: relative path, size in bytes, optional integer label.

Paths are held as one UTF-8 blob plus offsets and sizes/labels as numpy
arrays, so a catalog of millions of samples is a few arrays (cheap to keep,
pickle and broadcast) rather than millions of Python objects. Those arrays
may also be views of a mapped catalog file (``mapped``), which only
reads the entries that are used.
"""

import os

import numpy as np

from ..errors import CatalogError
from ..sources import PosixSource, open_source


def container_format(dataset, paths):
    """The dataset's format: ``dataset.format``, or with ``auto`` what its keys and extensions say.

    Args:
        dataset: A ``DatasetConfig``.
        paths: The relative paths its source lists.
    """
    chosen = getattr(dataset, "format", "files")
    if chosen != "auto":
        return chosen
    if getattr(dataset, "keys", None):
        return "hdf5"
    if paths and all(p.endswith(".tar") for p in paths):
        return "tar"
    return "files"


class Catalog:
    """An immutable list of samples under one root.

    Args:
        root: Dataset root directory.
        blob: All relative paths, UTF-8, concatenated (bytes, or a uint8
            array, kept as it is: a mapped file stays mapped).
        offsets: Start of each path in ``blob``, plus the end.
        sizes: Size of each file in bytes.
        labels: Integer label per sample, or None.
    """

    def __init__(self, root, blob, offsets, sizes, labels=None, mtimes=None):
        self.root = root if "://" in root else os.path.abspath(root)  # a URL (s3://) is kept as it is
        self._blob = blob if isinstance(blob, np.ndarray) else bytes(blob)
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.mtimes = None if mtimes is None else np.asarray(mtimes, dtype=np.int64)
        n = len(self.sizes)
        if (len(self._offsets) != n + 1 or (self.labels is not None and len(self.labels) != n)
                or (self.mtimes is not None and len(self.mtimes) != n)):
            raise CatalogError("catalog arrays differ in length")
        if not n:
            raise CatalogError(f"dataset at {self.root} has no samples")

    @classmethod
    def from_paths(cls, root, paths, sizes, labels=None, mtimes=None):
        """Builds a catalog from lists of relative paths, sizes, labels and modification times."""
        encoded = [p.encode("utf-8") for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(root, b"".join(encoded), offsets, sizes, labels, mtimes)

    def mtime(self, index):
        """Modification time (ns) of sample ``index`` when the catalog was made, or None."""
        return None if self.mtimes is None else int(self.mtimes[index])

    def __len__(self):
        return len(self.sizes)

    def path(self, index):
        """Returns the relative path of sample ``index``."""
        return bytes(self._blob[self._offsets[index]:self._offsets[index + 1]]).decode("utf-8")

    def rooted(self, root):
        """The same samples under another root (a local copy of the dataset)."""
        return Catalog(root, self._blob, self._offsets, self.sizes, self.labels, self.mtimes)

    @property
    def offsets(self):
        """Where each path starts in ``paths_blob()``, plus the end."""
        return self._offsets

    def paths_blob(self):
        """All relative paths, UTF-8, concatenated (see ``path`` for the cut)."""
        return self._blob

    def paths(self):
        """Returns all relative paths as a list."""
        return [self.path(i) for i in range(len(self))]

    def label(self, index):
        """Returns the label of sample ``index``, or None for unlabelled data."""
        return None if self.labels is None else int(self.labels[index])

    @property
    def total_bytes(self):
        return int(self.sizes.sum())

    def __eq__(self, other):
        def same(a, b):
            return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))

        def blob(c):
            return np.frombuffer(c._blob, dtype=np.uint8)

        return (isinstance(other, Catalog) and self.root == other.root and same(blob(self), blob(other))
                and same(self._offsets, other._offsets) and same(self.sizes, other.sizes)
                and same(self.labels, other.labels) and same(self.mtimes, other.mtimes))

    @classmethod
    def from_listing(cls, root, listing):
        """Builds a catalog from a source's ``Listing``."""
        return cls.from_paths(root, listing.paths, listing.sizes, listing.labels, listing.mtimes)

    @classmethod
    def from_manifest(cls, root, manifest):
        """Reads a manifest of a file tree (see ``sources.PosixSource.read_manifest``)."""
        return cls.from_listing(root, PosixSource(root).read_manifest(manifest))

    @classmethod
    def from_directory(cls, root, extensions=()):
        """Scans a file tree once (see ``sources.PosixSource.scan``)."""
        return cls.from_listing(root, PosixSource(root).scan(extensions))

    @classmethod
    def load(cls, dataset):
        """Builds the catalog of a ``DatasetConfig`` whose samples are files, from its source.

        Raises:
            CatalogError: For samples packed in containers (``dataset.format``):
                ``catalog.load_catalog`` builds their ``ShardCatalog``.
        """
        if not dataset.source:
            raise CatalogError("dataset.source is not set")
        source = open_source(dataset.source, dataset)
        listing = source.read_manifest(dataset.manifest) if dataset.manifest else source.scan(dataset.extensions)
        fmt = container_format(dataset, listing.paths)
        if fmt != "files":
            raise CatalogError(f"the samples at {source.root} are packed in {fmt} containers: "
                               "stager.catalog.load_catalog(dataset) lists them")
        return cls.from_listing(source.root, listing)

    # A file is a sample: the engine stages what ``files`` lists, ``file_index`` maps samples to it.
    format = "files"

    @property
    def files(self):
        """What is staged: here the samples' own files (``ShardCatalog`` has its containers)."""
        return self

    def file_index(self, indices):
        """The files holding samples ``indices``: the same indices."""
        return np.asarray(indices, dtype=np.int64)

    containers = None  # per sample, its container's index: none here

    def name(self, index):
        """The sample's name in records and messages: its relative path."""
        return self.path(index)

    def sample_decoder(self, loader, options):
        """What readers decode with: the loader as it is (``formats.make_decoder`` makes it a decoder)."""
        return loader


