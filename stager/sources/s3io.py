"""Talking to an S3-compatible object store: one client per process, checked and retried GETs.

``boto3`` is imported only here and only when an ``s3://`` source is used, so
file-tree users need not install it. A client (and its connection pool) is
made once per process: a prefetcher forked from the rank that listed the
bucket must not share that rank's sockets, so the client is keyed by the
process id.
"""

import errno
import hashlib
import os
import random
import threading
import time
from datetime import timezone

from .publish import SourceChanged

# Codes an object store answers when it is overloaded or briefly unable to
# serve; AWS asks clients to back off and retry them.
RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
               "InternalError", "ServiceUnavailable", "503", "500", "502", "504"}
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 2.0
CHUNK = 1 << 20


class ObjectError(OSError):
    """An object store request failed for good: names the object (bucket and key) and why."""


def install_hint():
    """The message for a missing boto3."""
    return "s3:// sources need boto3: pip install boto3 (or the stager[s3] extra)"


class Client:
    """A process's S3 client with a connection pool for ``pool`` requests in flight.

    Args:
        endpoint_url: The store's URL, or None for AWS.
        pool: Connections kept open (one per request in flight).
        timeout_s: Connect and read timeout of one request.
        retries: Retries of a throttled or timed-out request.
    """

    def __init__(self, endpoint_url, pool, timeout_s, retries):
        self.endpoint_url, self.pool, self.timeout_s, self.retries = endpoint_url, pool, timeout_s, retries
        self._client, self._pid = None, None
        # Kept across fork: a child makes its client from the parent's session,
        # whose loaded service model saves it a tenth of a second or more.
        self._session = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"endpoint_url": self.endpoint_url, "pool": self.pool, "timeout_s": self.timeout_s,
                "retries": self.retries}

    def __setstate__(self, state):
        self.__init__(**state)

    @property
    def s3(self):
        """The boto3 client of this process, made on first use."""
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                try:
                    import boto3
                    from botocore.config import Config
                except ImportError:
                    raise ImportError(install_hint()) from None
                # Retries are ours (``get``): botocore's would not cover a body
                # cut short mid-stream, and ours name the object when they give up.
                config = Config(max_pool_connections=self.pool, connect_timeout=self.timeout_s,
                                read_timeout=self.timeout_s, retries={"total_max_attempts": 1})
                if self._session is None:
                    self._session = boto3.session.Session()
                self._client = self._session.client("s3", endpoint_url=self.endpoint_url, config=config)
                self._pid = os.getpid()
            return self._client

    def call(self, name, bucket, what, **kwargs):
        """Calls ``s3.<name>(Bucket=bucket, **kwargs)``, retried like ``get``; ``what`` names the object."""
        return self._retrying(bucket, what, lambda: getattr(self.s3, name)(Bucket=bucket, **kwargs))

    def get(self, bucket, key, fd, mtime_ns=None):
        """Writes object ``key`` into ``fd`` (from offset 0) and checks it.

        The body's length must equal the response's Content-Length and, when
        the ETag is an MD5 (single-part uploads), its digest; a short or
        corrupt body is fetched again. ``mtime_ns``, when given, must equal the
        object's Last-Modified (the catalog's), else the object was replaced.

        Returns:
            Bytes written.

        Raises:
            SourceChanged: If the object was replaced since the catalog was made.
            ObjectError: If the object is missing or denied, or every retry failed.
        """
        def attempt():
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            response = self.s3.get_object(Bucket=bucket, Key=key)
            modified = to_ns(response["LastModified"])
            if mtime_ns is not None and modified != mtime_ns:
                raise SourceChanged(errno.EIO, f"s3://{bucket}/{key} was replaced since the catalog was made "
                                               f"(Last-Modified {response['LastModified']})")
            return _write_checked(response, fd, f"s3://{bucket}/{key}")

        return self._retrying(bucket, key, attempt)

    def _retrying(self, bucket, key, attempt):
        from botocore.exceptions import BotoCoreError, ClientError

        name = f"s3://{bucket}/{key}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")
        last = None
        for n in range(self.retries + 1):
            if n:
                time.sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (n - 1)) * random.uniform(0.5, 1.0))
            try:
                return attempt()
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = str(error.get("Code", ""))
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket") or status == 404:
                    raise ObjectError(errno.ENOENT, f"{name}: no such object (404 {code})") from None
                if code in ("AccessDenied", "403", "Forbidden") or status == 403:
                    raise ObjectError(errno.EACCES, f"{name}: access denied (403 {code}); check the "
                                                    "credentials and the bucket's policy") from None
                if code not in RETRY_CODES and not (status and status >= 500):
                    raise ObjectError(errno.EIO, f"{name}: {status} {code}: {error.get('Message', '')}") from None
                last = f"{status} {code}"
            except (BotoCoreError, _Corrupt) as exc:  # connection refused or cut, timeouts, short bodies
                last = f"{type(exc).__name__}: {exc}"
        raise ObjectError(errno.EIO, f"{name}: gave up after {self.retries + 1} attempts; last: {last}")


class _Corrupt(Exception):
    """A body that does not match its Content-Length or MD5 ETag (retried)."""


def _write_checked(response, fd, name):
    body, expected = response["Body"], response["ContentLength"]
    etag = response.get("ETag", "").strip('"')
    digest = hashlib.md5(usedforsecurity=False) if len(etag) == 32 and "-" not in etag else None
    total = 0
    try:
        while True:
            chunk = body.read(CHUNK)
            if not chunk:
                break
            if digest is not None:
                digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            total += len(chunk)
    finally:
        body.close()
    if total != expected:
        raise _Corrupt(f"{name}: received {total} bytes, Content-Length says {expected}")
    if digest is not None and digest.hexdigest() != etag:
        raise _Corrupt(f"{name}: MD5 {digest.hexdigest()} differs from the ETag {etag}")
    return total


def to_ns(stamp):
    """A Last-Modified datetime as integer nanoseconds since the epoch."""
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000
