"""Every rank's catalog: listed once on rank 0 and broadcast, or mapped from a catalog file.

The last step of the catalog's one direction (source listing -> ``Catalog``
-> mapped file -> this): the pipeline, the job runner and the front ends
call ``agreed_catalog`` and nothing below it.
"""

import logging

import numpy as np

from .mapped import MappedCatalog, catalog_entries
from .shards import ShardCatalog, load_catalog
from .table import Catalog
from ..errors import CatalogError
from ..sources import open_source
from ..sources.deadline import within
from ..world import agree, everyone

log = logging.getLogger(__name__)


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
    built = []

    def made():
        built.append(build())
        return built[0] if isinstance(built[0], ShardCatalog) else None

    def failed(text):
        return CatalogError(f"rank {root} could not build the catalog: {text}")

    shards = agree(comm, made, failed, root)
    if shards is not None:
        return shards  # a sharded dataset's catalog goes pickled: its layout is a few arrays too
    catalog = None

    def header():
        nonlocal catalog
        catalog = built[0]
        return (catalog.root, len(catalog), len(catalog._blob), catalog.labels is not None,
                catalog.mtimes is not None)

    root_dir, n, blob_len, labelled, timed = agree(comm, header, failed, root)
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


def agreed_catalog(comm, dataset, stall_timeout_s=300.0):
    """Every rank's catalog for a ``DatasetConfig``: broadcast, or mapped from its file.

    Without ``dataset.catalog``, rank 0 lists the source and broadcasts the
    catalog. A catalog file of at most ``dataset.broadcast_max`` entries is
    read by rank 0 and broadcast too; a larger one is memory-mapped by every
    rank, so no rank receives or holds all of it. Rank 0 logs which.
    Samples are read under ``dataset.source`` when it is set, else under the
    root the file was built from. Every read of the source or the catalog
    file has ``stall_timeout_s`` (``staging.stall_timeout_s``) to return
    (``sources.deadline``): a rank stuck on a hung file system fails, and
    with it every rank waiting for its result.
    """
    rank = 0 if comm is None else comm.Get_rank()
    if not dataset.catalog:
        catalog = broadcast_catalog(comm, lambda: within(stall_timeout_s, load_catalog, dataset))
        if rank == 0 and len(catalog) > dataset.broadcast_max:
            log.info("stager: catalog of %d entries listed and broadcast whole; `stager catalog build` and "
                     "dataset.catalog would let each node map only what it reads", len(catalog))
        return catalog
    root = open_source(dataset.source).root if dataset.source else None
    entries = agree(comm, lambda: within(stall_timeout_s, catalog_entries, dataset.catalog),
                    lambda text: CatalogError(f"rank 0 could not read the catalog file: {text}"))
    if entries <= dataset.broadcast_max:
        if rank == 0:
            log.info("stager: catalog file %s: %d entries (dataset.broadcast_max %d): read on rank 0 and "
                     "broadcast", dataset.catalog, entries, dataset.broadcast_max)
        return broadcast_catalog(comm, lambda: within(stall_timeout_s, MappedCatalog, dataset.catalog, root))
    if rank == 0:
        log.info("stager: catalog file %s: %d entries (over dataset.broadcast_max %d): memory-mapped on "
                 "every rank", dataset.catalog, entries, dataset.broadcast_max)
    return everyone(comm, lambda: within(stall_timeout_s, MappedCatalog, dataset.catalog, root),
                    lambda r, text: CatalogError(f"rank {r} could not map the catalog file: {text}"))
