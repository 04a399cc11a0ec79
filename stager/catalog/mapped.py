"""The catalog as one binary file on the shared file system, memory-mapped read-only.

A catalog of a billion samples is tens of gigabytes: too much to broadcast or
to hold on every node. Built once (``stager catalog build``), it is a header
and five aligned sections, so each node maps it and the operating system
reads only the pages of the entries its ranks touch:

    header   magic, version, entries, blob length, flags, total bytes, root length
    root     the dataset root it was built from, UTF-8, padded to 8 bytes
    offsets  int64 x (entries + 1): where each path starts in the blob
    sizes    int64 x entries
    labels   int64 x entries (if labelled)
    mtimes   int64 x entries (if recorded)
    blob     every relative path, UTF-8, concatenated

Little-endian throughout. Files are written under a temporary name and
renamed, so a reader never maps half a catalog.
"""

import logging
import mmap
import os
import struct

import numpy as np

from .table import Catalog
from ..errors import CatalogError
from ..sources.deadline import reading

log = logging.getLogger(__name__)

MAGIC = b"STAGCAT\0"
VERSION = 1
HEADER = struct.Struct("<8sQQQQQQ")  # magic, version, entries, blob length, flags, total bytes, root length
LABELS, MTIMES = 1, 2


def _pad(length):
    return -length % 8


def layout(entries, blob_len, flags, root_len):
    """Byte offset of each section, and the file's length.

    Returns:
        ``(sections, length)``: ``sections`` maps offsets, sizes, labels,
        mtimes (None when absent) and blob to their first byte.
    """
    at = HEADER.size + root_len + _pad(root_len)
    sections = {}
    for name, present in (("offsets", True), ("sizes", True), ("labels", flags & LABELS), ("mtimes", flags & MTIMES)):
        sections[name] = at if present else None
        if present:
            at += 8 * (entries + (name == "offsets"))
    sections["blob"] = at
    return sections, at + blob_len


def header(root, entries, blob_len, labelled, timed, total_bytes):
    """The header and root bytes of a catalog file, and its section layout."""
    root_bytes = os.path.abspath(root).encode("utf-8")
    flags = (LABELS if labelled else 0) | (MTIMES if timed else 0)
    head = HEADER.pack(MAGIC, VERSION, entries, blob_len, flags, total_bytes, len(root_bytes))
    sections, length = layout(entries, blob_len, flags, len(root_bytes))
    return head + root_bytes + b"\0" * _pad(len(root_bytes)), sections, length


def write_catalog(catalog, path):
    """Writes ``catalog`` to ``path`` (atomically: a temporary name, then rename).

    Returns:
        The file's length in bytes.
    """
    blob = np.frombuffer(catalog.paths_blob(), dtype=np.uint8)
    head, sections, length = header(catalog.root, len(catalog), len(blob), catalog.labels is not None,
                                    catalog.mtimes is not None, catalog.total_bytes)
    arrays = {"offsets": catalog.offsets, "sizes": catalog.sizes, "labels": catalog.labels,
              "mtimes": catalog.mtimes, "blob": blob}
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(head)
            for name, at in sections.items():
                if at is not None:
                    fh.seek(at)
                    np.ascontiguousarray(arrays[name], dtype=np.uint8 if name == "blob" else "<i8").tofile(fh)
            fh.truncate(length)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return length


def read_header(path):
    """The header of catalog file ``path`` as a dict; raises ``CatalogError`` naming the file if it is not one."""
    try:
        with reading("open", path), open(path, "rb") as fh:
            raw = fh.read(HEADER.size)
            if len(raw) < HEADER.size or not raw.startswith(MAGIC):
                raise CatalogError(f"{path} is not a stager catalog file (build one with `stager catalog build`)")
            _, version, entries, blob_len, flags, total, root_len = HEADER.unpack(raw)
            if version != VERSION:
                raise CatalogError(f"{path}: catalog file version {version}, this stager reads version {VERSION}")
            root = fh.read(min(root_len, 1 << 16)).decode("utf-8", "replace")
        length = os.path.getsize(path)
    except OSError as exc:
        raise CatalogError(f"cannot read catalog file {path}: {exc.strerror}") from None
    sections, expected = layout(entries, blob_len, flags, root_len)
    if length != expected:
        raise CatalogError(f"{path}: {length} bytes, its header says {expected}: truncated or damaged")
    return {"entries": entries, "blob_len": blob_len, "flags": flags, "total_bytes": total, "root": root,
            "sections": sections}


class MappedCatalog(Catalog):
    """A ``Catalog`` whose arrays are views of a read-only mapping of a catalog file.

    Nothing is read until an entry is: a node pays memory for the pages of
    the entries its ranks use. Pickles as its file name.

    Args:
        path: The catalog file.
        root: Dataset root to read samples from; default: the one it was built from.
    """

    def __init__(self, path, root=None):
        self.file = os.path.abspath(path)
        head = read_header(self.file)
        n, at = head["entries"], head["sections"]
        with reading("open", self.file), open(self.file, "rb") as fh:
            view = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        # Ranks read entries in shuffled order: reading ahead would bring in
        # pages of entries nobody asked for.
        view.madvise(mmap.MADV_RANDOM)
        mapped = np.frombuffer(view, dtype=np.uint8)

        def section(name, count):
            return None if at[name] is None else mapped[at[name]:at[name] + 8 * count].view("<i8")

        blob = mapped[at["blob"]:at["blob"] + head["blob_len"]]
        super().__init__(root or head["root"], blob, section("offsets", n + 1), section("sizes", n),
                         section("labels", n), section("mtimes", n))
        self._total = head["total_bytes"]

    @property
    def total_bytes(self):
        return self._total

    def rooted(self, root):
        return MappedCatalog(self.file, root)

    def __reduce__(self):
        return MappedCatalog, (self.file, self.root)


def catalog_entries(path):
    """The number of entries of catalog file ``path``, from its header alone."""
    return read_header(path)["entries"]


