"""The list of samples: relative path, size in bytes, optional integer label.

Paths are held as one UTF-8 blob plus offsets and sizes/labels as numpy
arrays, so a catalog of millions of samples is a few arrays (cheap to keep,
pickle and broadcast) rather than millions of Python objects.
"""

import os
import posixpath

import numpy as np

from .errors import CatalogError


def check_relpath(rel, where):
    """Rejects a path that could point outside the dataset root.

    Args:
        rel: The path as written in the listing.
        where: Description of its origin for the error, e.g. ``"manifest.tsv:12"``.

    Returns:
        The normalised relative path.

    Raises:
        CatalogError: If the path is empty, absolute or climbs with ``..``.
    """
    if not rel:
        raise CatalogError(f"{where}: empty path")
    if rel.startswith("/") or os.path.isabs(rel):
        raise CatalogError(f"{where}: absolute path {rel!r} not allowed; paths are relative to the dataset root")
    if ".." in rel.split("/"):
        raise CatalogError(f"{where}: path {rel!r} contains '..'; paths must stay inside the dataset root")
    return posixpath.normpath(rel)


class Catalog:
    """An immutable list of samples under one root.

    Args:
        root: Dataset root directory.
        blob: All relative paths, UTF-8, concatenated.
        offsets: Start of each path in ``blob``, plus the end.
        sizes: Size of each file in bytes.
        labels: Integer label per sample, or None.
    """

    def __init__(self, root, blob, offsets, sizes, labels=None, mtimes=None):
        self.root = os.path.abspath(root)
        self._blob = bytes(blob)
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
        return self._blob[self._offsets[index]:self._offsets[index + 1]].decode("utf-8")

    def rooted(self, root):
        """The same samples under another root (a local copy of the dataset)."""
        return Catalog(root, self._blob, self._offsets, self.sizes, self.labels, self.mtimes)

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

        return (isinstance(other, Catalog) and self.root == other.root and self._blob == other._blob
                and same(self._offsets, other._offsets) and same(self.sizes, other.sizes)
                and same(self.labels, other.labels) and same(self.mtimes, other.mtimes))

    @classmethod
    def from_manifest(cls, root, manifest):
        """Reads a manifest: one relative path per line, optional label after a tab.

        Blank lines and lines starting with ``#`` are skipped. Every listed file
        is checked to exist inside the root, and its size is recorded.

        Args:
            root: Dataset root.
            manifest: Manifest file; relative paths are taken from ``root``.

        Raises:
            CatalogError: Naming the manifest line at fault.
        """
        manifest = manifest if os.path.isabs(manifest) else os.path.join(root, manifest)
        real_root = os.path.realpath(root)
        try:
            with open(manifest, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise CatalogError(f"cannot read manifest {manifest}: {exc.strerror}") from None
        paths, sizes, labels, mtimes = [], [], [], []
        labelled = None
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.startswith("#"):
                continue
            where = f"{manifest}:{number}"
            fields = line.split("\t")
            if len(fields) > 2:
                raise CatalogError(f"{where}: expected 'path' or 'path<TAB>label', got {len(fields)} fields")
            rel = check_relpath(fields[0], where)
            full = os.path.join(real_root, rel)
            real = os.path.realpath(full)
            if os.path.commonpath([real, real_root]) != real_root:
                raise CatalogError(f"{where}: {rel!r} resolves to {real}, outside the dataset root {real_root}")
            try:
                st = os.stat(real)
            except OSError as exc:
                raise CatalogError(f"{where}: sample {rel!r} not readable: {exc.strerror}") from None
            if not os.path.isfile(real):
                raise CatalogError(f"{where}: sample {rel!r} is not a regular file")
            has_label = len(fields) == 2
            if labelled is None:
                labelled = has_label
            elif labelled != has_label:
                raise CatalogError(f"{where}: every line needs a label or none does; this line "
                                   f"{'has' if has_label else 'has no'} label, earlier lines differ")
            if has_label:
                try:
                    labels.append(int(fields[1]))
                except ValueError:
                    raise CatalogError(f"{where}: label {fields[1]!r} is not an integer") from None
            paths.append(rel)
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns)
        if not paths:
            raise CatalogError(f"manifest {manifest} lists no samples")
        return cls.from_paths(root, paths, sizes, labels if labelled else None, mtimes)

    @classmethod
    def from_directory(cls, root, extensions=()):
        """Scans a directory tree once.

        Hidden files and directories are skipped. When every sample lies in a
        first-level subdirectory (the ImageNet layout), those directories are
        the classes: labels are their indices in sorted order.

        Args:
            root: Dataset root.
            extensions: Keep only files ending in one of these; empty keeps all.

        Raises:
            CatalogError: If the root is missing or holds no samples, or a
                symbolic link points outside it.
        """
        if not os.path.isdir(root):
            raise CatalogError(f"dataset root {root} is not a directory")
        real_root = os.path.realpath(root)
        paths, sizes, mtimes = [], [], []
        for dirpath, dirnames, filenames in os.walk(real_root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith(".") or (extensions and not name.endswith(tuple(extensions))):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, real_root).replace(os.sep, "/")
                real = os.path.realpath(full)
                if os.path.commonpath([real, real_root]) != real_root:
                    raise CatalogError(f"{full}: symbolic link to {real}, outside the dataset root {real_root}")
                if not os.path.isfile(real):
                    continue
                st = os.stat(real)
                paths.append(rel)
                sizes.append(st.st_size)
                mtimes.append(st.st_mtime_ns)
        if not paths:
            raise CatalogError(f"dataset at {root} has no samples"
                               + (f" with extensions {list(extensions)}" if extensions else ""))
        labels = None
        if all("/" in p for p in paths):
            classes = sorted({p.split("/", 1)[0] for p in paths})
            index = {c: i for i, c in enumerate(classes)}
            labels = [index[p.split("/", 1)[0]] for p in paths]
        return cls.from_paths(root, paths, sizes, labels, mtimes)

    @classmethod
    def load(cls, dataset):
        """Builds the catalog that a ``DatasetConfig`` describes."""
        if not dataset.source:
            raise CatalogError("dataset.source is not set")
        if dataset.manifest:
            return cls.from_manifest(dataset.source, dataset.manifest)
        return cls.from_directory(dataset.source, dataset.extensions)


def broadcast_catalog(comm, build, root=0):
    """Builds the catalog on one rank and sends it to all others.

    Only rank ``root`` touches the shared file system's metadata; the others
    receive four arrays by buffer broadcasts, which cost milliseconds even
    for millions of samples. A failure on ``root`` is raised on every rank.

    Args:
        comm: mpi4py communicator, or None (then ``build()`` is returned).
        build: Callable that returns a Catalog.
        root: Rank that builds it.

    Returns:
        The Catalog, on every rank.
    """
    if comm is None:
        return build()
    catalog, header, failure = None, None, None
    if comm.Get_rank() == root:
        try:
            catalog = build()
            header = ("ok", catalog.root, len(catalog), len(catalog._blob), catalog.labels is not None,
                      catalog.mtimes is not None)
        except Exception as exc:  # every rank must learn of it, or the others wait forever
            failure = exc
            header = ("error", f"{type(exc).__name__}: {exc}")
    header = comm.bcast(header, root=root)
    if header[0] == "error":
        if failure is not None:
            raise failure
        raise CatalogError(f"rank {root} could not build the catalog: {header[1]}")
    _, root_dir, n, blob_len, labelled, timed = header
    if catalog is not None:
        blob = np.frombuffer(catalog._blob, dtype=np.uint8).copy()
        offsets, sizes, labels, mtimes = catalog._offsets, catalog.sizes, catalog.labels, catalog.mtimes
    else:
        blob = np.empty(blob_len, dtype=np.uint8)
        offsets, sizes = np.empty(n + 1, np.int64), np.empty(n, np.int64)
        labels = np.empty(n, np.int64) if labelled else None
        mtimes = np.empty(n, np.int64) if timed else None
    for array in (blob, offsets, sizes, labels, mtimes):
        if array is not None:
            comm.Bcast(array, root=root)
    if catalog is not None:
        return catalog
    return Catalog(root_dir, blob.tobytes(), offsets, sizes, labels, mtimes)
