"""``stager catalog build``: list a source once and write its catalog file, in parallel over ranks.

A tree is split by its first-level subdirectories (the classes of an
ImageNet-like layout): each rank scans a contiguous run of them, in the
scan's own order, so the parts concatenated in rank order are exactly what
one rank scanning the whole tree would list (``PosixSource.scan``). Every
rank then writes its entries at their place in one file, which rank 0
publishes by renaming once all parts are in. A manifest is read by rank 0.
"""

import os

import numpy as np

from .mapped import header, write_catalog
from .table import Catalog
from ..errors import CatalogError
from ..sources import open_source
from ..world import agree, everyone


def build_catalog(source, out, extensions=(), manifest=None, comm=None):
    """Lists ``source`` and writes the catalog file ``out``.

    Args:
        source: ``dataset.source``: a directory or ``file://`` location.
        out: The catalog file to write (on a file system every node reads).
        extensions: When scanning, keep only these suffixes.
        manifest: A manifest to read instead of scanning (on rank 0 only).
        comm: mpi4py communicator whose ranks scan in parallel, or None.

    Returns:
        ``(entries, total_bytes)`` of the written catalog, on every rank.

    Raises:
        CatalogError: Naming the rank and the file at fault.
    """
    src = open_source(source)
    if manifest or comm is None or comm.Get_size() == 1:
        def serial():
            listing = src.read_manifest(manifest) if manifest else src.scan(extensions)
            catalog = Catalog.from_listing(src.root, listing)
            write_catalog(catalog, out)
            return len(catalog), catalog.total_bytes

        return agree(comm, serial, lambda text: CatalogError(f"rank 0 could not build the catalog: {text}"))
    return _parallel(src, out, extensions, comm)


def _failed(rank, text):
    return CatalogError(f"rank {rank} could not build its part of the catalog: {text}")


def _parallel(src, out, extensions, comm):
    rank, size = comm.Get_rank(), comm.Get_size()

    def top():
        return src.subtrees(), list(src.walk(extensions, recurse=False))

    subtrees, root_files = agree(comm, top, lambda text: _failed(0, text))
    mine = [subtrees[i] for i in np.array_split(np.arange(len(subtrees)), size)[rank]]

    def scan():
        parts = [list(src.walk(extensions, top=d)) for d in mine]
        return ([] if rank else root_files) + [e for p in parts for e in p], [len(p) for p in parts if p]

    entries, per_class = everyone(comm, scan, _failed)
    encoded = [rel.encode("utf-8") for rel, _, _ in entries]
    sizes = np.array([s for _, s, _ in entries], dtype=np.int64)
    counts = comm.allgather((len(entries), sum(len(e) for e in encoded), len(per_class), int(sizes.sum())))
    n, blob_len, _, total = (sum(c[k] for c in counts) for k in range(4))
    if n == 0:
        raise CatalogError(f"dataset at {src.root} has no samples"
                           + (f" with extensions {list(extensions)}" if extensions else ""))
    first, blob_at, class_at = (sum(c[k] for c in counts[:rank]) for k in range(3))
    labelled = not root_files  # every path lies in a subdirectory: those are the classes, as a scan labels them
    labels = np.repeat(class_at + np.arange(len(per_class)), per_class) if labelled else None
    head, sections, length = header(src.root, n, blob_len, labelled, True, total)
    tmp = agree(comm, lambda: _create(out, head, length), lambda text: _failed(0, text))
    offsets = blob_at + np.concatenate([[0], np.cumsum([len(e) for e in encoded], dtype=np.int64)])
    columns = {"offsets": offsets if rank == size - 1 else offsets[:-1], "sizes": sizes,
               "labels": labels, "mtimes": np.array([m for _, _, m in entries], np.int64)}

    def write():
        with open(tmp, "r+b") as fh:
            for name, column in columns.items():
                if column is not None and len(column):
                    fh.seek(sections[name] + 8 * first)
                    np.ascontiguousarray(column, dtype="<i8").tofile(fh)
            fh.seek(sections["blob"] + blob_at)
            fh.write(b"".join(encoded))

    try:
        everyone(comm, write, _failed)
    except BaseException:
        if rank == 0 and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    agree(comm, lambda: os.replace(tmp, out), lambda text: _failed(0, text))
    return n, total


def _create(out, head, length):
    """Creates the catalog's temporary file at its full length, header written: the parts go in place."""
    tmp = f"{out}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(head)
        fh.truncate(length)
    return tmp
