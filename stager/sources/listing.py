"""What listing a source yields, and the rules every listed path obeys."""

import os
import posixpath
from typing import List, NamedTuple, Optional

from ..errors import CatalogError


class Listing(NamedTuple):
    """A source's samples: relative paths, sizes, labels (or None), modification times (or None)."""

    paths: List[str]
    sizes: List[int]
    labels: Optional[List[int]]
    mtimes: Optional[List[int]]


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
