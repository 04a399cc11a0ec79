"""Where ``peers_side.py``'s methods read from: the emulated file system, or an object store behind a slow link.

Each source says where the methods find the data (``root``), what their
process needs in its environment, and counts around one method's run: the
CPU of the processes serving the data, the bytes they moved, and the opens
of the source's files where a file system can count them (inotify on the
emulator's backing tree). An object store counts no opens: its methods
fetch whole shards or objects, and the bytes say how often.
"""

import contextlib
import os

BUCKET = "peers"


def rchar(pid):
    """Bytes process ``pid`` has read so far with read(2) and its kin (not a socket's recv)."""
    with open(f"/proc/{pid}/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar")).split()[1])


def loopback_bytes():
    """Bytes received on the loopback interface so far, by every process of this network namespace."""
    with open("/proc/net/dev") as fh:
        return int(next(line for line in fh if line.strip().startswith("lo:")).split(":", 1)[1].split()[0])


class FileTree:
    """The FUSE emulator's mount of ``backing``: its daemon serves every byte."""

    kind = "file system"

    def __init__(self, mounted, backing, daemon):
        self.root, self.backing, self.pids = mounted, backing, [daemon]

    def env(self):
        return {}

    def moved(self):
        """Bytes the emulator has read from the backing tree so far."""
        return rchar(self.pids[0])

    def counting(self):
        from helpers.opens import Opens  # tests/ is on the path (peers_side.py)

        return Opens(self.backing)


class ObjectBucket:
    """``s3://peers`` on moto's server, every request through the latency proxy (``latency_ms`` each).

    Use as a ``with`` block; ``upload(tree, prefix)`` puts a directory's
    files in the bucket beforehand (straight to the server, not timed).
    """

    kind = "object store"
    root = f"s3://{BUCKET}"

    def __init__(self, latency_ms):
        from stager.slows3 import ObjectStore, SlowProxy
        from stager.slows3.server import CREDENTIALS

        self.credentials = CREDENTIALS
        os.environ.update(CREDENTIALS)  # boto3 signs the uploads with them
        self._stack = contextlib.ExitStack()
        self.server = self._stack.enter_context(ObjectStore())
        self.proxy = self._stack.enter_context(SlowProxy(self.server.port, latency_ms=latency_ms))
        self.pids = [self.proxy.proc.pid, self.server.proc.pid]
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.server.endpoint_url)
        self.s3.create_bucket(Bucket=BUCKET)
        self.uploaded = set()

    @property
    def endpoint_url(self):
        return self.proxy.endpoint_url

    def upload(self, tree, prefix):
        """Puts every file under ``tree`` at ``prefix/relative path`` (once per prefix)."""
        if prefix in self.uploaded:
            return
        for top, _, names in os.walk(tree):
            for name in names:
                path = os.path.join(top, name)
                self.s3.upload_file(path, BUCKET, f"{prefix}/{os.path.relpath(path, tree)}")
        self.uploaded.add(prefix)

    def env(self):
        # Streaming finds a store that is not AWS by S3_ENDPOINT_URL; the others are given it (--endpoint).
        return {**self.credentials, "S3_ENDPOINT_URL": self.endpoint_url, "DISABLE_S5CMD": "1"}

    def counting(self):
        return contextlib.nullcontext(None)

    def moved(self):
        """Bytes the store has sent so far: each crosses loopback twice (server to proxy, proxy to client)."""
        return loopback_bytes() // 2

    def close(self):
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BucketImages:
    """An ImageFolder's JPEGs as objects (``prefix/class/name.jpg``), each sample one GET with boto3.

    What a user of ``DataLoader`` writes to read images from a bucket: one
    client per worker process, made on its first sample.
    """

    def __init__(self, prefix, endpoint_url, decode):
        import boto3

        self.bucket, _, self.prefix = prefix[len("s3://"):].partition("/")
        self.endpoint_url, self.decode, self.client = endpoint_url, decode, None
        pages = boto3.client("s3", endpoint_url=endpoint_url).get_paginator("list_objects_v2")
        keys = sorted(o["Key"] for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix + "/")
                      for o in page.get("Contents", ()))
        classes = sorted({key.split("/")[-2] for key in keys})
        self.samples = [(key, classes.index(key.split("/")[-2])) for key in keys]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        import boto3

        if self.client is None:
            self.client = boto3.client("s3", endpoint_url=self.endpoint_url)
        key, label = self.samples[index]
        return self.decode(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read(), label)

    def __getstate__(self):
        return {**self.__dict__, "client": None}  # each worker makes its own
