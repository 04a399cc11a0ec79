"""Time per sample from a reader process to the rank: stager's ring against pickling through the pipe.

A forked sender sends ``--batches`` minibatches of 32 channel-first float32
images (3x256x256, 786 KB each, made by a transpose as a loader does, so not
contiguous) and the receiver takes them; the figures are the receiver's wall time per
sample, the sender's copy included (both run at once, as a reader and the
coordinator do), and the CPU time both spent per sample, which a busy
machine inflates less. Ways, measured side by side in one run:

- ``ring``: ``wire.Ring`` (what readers use): one strided copy into shared
  memory, which the rank uses in place;
- ``ring-contiguous``: the same for a contiguous array (what the ``image``
  loader returns in ``chw`` layout);
- ``pickle``: ``Connection.send`` of the same minibatch (the array is
  pickled in band because it is not contiguous);
- ``pickle-contiguous``: the same after ``numpy.ascontiguousarray`` in the
  sender (what a user had to know to do before).

    .venv/bin/python benchmarks/loaders/transfer.py --batches 40 --repeat 3
"""

import argparse
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.engine import wire  # noqa: E402

BATCH = 32


def _minibatch(contiguous):
    hwc = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    # Distinct arrays, as a loader makes: pickle would send a repeated one once.
    chws = [hwc.astype(np.float32).transpose(2, 0, 1) for _ in range(BATCH)]
    return [((np.ascontiguousarray(chw) if contiguous else chw), i) for i, chw in enumerate(chws)]


def _send(way, conn, ring, batches):
    samples = _minibatch(way.endswith("-contiguous"))
    for i in range(batches + 1):  # the first one warms up, untimed
        if i == 1:
            cpu = time.process_time()
        if way.startswith("ring"):
            ring.send(conn, samples)
        else:
            conn.send(samples)
    conn.send(time.process_time() - cpu)
    conn.close()


def measure(way, batches):
    """``(wall, cpu)`` seconds per sample for ``way``."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    wire.widen(sender)
    ring = wire.Ring()
    proc = ctx.Process(target=_send, args=(way, sender, ring, batches))
    proc.start()
    sender.close()
    for i in range(batches + 1):
        if i == 1:
            begin, cpu = time.perf_counter(), time.process_time()
        got = ring.recv(receiver) if way.startswith("ring") else receiver.recv()
        assert len(got) == BATCH
        del got  # as a training step drops its batch
    elapsed = time.perf_counter() - begin
    cpu = time.process_time() - cpu + receiver.recv()
    proc.join()
    receiver.close()
    ring.close()
    return elapsed / (batches * BATCH), cpu / (batches * BATCH)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ways = ("ring", "ring-contiguous", "pickle", "pickle-contiguous")
    best = {way: (float("inf"), float("inf")) for way in ways}
    for _ in range(args.repeat):  # interleaved, so a busy moment hits every way alike
        for way in ways:
            wall, cpu = measure(way, args.batches)
            best[way] = (min(best[way][0], wall), min(best[way][1], cpu))
    print(f"per 786 KB sample, best of {args.repeat}")
    print(f"{'way':20s} {'wall ms':>8s} {'x ring':>7s} {'CPU ms':>7s} {'x ring':>7s}")
    for way in ways:
        (wall, cpu), (ring_wall, ring_cpu) = best[way], best["ring"]
        print(f"{way:20s} {wall * 1e3:8.3f} {wall / ring_wall:7.2f} {cpu * 1e3:7.3f} {cpu / ring_cpu:7.2f}")


if __name__ == "__main__":
    main()
