"""Samples inside containers: where each lies (``ShardLayout``) and how a reader takes it out.

A container (a tar shard, an HDF5 file) is what is staged; a sample is read
from the staged copy: a tar sample's parts by their byte ranges (one
``pread`` each), an HDF5 sample as row ``i`` of each named dataset. Each
reader keeps the containers it reads open (opening an HDF5 file costs more
than reading a row), up to ``_OPEN``, reopened when the path no longer
names the file it opened (the copy was evicted and staged again); every
``_SWEEP`` samples it closes those whose file the cache removed, so a
reader does not hold an evicted copy's disk space for long.

A sample is a dict: for tar, ``__key__`` and each part (bytes, or decoded
by ``dataset.loader``: ``npy`` parts with ``npy``, ``jpg``/``jpeg``/``png``
parts with ``image``); for HDF5, each dataset's row. A ``module:function``
loader receives that dict and returns the sample.
"""

import collections
import io
import os

import numpy as np

from .decoder import SampleDecoder

TAR, HDF5, MDS = "tar", "hdf5", "mds"
_IMAGE_PARTS = ("jpg", "jpeg", "png")
_OPEN = 32  # containers each reader keeps open: a window's worth (plan.shard_window) and more
_SWEEP = 64  # samples between two checks for open containers the cache removed


class ShardLayout:
    """Where every sample of a sharded dataset lies in its container.

    Args:
        format: ``tar``, ``hdf5``, ``mds``, or ``custom`` (a front end's dataset
            reads its samples from their files itself; ``place`` is its own index).
        file_of: Per sample, its container's index (int64).
        place: Per sample: its row (HDF5), its place in its shard (MDS) or in
            the part arrays (tar).
        parts: Tar: the parts kept, in column order; HDF5: the datasets (``dataset.keys``).
        offsets: Tar: ``(samples, parts)`` int64 data offsets in the shard.
        lengths: Tar: ``(samples, parts)`` int64 data sizes.
        keys: Tar: each sample's key, UTF-8, concatenated.
        key_offsets: Tar: where each key starts in ``keys``, plus the end.
        columns: MDS: ``[(name, encoding, fixed size or None)]`` (``formats.mds``).
    """

    def __init__(self, format, file_of, place, parts, offsets=None, lengths=None, keys=b"", key_offsets=None,
                 columns=None):
        self.format = format
        self.file_of = np.asarray(file_of, dtype=np.int64)
        self.place = np.asarray(place, dtype=np.int64)
        self.parts = tuple(parts)
        self.offsets = None if offsets is None else np.asarray(offsets, dtype=np.int64)
        self.lengths = None if lengths is None else np.asarray(lengths, dtype=np.int64)
        self.keys = bytes(keys)
        self.key_offsets = None if key_offsets is None else np.asarray(key_offsets, dtype=np.int64)
        self.columns = None if columns is None else [tuple(c) for c in columns]

    def __len__(self):
        return len(self.file_of)

    def key(self, index):
        """The sample's name in its container: its tar key, or its place (an HDF5 row) as text."""
        if self.format == TAR:
            return self.keys[self.key_offsets[index]:self.key_offsets[index + 1]].decode("utf-8")
        return str(int(self.place[index]))

    def sample_bytes(self):
        """Per sample, the bytes of its parts (tar), or None where a container does not say (HDF5)."""
        return None if self.lengths is None else self.lengths.sum(axis=1)

    def __eq__(self, other):
        return (isinstance(other, ShardLayout) and self.format == other.format and self.parts == other.parts
                and np.array_equal(self.file_of, other.file_of) and np.array_equal(self.place, other.place)
                and self.keys == other.keys and _same(self.offsets, other.offsets)
                and _same(self.lengths, other.lengths) and _same(self.key_offsets, other.key_offsets)
                and self.columns == other.columns)


def _same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


class ShardReader:
    """Takes samples out of containers; one per process (it keeps files open).

    Args:
        layout: The dataset's ``ShardLayout``.
        encoded: MDS columns as the bytes stored, not decoded by Streaming
            (for a reader that decodes them itself, as DALI's decoders do).
    """

    def __init__(self, layout, encoded=False):
        self.layout = layout
        self.encoded = encoded
        self._open = collections.OrderedDict()  # path -> (inode, handle)
        self._pid = os.getpid()
        self._reads = 0
        self._inherited = []
        self._counts = None  # MDS: samples per shard, as the index says
        self._decode = None  # MDS: Streaming's mds_decode

    def read(self, path, index):
        """Sample ``index`` (a dict of its parts, undecoded) from its container at ``path``."""
        layout = self.layout
        self._reads += 1
        if self._reads % _SWEEP == 0:
            self._sweep()
        handle = self._handle(path, index)
        if layout.format == MDS:
            return self._mds_sample(path, handle, int(layout.place[index]))
        if layout.format == HDF5:
            row = int(layout.place[index])
            return {key: ds[row] for key, ds in zip(layout.parts, handle[1])}
        at = int(layout.place[index])
        sample = {"__key__": layout.key(index)}
        for part, offset, length in zip(layout.parts, layout.offsets[at].tolist(), layout.lengths[at].tolist()):
            data = os.pread(handle, length, offset)
            if len(data) != length:
                raise OSError(f"{path}: sample {sample['__key__']!r} part {part!r}: {len(data)} of {length} "
                              f"bytes at offset {offset}: the container is shorter than its catalog says")
            sample[part] = data
        return sample

    def _mds_sample(self, path, handle, row):
        from .mds import decode_sample, streaming_decoder  # deferred: Streaming only for MDS shards

        if self._decode is None:
            self._decode = (lambda _encoding, data: data) if self.encoded else streaming_decoder()
        fd, offsets = handle
        begin, end = int(offsets[row]), int(offsets[row + 1])
        data = os.pread(fd, end - begin, begin)
        if len(data) != end - begin:
            raise OSError(f"{path}: sample {row}: {len(data)} of {end - begin} bytes at offset {begin}: the shard "
                          "is shorter than its header says")
        return decode_sample(data, self.layout.columns, self._decode, f"{path}: sample {row}")

    def _mds_open(self, path, index):
        """A shard's descriptor and offsets, its sample count checked against the index's."""
        from .mds import shard_offsets

        if self._counts is None:
            self._counts = np.bincount(self.layout.file_of)
        fd = os.open(path, os.O_RDONLY)
        try:
            offsets = shard_offsets(lambda size, at: os.pread(fd, size, at), path)
            expected = int(self._counts[self.layout.file_of[index]])
            if len(offsets) - 1 != expected:
                raise OSError(f"{path}: the shard's header lists {len(offsets) - 1} samples, the index "
                              f"{expected}: it is not the shard the index describes")
        except BaseException:
            os.close(fd)
            raise
        return fd, offsets

    def _handle(self, path, index):
        if self._pid != os.getpid():
            # Inherited by a forked process: those descriptors and HDF5 handles are the parent's (or were
            # closed with the rest of its descriptors, and their numbers may name other files here). They
            # are kept, never closed, and this process opens its own.
            self._inherited.append(self._open)
            self._open, self._pid = collections.OrderedDict(), os.getpid()
        inode = os.stat(path).st_ino
        held = self._open.get(path)
        if held is not None and held[0] == inode:
            self._open.move_to_end(path)
            return held[1]
        if held is not None:
            self._close(self._open.pop(path)[1])
        if self.layout.format == HDF5:
            import h5py  # deferred: only users of HDF5 pay for the import

            fh = h5py.File(path, "r")
            handle = (fh, [fh[key] for key in self.layout.parts])
        elif self.layout.format == MDS:
            handle = self._mds_open(path, index)
        else:
            handle = os.open(path, os.O_RDONLY)
        self._open[path] = (inode, handle)
        while len(self._open) > _OPEN:
            self._close(self._open.popitem(last=False)[1][1])
        return handle

    def _sweep(self):
        """Closes the open containers whose path no longer names the file opened (removed, or staged again)."""
        for path, (inode, handle) in list(self._open.items()):
            try:
                same = os.stat(path).st_ino == inode
            except FileNotFoundError:
                same = False
            if not same:
                del self._open[path]
                self._close(handle)

    @staticmethod
    def _close(handle):
        if isinstance(handle, int):
            os.close(handle)
        elif isinstance(handle[0], int):  # an MDS shard's descriptor and offsets
            os.close(handle[0])
        else:
            handle[0].close()

    def close(self):
        """Closes every container this reader holds open."""
        while self._open:
            self._close(self._open.popitem()[1][1])


def kept_parts(tier, index, path, read, loader, options):
    """Sample ``index``'s decoded parts through the decoded tier: kept as the ``image`` loader decodes them (HWC),
    then put in ``options``'s layout.

    Args:
        tier: The reader's ``decoded.DecodedTier``.
        read: ``path -> the sample's dict`` (a ``ShardReader``'s read of this sample).
        loader: ``image`` (the one loader of parts whose results are kept).
    """
    from .images import in_layout

    parts = tier.load(index, path, lambda p: decode_parts(read(p), loader, {"layout": "hwc"}))
    if options.get("layout") != "chw":
        return parts
    return {k: in_layout(v, options) if k in _IMAGE_PARTS else v for k, v in parts.items()}


def decode_parts(sample, loader, options):
    """A sample's parts decoded as ``dataset.loader`` says (see the module's docstring).

    Args:
        sample: ``ShardReader.read``'s dict.
        loader: A registry name, or a callable taking the dict.
        options: The loaders' options (``layout``).
    """
    if callable(loader):
        return loader(sample)
    if loader == "npy":
        return {k: np.load(io.BytesIO(v), allow_pickle=False) if k.endswith("npy") else v for k, v in sample.items()}
    if loader == "image":
        from .images import decode_rgb, to_chw  # deferred: PIL and simplejpeg only for image datasets

        def image(part, data):
            try:
                hwc = decode_rgb(data)
            except Exception as exc:
                raise ValueError(f"sample {sample.get('__key__')!r} part {part!r}: not a readable image: "
                                 f"{type(exc).__name__}: {exc}") from exc
            return to_chw(hwc) if options.get("layout") == "chw" else hwc

        return {k: image(k, v) if k in _IMAGE_PARTS else v for k, v in sample.items()}
    return sample


class ShardDecoder(SampleDecoder):
    """Readers' decoder for a sharded dataset: the sample from the staged container, then ``decode_parts``.

    Args:
        layout: The dataset's ``ShardLayout``.
        loader: ``dataset.loader``: a registry name or ``module:function``.
        options: The loaders' options.
    """

    def __init__(self, layout, loader, options):
        self.layout = layout
        self.loader = loader
        self.options = options
        self._reader = None
        self._load = None
        self._tier = None

    def keeps_decoded(self):
        return self.loader == "image"

    def start(self, worker, workers):
        from .files import resolve_loader  # the registry of loader names

        self._reader = ShardReader(self.layout)
        self._load = resolve_loader(self.loader)

    def decode(self, path, index, epoch):
        if self._reader is None:
            self.start(0, 1)
        if self._tier is not None:
            return kept_parts(self._tier, index, path, lambda p: self._reader.read(p, index), self.loader,
                              self.options)
        return decode_parts(self._reader.read(path, index), self._load, self.options)

    def __getstate__(self):
        return {"layout": self.layout, "loader": self.loader, "options": self.options, "_reader": None,
                "_load": None, "_tier": None}
