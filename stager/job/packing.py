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
import multiprocessing
import os
import tarfile
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np

from .progress import Progress
from .synth import MANIFEST, _jpeg_image, _jpeg_noise, sample_shape
from ..errors import ConfigError
from ..formats.tar import dump_index, index_name, index_tar


class Container:
    """One container under ``out``, written under a temporary name and renamed when complete.

    Args:
        out: Its directory (existing).
        fmt: ``tar`` or ``hdf5``.
        index: Its number (its name: ``shard-NNNNNN.tar`` or ``.h5``).
        rows: The most samples it holds (HDF5's datasets are made that long, then cut).
    """

    def __init__(self, out, fmt, index, rows):
        self.path = os.path.join(out, f"shard-{index:06d}.{'tar' if fmt == 'tar' else 'h5'}")
        self.fmt, self.capacity, self.rows = fmt, rows, 0
        if fmt == "tar":
            self.handle = tarfile.open(self.path + ".part", "w", format=tarfile.USTAR_FORMAT)
        else:
            import h5py  # deferred: only HDF5 containers need it

            self.handle = h5py.File(self.path + ".part", "w")

    def add(self, key, parts):
        """Appends one sample (see ``ShardWriter.add``)."""
        if self.fmt == "tar":
            for part, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{part}")
                info.size = len(data)
                self.handle.addfile(info, io.BytesIO(data))
        else:
            self._add_row(key, parts)
        self.rows += 1

    def _add_row(self, key, parts):
        handle = self.handle
        for name, value in parts.items():
            value = np.asarray(value)
            if name not in handle:
                handle.create_dataset(name, shape=(self.capacity, *value.shape), dtype=value.dtype,
                                      maxshape=(None, *value.shape), chunks=(1, *value.shape) if value.shape else None)
            ds = handle[name]
            if ds.shape[1:] != value.shape or ds.dtype != value.dtype:
                raise ConfigError(f"sample {key}: {name} is {value.dtype} {value.shape}, but the container's "
                                  f"earlier samples are {ds.dtype} {ds.shape[1:]}: an HDF5 dataset holds rows of "
                                  "one shape and type")
            ds[self.rows] = value

    def finish(self):
        """Closes and publishes it; returns its file's name."""
        if self.fmt == "hdf5":
            for name in self.handle:
                self.handle[name].resize(self.rows, axis=0)
        self.handle.close()
        os.replace(self.path + ".part", self.path)
        if self.fmt == "tar":
            _write_tar_index(self.path)
        return os.path.basename(self.path)

    def abort(self):
        """Drops it (its temporary file): an interrupted pack leaves no partial container."""
        self.handle.close()
        os.unlink(self.path + ".part")


def _write_tar_index(path):
    """Writes the index of the tar shard at ``path`` beside it (``formats.tar.index_name``), from its headers.

    The catalog reads it instead of the shard: over an object store, indexing
    the shard itself would fetch all of it before staging does.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        data = dump_index(index_tar(fh, os.path.basename(path), size), size)
    side = os.path.join(os.path.dirname(path), index_name(os.path.basename(path)))
    with open(side + ".part", "wb") as fh:
        fh.write(data)
    os.replace(side + ".part", side)


def _fresh(out, fmt, per_shard):
    """Checks the format and size and makes ``out``, which must be new or empty."""
    if fmt not in ("tar", "hdf5"):
        raise ConfigError(f"container format must be tar or hdf5, not {fmt!r}")
    if per_shard < 1:
        raise ConfigError("samples per shard must be at least 1")
    if os.path.isdir(out) and os.listdir(out):
        raise ConfigError(f"{out} already holds files: containers are written only into a new or empty "
                          "directory")
    os.makedirs(out, exist_ok=True)


def _write_manifest(out, names):
    """Writes the manifest listing the containers, last: its presence means the dataset is complete."""
    if not names:
        raise ConfigError("no samples to pack")
    manifest = os.path.join(out, MANIFEST)
    with open(manifest + ".part", "w", encoding="utf-8") as fh:
        fh.writelines(f"{name}\n" for name in names)
    os.replace(manifest + ".part", manifest)
    return manifest


class ShardWriter:
    """Writes samples one by one into numbered containers under ``out``.

    Args:
        out: Directory to create (new or empty).
        fmt: ``tar`` or ``hdf5``.
        per_shard: Samples per container.
    """

    def __init__(self, out, fmt, per_shard):
        _fresh(out, fmt, per_shard)
        self.out, self.fmt, self.per_shard = out, fmt, per_shard
        self.shards = []
        self.samples = 0
        self._open = None   # the Container being written

    def add(self, key, parts):
        """Appends one sample.

        Args:
            key: The sample's key (tar: its members' name before the part).
            parts: Tar: ``{part: bytes}``; HDF5: ``{dataset: array}`` (every
                sample's arrays of one shape and dtype per dataset).
        """
        if self._open is None:
            self._open = Container(self.out, self.fmt, len(self.shards), self.per_shard)
        self._open.add(key, parts)
        self.samples += 1
        if self._open.rows == self.per_shard:
            self._finish()

    def _finish(self):
        self.shards.append(self._open.finish())
        self._open = None

    def abort(self):
        """Drops the container being written: an interrupted pack leaves no partial one."""
        if self._open is not None:
            container, self._open = self._open, None
            container.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()

    def close(self):
        """Completes the last container and writes the manifest; returns the manifest's path."""
        if self._open is not None:
            self._finish()
        return _write_manifest(self.out, self.shards)


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


def pack(catalog, out, fmt, per_shard, processes=None, progress=True):
    """Packs a file tree's samples into containers (``stager pack``), in catalog order.

    Tar: each file becomes ``KEY.EXT`` with ``KEY`` its path without the
    extension, plus ``KEY.cls`` for a labelled catalog. HDF5: every file
    must be a ``.npy`` array of one shape and type, stored as row ``x``,
    with ``y`` the label for a labelled catalog. Containers are independent
    (container ``k`` holds samples ``k * per_shard`` onwards), so
    ``processes`` forked workers write them at once, each a whole container
    at a time; the files are the same whatever their number.

    Args:
        catalog: The files' ``Catalog`` (its root is read).
        processes: Writing processes; None: the cores this process may use;
            1: this process alone.

    Returns:
        ``(manifest path, containers written)``.
    """
    _fresh(out, fmt, per_shard)
    count = -(-len(catalog) // per_shard)
    processes = min(processes or len(os.sched_getaffinity(0)), max(count, 1))
    jobs = [(catalog.root, out, fmt, k, [(catalog.path(i), catalog.label(i))
                                         for i in range(k * per_shard, min(len(catalog), (k + 1) * per_shard))])
            for k in range(count)]
    bar = Progress(len(catalog), f"packing into {out}", "files", enabled=progress)
    if processes <= 1:
        names = []
        for job in jobs:
            names.append(_write_container(*job))
            bar.update(len(job[-1]))
    else:
        names = _in_processes(jobs, processes, bar)
    bar.close()
    return _write_manifest(out, names), len(names)


def _in_processes(jobs, processes, bar):
    """Writes the containers of ``jobs`` in ``processes`` forked workers; their names in order.

    The first error ends the pack: containers not begun are cancelled, those
    being written finish or drop their temporary file, and the error is
    raised here (a worker's own error, naming the file at fault; a worker
    that died, ``BrokenProcessPool``). The pool is shut down and joined
    whatever happens, so no worker outlives the call.
    """
    names = [None] * len(jobs)
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = {pool.submit(_write_container, *job): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            names[job[3]] = future.result()
            bar.update(len(job[-1]))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return names


def _write_container(root, out, fmt, index, entries):
    """Writes container ``index`` of ``entries`` (``(relative path, label)``); returns its file's name."""
    container = Container(out, fmt, index, len(entries))
    try:
        for rel, label in entries:
            container.add(*_packed(root, rel, label, fmt))
        return container.finish()
    except BaseException:
        container.abort()
        raise


def _packed(root, rel, label, fmt):
    """``(key, parts)`` of the file ``rel`` under ``root``, labelled ``label``, for a ``fmt`` container."""
    path = os.path.join(root, rel)
    key, dot, ext = rel.rpartition(".")
    if not dot or "/" in ext or "." in os.path.basename(key):
        raise ConfigError(f"{rel}: tar shards name a sample's parts KEY.PART, so a file must have exactly one "
                          "dot in its name to be packed")
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
