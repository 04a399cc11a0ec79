"""Where samples come from: a ``Source`` lists its items and fetches one at a time.

A source is what prefetchers read and what the catalog lists. Each one:

- ``root``: a string naming the dataset root (a directory, or a bucket
  prefix ``s3://bucket/prefix``); ``scheme``: its registry name;
- ``read_manifest(manifest)`` and ``scan(extensions)`` return a ``Listing``
  (relative paths, sizes, labels, modification times), run once on rank 0;
- ``fetch(rel, size, mtime_ns, dst_root)`` puts one item into node-local
  storage through ``publish`` (temporary name, size check, rename) and
  returns the bytes written (0 for an empty item), None when a matching
  copy was already there;
- ``local_root``: a directory readers can open items in when staging is
  off, or None when the items are not files; then ``open_direct(rel)``, a
  context manager, yields a path holding the item for the time of a read;
- ``concurrency`` (optional, default 1): fetches a prefetcher runs at once;
- ``warm()`` (optional): makes its per-process state (a client) ahead of
  the first fetch; called before workers fork and in each at start;
- ``describe(rel)``: the item's full name for messages.

Sources are picklable, so prefetchers started with any method receive them.
They are chosen by the scheme of ``dataset.source`` from a small registry.
"""

from ..errors import ConfigError
from .deadline import Deadline, SourceStalled, parallel, reading, within
from .listing import Listing, check_relpath
from .posix import PosixSource
from .publish import SourceChanged, TornCopy, already_published, publish
from .s3 import S3Source

SOURCES = {"file": PosixSource, "s3": S3Source}


def open_source(location, dataset=None, verify="size", most_in_flight=None):
    """The source for ``dataset.source``: ``scheme://...``, or a plain path (a file tree).

    Args:
        location: ``dataset.source``.
        dataset: The ``DatasetConfig`` whose other keys a source may use
            (files in flight, an object store's endpoint, retries), or None.
        verify: ``staging.verify``, how a file tree's copies are checked. An
            object store's GET is never torn (an object is replaced whole);
            its copies are checked by Content-Length and MD5 ETag, whatever this says.
        most_in_flight: With ``dataset.requests_in_flight: auto`` tuned while
            running, the most files a prefetcher may keep in flight (its
            threads); None: ``auto`` is the source's own default.

    Raises:
        ConfigError: For a scheme no source serves, listing those that do.
    """
    scheme, sep, rest = location.partition("://")
    in_flight = dataset.requests_in_flight if dataset is not None else None
    if in_flight == "auto":
        in_flight = most_in_flight
    if not sep:
        return PosixSource(location, verify, in_flight or 1)
    if scheme not in SOURCES:
        raise ConfigError(f"dataset.source {location!r}: no source for scheme {scheme!r}; "
                          f"known: {', '.join(f'{s}://' for s in sorted(SOURCES))} or a plain path")
    if scheme == "file":
        return PosixSource(rest, verify, in_flight or 1)
    return SOURCES[scheme].from_config(location, dataset, in_flight)


__all__ = ["Deadline", "Listing", "PosixSource", "S3Source", "SOURCES", "SourceChanged", "SourceStalled", "TornCopy",
           "already_published", "check_relpath", "open_source", "parallel", "publish", "reading", "within"]
