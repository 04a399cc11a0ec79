"""What moving one decoded minibatch costs, each way a shared group could move it.

A minibatch of 32 float32 CHW images of 256x256 (25 MB), the median of
``--repeat`` times each:

- ``ring``: a reader's reply through its ``wire.Ring`` (a reused slot), the
  way every decoded minibatch reaches its rank;
- ``put, fresh file``: ``batchfile.put`` into a new file in ``/dev/shm``
  (every page new to the kernel);
- ``put, reused file``: the same into a file written before (what the
  group's shelf does once files are reused);
- ``mapped write, fresh file``: copying into a new file through a mapping
  (a page fault per 4 KiB on top);
- ``take (map)``: ``batchfile.read``, what a rank taking the minibatch
  from the shelf pays: a copy-on-write mapping, the arrays views of it;
- ``take by copying``: the same bytes read (``preadv``) into memory of the
  rank's own, written before (the way ranks took minibatches until the
  mapping, into a slot of their ring);
- each of the last two ``+ consumer reads it``: then summing every array,
  as a training step that touches every pixel (the mapping's page faults
  fall here).

    .venv/bin/python benchmarks/studies/shelf_copy.py
"""

import argparse
import mmap
import multiprocessing
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.engine import batchfile  # noqa: E402
from stager.engine.wire import Ring  # noqa: E402


def consume(samples):
    return sum(float(array.sum()) for array, _ in samples)


def timed(fn, repeat):
    times = []
    for i in range(repeat):
        begin = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - begin)
    return 1000 * float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    samples = [(np.random.default_rng(i).random((3, 256, 256), dtype=np.float32), i) for i in range(32)]
    nbytes = sum(s[0].nbytes for s in samples)
    shm = tempfile.mkdtemp(prefix="stager-shelf-copy-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ring = Ring()
    sender, receiver = multiprocessing.Pipe()
    try:
        def ring_trip(i):
            ring.send(sender, samples)
            ring.recv(receiver)

        def mapped(i):
            path = os.path.join(shm, f"m{i}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, nbytes)
            with mmap.mmap(fd, nbytes) as mm:
                view, at = np.frombuffer(mm, np.uint8), 0
                for array, _ in samples:
                    view[at:at + array.nbytes] = array.view(np.uint8).ravel()
                    at += array.nbytes
                del view
            os.close(fd)

        reused = os.path.join(shm, "reused")
        batchfile.put(reused, samples)
        own = np.empty(os.path.getsize(reused), np.uint8)

        def copied(i):
            fd = os.open(reused, os.O_RDONLY)
            os.preadv(fd, [memoryview(own)], 0)
            os.close(fd)
            return [(own[4096 + k * array.nbytes:4096 + (k + 1) * array.nbytes].view(np.float32), n)
                    for k, (array, n) in enumerate(samples)]

        rows = [("ring (reused slot)", timed(ring_trip, args.repeat)),
                ("put, fresh file", timed(lambda i: batchfile.put(os.path.join(shm, f"f{i}"), samples), args.repeat)),
                ("put, reused file", timed(lambda i: batchfile.put(reused, samples), args.repeat)),
                ("mapped write, fresh file", timed(mapped, args.repeat)),
                ("take (map)", timed(lambda i: batchfile.read(reused, lambda: None), args.repeat)),
                ("take (map) + consumer reads it",
                 timed(lambda i: consume(batchfile.read(reused, lambda: None)[0]), args.repeat)),
                ("take by copying", timed(copied, args.repeat)),
                ("take by copying + consumer reads it", timed(lambda i: consume(copied(i)), args.repeat))]
    finally:
        ring.close()
        for name in os.listdir(shm):
            os.unlink(os.path.join(shm, name))
        os.rmdir(shm)
    print(f"one minibatch of {nbytes / 1e6:.1f} MB, median of {args.repeat}:")
    print("| way | ms |\n|---|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
