"""What listing a source yields, and the rules every listed path obeys."""

import os
import posixpath
from array import array
from typing import List, NamedTuple, Optional

import numpy as np

from ..errors import CatalogError


class Listing(NamedTuple):
    """A source's samples: relative paths, sizes, labels (or None), modification times (or None)."""

    paths: List[str]
    sizes: List[int]
    labels: Optional[List[int]]
    mtimes: Optional[List[int]]


def is_manifest_file(rel):
    """Whether a scan leaves ``rel`` out as the tree's own manifest: ``manifest.*`` at the root.

    A tree made by ``stager make-dataset`` (or laid out like one) holds its
    manifest at the root; scanned with ``dataset.manifest: null``, that file
    is a listing, not a sample.
    """
    return "/" not in rel and rel.startswith("manifest.")


def check_relpath(rel, where):
    """Rejects a path that could point outside the dataset root.

    Args:
        rel: The path as written in the listing.
        where: Description of its origin for the error, e.g. ``"manifest.tsv:12"``.

    Returns:
        The normalised relative path.

    Raises:
        CatalogError: If the path is empty, absolute, climbs with ``..`` or
            holds a NUL byte (no file system path can).
    """
    if not rel:
        raise CatalogError(f"{where}: empty path")
    if "\0" in rel:
        raise CatalogError(f"{where}: path {rel!r} holds a NUL byte, which no file name can")
    if rel.startswith("/") or os.path.isabs(rel):
        raise CatalogError(f"{where}: absolute path {rel!r} not allowed; paths are relative to the dataset root")
    if ".." in rel.split("/"):
        raise CatalogError(f"{where}: path {rel!r} contains '..'; paths must stay inside the dataset root")
    return posixpath.normpath(rel)


def first_duplicate(keys):
    """``(i, j)``, ``i < j``, of the equal keys whose later one comes first; None if all differ.

    Sorting 64-bit hashes keeps this to a few arrays for millions of keys,
    where a dictionary of the keys would hold an object per entry.
    """
    hashes = np.fromiter((hash(k) for k in keys), dtype=np.int64, count=len(keys))
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    best = None
    for n in same:  # runs of equal hashes: compare the keys themselves (hashes may collide)
        j = int(order[n + 1])
        for m in range(n, -1, -1):
            i = int(order[m])
            if hashes[i] != hashes[j]:
                break
            if keys[i] == keys[j] and (best is None or j < best[1]):
                best = (i, j)
    return best


def directory_labels(paths):
    """Labels from first-level directories (the ImageNet layout), or None.

    When every sample lies in a first-level subdirectory, those directories
    are the classes: a sample's label is its directory's index in sorted order.
    """
    if not all("/" in p for p in paths):
        return None
    classes = sorted({p.split("/", 1)[0] for p in paths})
    index = {c: i for i, c in enumerate(classes)}
    return [index[p.split("/", 1)[0]] for p in paths]


def manifest_entries(lines, name):
    """Parses a manifest's lines: one relative path per line, optional label after a tab.

    Blank lines and lines starting with ``#`` are skipped. Entries come one
    line at a time, so a caller checking each one reports the first bad line.
    A path listed twice, also as an alias (``./a``, ``a//b``), is refused
    once all lines are read: a sample is listed once (and copied once).

    Args:
        lines: The manifest's lines.
        name: The manifest's name, for errors (``name:line``).

    Yields:
        ``(where, rel, label)``; ``label`` is None on every line or on none.

    Raises:
        CatalogError: Naming the manifest line at fault (both lines of a
            duplicate), or an empty manifest.
    """
    labelled = None
    rels, numbers = [], array("q")
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{name}:{number}"
        fields = line.split("\t")
        if len(fields) > 2:
            raise CatalogError(f"{where}: expected 'path' or 'path<TAB>label', got {len(fields)} fields")
        rel = check_relpath(fields[0], where)
        has_label = len(fields) == 2
        try:
            label = int(fields[1]) if has_label else None
        except ValueError:
            raise CatalogError(f"{where}: label {fields[1]!r} is not an integer") from None
        yield where, rel, label  # the caller's checks of this sample come first
        rels.append(rel)
        numbers.append(number)
        if labelled is None:
            labelled = has_label
        elif labelled != has_label:
            raise CatalogError(f"{where}: every line needs a label or none does; this line "
                               f"{'has' if has_label else 'has no'} label, earlier lines differ")
    if labelled is None:
        raise CatalogError(f"manifest {name} lists no samples")
    twice = first_duplicate(rels)
    if twice is not None:
        i, j = twice
        raise CatalogError(f"{name}:{numbers[j]}: {rels[j]!r} is already listed at line {numbers[i]} (paths are "
                           "compared after removing './' and '//'); list each sample once")
