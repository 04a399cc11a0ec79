"""Writing samples into containers: ``stager pack`` (a folder of files) and ``stager make-dataset --format tar|hdf5``.

A ``ShardWriter`` takes samples one by one and writes them into containers
of a given number of samples, each written under a temporary name and
renamed when complete, then a manifest listing the containers (written last:
its presence means the dataset is complete), which ``dataset.manifest``
names. Tar shards follow WebDataset's layout (``KEY.PART`` members, a
sample's members together); HDF5 containers hold one row per sample in each
named dataset, chunked by row so that a sample is read alone.
"""

import io
import os
import tarfile

import numpy as np

from .progress import Progress
from .synth import MANIFEST, _jpeg_image, _jpeg_noise, sample_shape
from ..errors import ConfigError


class ShardWriter:
    """Writes samples into numbered containers under ``out``.

    Args:
        out: Directory to create (new or empty).
        fmt: ``tar`` or ``hdf5``.
        per_shard: Samples per container.
    """

    def __init__(self, out, fmt, per_shard):
        if fmt not in ("tar", "hdf5"):
            raise ConfigError(f"container format must be tar or hdf5, not {fmt!r}")
        if per_shard < 1:
            raise ConfigError("samples per shard must be at least 1")
        if os.path.isdir(out) and os.listdir(out):
            raise ConfigError(f"{out} already holds files: containers are written only into a new or empty "
                              "directory")
        os.makedirs(out, exist_ok=True)
        self.out, self.fmt, self.per_shard = out, fmt, per_shard
        self.shards = []
        self.samples = 0
        self._open = None   # the container being written: (path, handle)
        self._rows = 0

    def add(self, key, parts):
        """Appends one sample.

        Args:
            key: The sample's key (tar: its members' name before the part).
            parts: Tar: ``{part: bytes}``; HDF5: ``{dataset: array}`` (every
                sample's arrays of one shape and dtype per dataset).
        """
        if self._open is None:
            self._start()
        path, handle = self._open
        if self.fmt == "tar":
            for part, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{part}")
                info.size = len(data)
                handle.addfile(info, io.BytesIO(data))
        else:
            self._add_row(handle, path, key, parts)
        self._rows += 1
        self.samples += 1
        if self._rows == self.per_shard:
            self._finish()

    def _start(self):
        name = f"shard-{len(self.shards):06d}.{'tar' if self.fmt == 'tar' else 'h5'}"
        path = os.path.join(self.out, name)
        if self.fmt == "tar":
            handle = tarfile.open(path + ".part", "w", format=tarfile.USTAR_FORMAT)
        else:
            import h5py  # deferred: only HDF5 containers need it

            handle = h5py.File(path + ".part", "w")
        self._open, self._rows = (path, handle), 0

    def _add_row(self, handle, path, key, parts):
        for name, value in parts.items():
            value = np.asarray(value)
            if name not in handle:
                handle.create_dataset(name, shape=(self.per_shard, *value.shape), dtype=value.dtype,
                                      maxshape=(None, *value.shape), chunks=(1, *value.shape) if value.shape else None)
            ds = handle[name]
            if ds.shape[1:] != value.shape or ds.dtype != value.dtype:
                raise ConfigError(f"sample {key}: {name} is {value.dtype} {value.shape}, but the container's "
                                  f"earlier samples are {ds.dtype} {ds.shape[1:]}: an HDF5 dataset holds rows of "
                                  "one shape and type")
            ds[self._rows] = value

    def _finish(self):
        path, handle = self._open
        if self.fmt == "hdf5":
            for name in handle:
                handle[name].resize(self._rows, axis=0)
        handle.close()
        os.replace(path + ".part", path)
        self.shards.append(os.path.basename(path))
        self._open = None

    def abort(self):
        """Drops the container being written (its temporary file): an interrupted pack leaves no partial one."""
        if self._open is not None:
            path, handle = self._open
            self._open = None
            handle.close()
            os.unlink(path + ".part")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()

    def close(self):
        """Completes the last container and writes the manifest; returns the manifest's path."""
        if self._open is not None:
            self._finish()
        if not self.shards:
            raise ConfigError("no samples to pack")
        manifest = os.path.join(self.out, MANIFEST)
        with open(manifest + ".part", "w", encoding="utf-8") as fh:
            fh.writelines(f"{name}\n" for name in self.shards)
        os.replace(manifest + ".part", manifest)
        return manifest


def make_shards(out, fmt, samples, nbytes, classes, seed, per_shard, content="npy", progress=True):
    """Writes a synthetic labelled dataset in containers (``stager make-dataset --format tar|hdf5``).

    Tar samples are ``KEY.npy`` (or ``KEY.jpg``) and ``KEY.cls`` (the label
    as text), keys numbered in order; HDF5 containers hold ``x`` (uint8
    images) and ``y`` (int64 labels).

    Returns:
        The manifest's path.
    """
    rng = np.random.default_rng(seed)
    shape = sample_shape(nbytes)
    labels = rng.integers(0, classes, size=samples)
    noise = _jpeg_noise(nbytes, seed) if content == "jpeg" and fmt == "tar" else 0
    bar = Progress(samples, f"making {out}", "samples", enabled=progress)
    width = len(str(samples - 1))
    with ShardWriter(out, fmt, per_shard) as writer:
        _synthetic(writer, fmt, samples, width, shape, labels, rng, content, noise, bar)
        bar.close()
        return writer.close()


def _synthetic(writer, fmt, samples, width, shape, labels, rng, content, noise, bar):
    for i in range(samples):
        key = f"{i:0{width}d}"
        if fmt == "hdf5":
            writer.add(key, {"x": rng.integers(0, 256, size=shape, dtype=np.uint8), "y": np.int64(labels[i])})
        elif content == "jpeg":
            writer.add(key, {"jpg": _jpeg_image(rng, noise), "cls": str(labels[i]).encode()})
        else:
            buf = io.BytesIO()
            np.save(buf, rng.integers(0, 256, size=shape, dtype=np.uint8))
            writer.add(key, {"npy": buf.getvalue(), "cls": str(labels[i]).encode()})
        bar.update()


def pack(catalog, out, fmt, per_shard, progress=True):
    """Packs a file tree's samples into containers (``stager pack``), in catalog order.

    Tar: each file becomes ``KEY.EXT`` with ``KEY`` its path without the
    extension, plus ``KEY.cls`` for a labelled catalog. HDF5: every file
    must be a ``.npy`` array of one shape and type, stored as row ``x``,
    with ``y`` the label for a labelled catalog.

    Args:
        catalog: The files' ``Catalog`` (its root is read).

    Returns:
        ``(manifest path, containers written)``.
    """
    bar = Progress(len(catalog), f"packing into {out}", "files", enabled=progress)
    with ShardWriter(out, fmt, per_shard) as writer:
        for i in range(len(catalog)):
            writer.add(*_packed(catalog, i, fmt))
            bar.update()
        bar.close()
        return writer.close(), len(writer.shards)


def _packed(catalog, i, fmt):
    """``(key, parts)`` of catalog entry ``i`` for a ``fmt`` container."""
    rel = catalog.path(i)
    path = os.path.join(catalog.root, rel)
    key, dot, ext = rel.rpartition(".")
    if not dot or "/" in ext or "." in os.path.basename(key):
        raise ConfigError(f"{rel}: tar shards name a sample's parts KEY.PART, so a file must have exactly one "
                          "dot in its name to be packed")
    label = catalog.label(i)
    if fmt == "tar":
        with open(path, "rb") as fh:
            parts = {ext.lower(): fh.read()}
        if label is not None:
            parts["cls"] = str(label).encode()
        return key, parts
    if ext.lower() != "npy":
        raise ConfigError(f"{rel}: HDF5 containers hold arrays; pack .npy files into them (or pack --format tar)")
    parts = {"x": np.load(path, allow_pickle=False)}
    if label is not None:
        parts["y"] = np.int64(label)
    return key, parts
