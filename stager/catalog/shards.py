"""Samples packed in containers (``dataset.format: tar | hdf5``): the catalog of samples over the catalog of files.

The containers are listed like any file tree (a scan, or a manifest that
``stager pack`` writes) into a ``Catalog`` of files: that is what prefetchers
stage, the node cache keeps and peers serve. Each container is then indexed
once, on rank 0, in threads (a tar shard's headers, or the index ``stager
pack`` wrote beside it; an HDF5 file's dataset shapes; never the samples'
bytes), which gives the ``ShardLayout``: per
sample, its container and its place there. Samples are numbered container by
container in listing order, so a container's samples are one run of indices.
"""

import contextlib
import errno
import os

import numpy as np

from .table import Catalog, container_format
from ..errors import CatalogError
from ..formats.hdf5 import index_hdf5
from ..formats.shards import HDF5, MDS, TAR, ShardDecoder, ShardLayout
from ..formats.tar import check_parts, index_name, index_tar, load_index
from ..sources import open_source, parallel
from ..sources.listing import Listing

FORMATS = ("auto", "files", TAR, HDF5, MDS)
EXTENSIONS = {TAR: [".tar"], HDF5: [".h5", ".hdf5"], MDS: [".mds"]}
_INDEX_THREADS = 16  # containers indexed at once: each costs a few round trips to the source


class ShardCatalog:
    """The samples of a sharded dataset, with the same reading interface as ``Catalog``.

    ``path(i)`` is the relative path of sample ``i``'s container (what a
    reader opens); ``files`` is the catalog of containers and
    ``file_index`` maps samples to it.

    Args:
        files: The containers' ``Catalog``.
        layout: The ``ShardLayout``.
    """

    labels = None
    mtimes = None

    def __init__(self, files, layout):
        self.files = files
        self.layout = layout
        self.root = files.root
        self._sizes = None

    @property
    def format(self):
        return self.layout.format

    def __len__(self):
        return len(self.layout)

    def file_index(self, indices):
        """The containers holding samples ``indices`` (int64 array, one per sample)."""
        return self.layout.file_of[np.asarray(indices, dtype=np.int64)]

    def path(self, index):
        return self.files.path(int(self.layout.file_of[index]))

    def paths(self):
        return [self.path(i) for i in range(len(self))]

    def key(self, index):
        """The sample's name inside its container (tar key, or HDF5 row)."""
        return self.layout.key(index)

    def label(self, index):
        return None

    @property
    def containers(self):
        """Per sample, its container's index (what the ``shards`` shuffle groups by)."""
        return self.layout.file_of

    def name(self, index):
        """The sample's name in records and messages: ``container#key``."""
        return f"{self.path(index)}#{self.layout.key(index)}"

    def mtime(self, index):
        return self.files.mtime(int(self.layout.file_of[index]))

    @property
    def sizes(self):
        """Per sample, its bytes: its parts' (tar), or an equal share of its container's (HDF5)."""
        if self._sizes is None:
            own = self.layout.sample_bytes()
            if own is None:
                counts = np.bincount(self.layout.file_of, minlength=len(self.files))
                own = self.files.sizes[self.layout.file_of] // np.maximum(counts[self.layout.file_of], 1)
            self._sizes = own
        return self._sizes

    @property
    def total_bytes(self):
        return self.files.total_bytes

    def rooted(self, root):
        """The same samples in a copy of the containers under ``root``."""
        return ShardCatalog(self.files.rooted(root), self.layout)

    def sample_decoder(self, loader, options):
        """What readers decode with: a front end's ``SampleDecoder`` as it is, else a ``ShardDecoder``."""
        from ..formats import is_decoder

        return loader if is_decoder(loader) else ShardDecoder(self.layout, loader, options)

    def __eq__(self, other):
        return isinstance(other, ShardCatalog) and self.files == other.files and self.layout == other.layout


def load_catalog(dataset):
    """The catalog a ``DatasetConfig`` describes: a ``Catalog`` of files, or a ``ShardCatalog``."""
    if not dataset.source:
        raise CatalogError("dataset.source is not set")
    source = open_source(dataset.source, dataset)
    chosen = getattr(dataset, "format", "files")
    if chosen == MDS:
        return _mds_catalog(source)
    extensions = dataset.extensions or EXTENSIONS.get(chosen, [])
    listing = source.read_manifest(dataset.manifest) if dataset.manifest else source.scan(extensions)
    files = Catalog.from_listing(source.root, listing)
    fmt = container_format(dataset, listing.paths)
    if fmt == "files":
        return files
    return ShardCatalog(files, index_containers(source, files, fmt, dataset))


def index_containers(source, files, fmt, dataset):
    """Indexes every container of ``files`` (in threads) into a ``ShardLayout``.

    Raises:
        CatalogError: Naming the container at fault.
    """
    keys = list(getattr(dataset, "keys", []) or [])
    if fmt == HDF5 and not keys:
        raise CatalogError("dataset.format is hdf5 but dataset.keys is empty: name the datasets whose first axis "
                           "indexes samples (for example [x, y])")

    def one(index):
        rel, size = files.path(index), int(files.sizes[index])
        packed = _packed_index(source, rel, size) if fmt == TAR else None
        if packed is not None:
            return packed
        with _opened(source, rel) as fh:
            return index_hdf5(fh, rel, keys) if fmt == HDF5 else index_tar(fh, rel, size)

    found = parallel(one, range(len(files)), min(_INDEX_THREADS, len(files)), "stager-index")
    if fmt == HDF5:
        counts = np.array(found, dtype=np.int64)
        file_of = np.repeat(np.arange(len(files), dtype=np.int64), counts)
        place = np.arange(len(file_of), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        if not len(file_of):
            raise CatalogError(f"dataset at {files.root}: its HDF5 files hold no rows")
        return ShardLayout(HDF5, file_of, place, keys)
    return _tar_layout(files, found, list(getattr(dataset, "parts", []) or []))


def _packed_index(source, rel, size):
    """Tar shard ``rel``'s samples from the index ``stager pack`` wrote beside it; None without one for this size."""
    try:
        with _opened(source, index_name(rel)) as fh:
            data = fh.read()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    return load_index(data, rel, size)


def _tar_layout(files, found, wanted):
    expected = set(wanted) if wanted else {p for p, _, _ in found[0][0][1]}
    parts = sorted(expected)
    column = {p: k for k, p in enumerate(parts)}
    keys, file_of, offsets, lengths = [], [], [], []
    for index, samples in enumerate(found):
        check_parts(samples, files.path(index), expected, exact=not wanted)
        for key, members in samples:
            row_offsets, row_lengths = [0] * len(parts), [0] * len(parts)
            for part, offset, length in members:
                if part in column:
                    row_offsets[column[part]], row_lengths[column[part]] = offset, length
            keys.append(key.encode("utf-8"))
            file_of.append(index)
            offsets.append(row_offsets)
            lengths.append(row_lengths)
    key_offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in keys], out=key_offsets[1:])
    n = len(keys)
    return ShardLayout(TAR, file_of, np.arange(n), parts, np.array(offsets, np.int64).reshape(n, len(parts)),
                       np.array(lengths, np.int64).reshape(n, len(parts)), b"".join(keys), key_offsets)


def _mds_catalog(source):
    """Streaming's MDS shards: the catalog from ``index.json`` alone (no shard is opened to index it).

    Raises:
        CatalogError: Without Streaming, naming what to install; an index
            missing or not Streaming's; a shard it lists missing, or of
            another size than it says; naming the file.
    """
    from ..formats.mds import INDEX, read_index, streaming_decoder

    streaming_decoder()  # refused by name without the extra, before anything is read
    where = f"{source.root.rstrip('/')}/{INDEX}"
    try:
        with _opened(source, INDEX) as fh:
            shards, columns = read_index(fh.read(), where)
    except FileNotFoundError:
        raise CatalogError(f"dataset.format is mds but {where} does not exist: point dataset.source at the "
                           "directory Streaming's MDSWriter wrote") from None
    listing = source.scan(EXTENSIONS[MDS])
    found = {path: k for k, path in enumerate(listing.paths)}
    order = []
    for name, nbytes, _ in shards:
        k = found.get(name)
        if k is None:
            raise CatalogError(f"{where} lists {name}, which is not under {source.root}: a shard is missing")
        if listing.sizes[k] != nbytes:
            raise CatalogError(f"{source.root.rstrip('/')}/{name} holds {listing.sizes[k]} bytes, {where} says "
                               f"{nbytes}: the shard was cut short or rewritten")
        order.append(k)
    files = Catalog.from_listing(source.root, Listing(
        [listing.paths[k] for k in order], [listing.sizes[k] for k in order], None,
        None if listing.mtimes is None else [listing.mtimes[k] for k in order]))
    counts = np.array([samples for _, _, samples in shards], dtype=np.int64)
    file_of = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    place = np.arange(len(file_of), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return ShardCatalog(files, ShardLayout(MDS, file_of, place, [c[0] for c in columns], columns=columns))


@contextlib.contextmanager
def _opened(source, rel):
    """A container opened for reading its index: in place on a file tree, else through the source's ``open_direct``.

    In place, unbuffered and with read-ahead off: indexing reads a tar
    shard's 512-byte headers between long seeks, and read-ahead would pull
    the samples' bytes in as well.
    """
    root = source.local_root
    if root is None:
        with source.open_direct(rel) as path, open(path, "rb") as fh:
            yield fh
        return
    with open(os.path.join(root, rel), "rb", buffering=0) as fh:
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        yield fh
