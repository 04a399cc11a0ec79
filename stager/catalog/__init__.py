"""The list of samples, in one direction: a source's listing -> ``Catalog`` -> catalog file -> every rank.

``table`` holds the ``Catalog`` (paths, sizes, labels, modification times
as a few arrays), built from a source's ``Listing``; ``mapped`` writes it as
one binary file and maps it read-only (``MappedCatalog``); ``build`` is
``stager catalog build``, listing a source in parallel over ranks into that
file; ``broadcast`` gives every rank the same catalog (``agreed_catalog``:
rank 0 lists or reads, the others receive, or each maps the file).

``shards`` is the catalog of samples packed in containers (tar shards, HDF5
files): the containers' ``Catalog`` plus where each sample lies in them.

May import: ``errors``, ``formats``, ``sources``, ``world``.
"""

from .broadcast import agreed_catalog, broadcast_catalog
from .build import build_catalog
from .mapped import MappedCatalog, catalog_entries, header, read_header, write_catalog
from .shards import ShardCatalog, load_catalog
from .table import Catalog

__all__ = ["Catalog", "MappedCatalog", "ShardCatalog", "load_catalog", "agreed_catalog", "broadcast_catalog", "build_catalog", "catalog_entries",
           "header", "read_header", "write_catalog"]
