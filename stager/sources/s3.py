"""The object store source: a prefix of an S3-compatible bucket (AWS, Ceph RGW, MinIO, VAST, ...).

An object is a sample; its key below the prefix is the sample's relative
path, so a bucket laid out like a file tree (``prefix/<class>/<name>``) gets
the same labels as the tree would. Rank 0 lists the prefix once (paginated)
or reads a manifest object; prefetchers then GET each object into node-local
storage through ``publish`` (temporary name, size check, rename), with
``requests_in_flight`` GETs in flight per prefetcher sharing one connection
pool, since an object store answers each request after a round trip that
one stream at a time would wait out. With staging off, readers GET each
object into an anonymous memory file and decode it from there.
"""

import contextlib
import os

from ..errors import CatalogError, ConfigError
from .listing import Listing, check_relpath, directory_labels, is_manifest_file, manifest_entries
from .publish import already_published, publish
from .s3io import Client, ObjectError, to_ns


def split_location(location):
    """``s3://bucket/prefix`` -> ``(bucket, prefix)``, the prefix empty or ending in ``/``."""
    rest = location[len("s3://"):] if location.startswith("s3://") else None
    bucket, _, prefix = (rest or "").partition("/")
    if rest is None or len(bucket) < 3:
        raise ConfigError(f"dataset.source {location!r}: expected s3://bucket[/prefix] (bucket names have at "
                          "least 3 characters)")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


class S3Source:
    """A bucket prefix, read with GET requests.

    Picklable (location and client settings); each process makes its own
    client and connection pool on first use.

    Args:
        location: ``s3://bucket/prefix``.
        endpoint_url: The store's URL, or None for AWS.
        requests_in_flight: GETs a prefetcher keeps in flight (and its pool's size).
        retries: Retries of a throttled or timed-out request.
        request_timeout_s: Connect and read timeout of one request.
        page_size: Keys per listing page (None: the store's default, 1,000 on AWS).
    """

    scheme = "s3"
    local_root = None  # objects are not files: readers GET them (``open_direct``)
    REQUESTS_IN_FLIGHT = 16  # ``dataset.requests_in_flight`` unset: a store answers each GET after its latency

    def __init__(self, location, endpoint_url=None, requests_in_flight=16, retries=5, request_timeout_s=10.0,
                 page_size=None):
        self.bucket, self.prefix = split_location(location)
        self.root = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.concurrency = requests_in_flight
        self.page_size = page_size
        self.client = Client(endpoint_url, requests_in_flight, request_timeout_s, retries)

    @classmethod
    def from_config(cls, location, dataset, requests_in_flight=None):
        """The source for ``location`` with the object store keys of a ``DatasetConfig`` (or None);
        ``requests_in_flight``: ``dataset.requests_in_flight`` resolved (None: ``REQUESTS_IN_FLIGHT``)."""
        if dataset is None:
            return cls(location)
        return cls(location, dataset.endpoint_url, requests_in_flight or cls.REQUESTS_IN_FLIGHT,
                   dataset.retries, dataset.request_timeout_s)

    def warm(self):
        """Makes this process's client now, so that the first GETs do not wait for it.

        Called in the parent before prefetchers or readers start (they
        inherit its session when forked) and in each of them at start.
        """
        self.client.s3

    def describe(self, rel):
        """The object's full name, for messages."""
        return f"s3://{self.bucket}/{self.prefix}{rel}"

    def fetch(self, rel, size, mtime_ns, dst_root):
        """GETs ``prefix/rel`` into ``dst_root/rel``, checked and atomic (``publish``).

        The copy is given the object's Last-Modified time, so a copy kept by
        an earlier run (``staging.keep``) is reused only while the object is
        unchanged.

        Returns:
            Bytes written (0 for an empty object); None when a matching copy was already there.

        Raises:
            SourceChanged: If the object's size or Last-Modified differs from
                the catalog's.
            ObjectError: Missing (404) or denied (403) object, or retries
                exhausted; names the bucket and key.
            OSError: From the local file system (ENOSPC, ...).
        """
        if already_published(dst_root, rel, size, mtime_ns):
            return None
        key = self.prefix + rel
        times = None if mtime_ns is None else (mtime_ns, mtime_ns)
        return publish(dst_root, rel, size, lambda fd: self.client.get(self.bucket, key, fd, mtime_ns), times)

    @contextlib.contextmanager
    def open_direct(self, rel):
        """GETs ``prefix/rel`` into an anonymous memory file; yields a path loaders can open.

        Used when staging is off: nothing is written to disk, and the memory
        is freed when the block ends, whatever happens.
        """
        fd = os.memfd_create("stager-direct", os.MFD_CLOEXEC)
        try:
            self.client.get(self.bucket, self.prefix + rel, fd)
            yield f"/proc/{os.getpid()}/fd/{fd}"
        finally:
            os.close(fd)

    def _objects(self):
        """Every object below the prefix: ``{rel: (size, mtime_ns)}``, listed once, page by page."""
        pages = {"PageSize": self.page_size} if self.page_size else {}
        found = {}
        try:
            paginator = self.client.s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix, PaginationConfig=pages):
                for item in page.get("Contents", ()):
                    rel = item["Key"][len(self.prefix):]
                    if rel and not rel.endswith("/"):  # "directory" markers are not samples
                        found[rel] = (item["Size"], to_ns(item["LastModified"]))
        except Exception as exc:  # botocore's errors: name the bucket and the store
            raise CatalogError(f"cannot list {self.root}"
                               + (f" at {self.client.endpoint_url}" if self.client.endpoint_url else "")
                               + f": {type(exc).__name__}: {exc}") from None
        return found

    def scan(self, extensions=()):
        """Lists the prefix once (paginated).

        Keys with a hidden component (``.name``) are skipped, as is a manifest
        at the prefix's top (``manifest.*``), and the order is
        that of a scan of the same tree on a file system, so a bucket and a
        file tree holding the same samples give the same catalog.

        Args:
            extensions: Keep only keys ending in one of these; empty keeps all.

        Returns:
            A ``Listing``; labels from first-level "directories" as for file trees.

        Raises:
            CatalogError: If the listing fails, holds no samples or a key is unsafe.
        """
        found = self._objects()
        paths = sorted((rel for rel in found
                        if not any(part.startswith(".") for part in rel.split("/")) and not is_manifest_file(rel)
                        and (not extensions or rel.endswith(tuple(extensions)))),
                       key=lambda rel: rel.split("/"))
        if not paths:
            raise CatalogError(f"{self.root} holds no samples"
                               + (f" with extensions {list(extensions)}" if extensions else ""))
        for rel in paths:
            check_relpath(rel, f"{self.root}: key")
        return Listing(paths, [found[p][0] for p in paths], directory_labels(paths), [found[p][1] for p in paths])

    def read_manifest(self, manifest):
        """Reads a manifest object (``path[<TAB>label]`` per line), then lists the prefix once for sizes.

        Args:
            manifest: The manifest's key below the prefix, or a full ``s3://`` name.

        Returns:
            A ``Listing`` in the manifest's order.

        Raises:
            CatalogError: Naming the manifest line at fault (e.g. a listed
                object that does not exist).
        """
        bucket, key = ((split_location(manifest)[0], manifest.split("/", 3)[3]) if manifest.startswith("s3://")
                       else (self.bucket, self.prefix + manifest))
        name = f"s3://{bucket}/{key}"
        try:
            text = self.client.call("get_object", bucket, key, Key=key)["Body"].read().decode("utf-8")
        except (ObjectError, UnicodeDecodeError) as exc:
            raise CatalogError(f"cannot read manifest {name}: {exc}") from None
        found = self._objects()
        paths, sizes, labels, mtimes = [], [], [], []
        for where, rel, label in manifest_entries(text.splitlines(), name):
            if rel not in found:
                raise CatalogError(f"{where}: no object {self.describe(rel)}")
            paths.append(rel)
            sizes.append(found[rel][0])
            mtimes.append(found[rel][1])
            labels.append(label)
        return Listing(paths, sizes, None if labels[0] is None else labels, mtimes)
