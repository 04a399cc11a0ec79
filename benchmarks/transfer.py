"""Time per sample from a reader process to the rank: stager's ring against pickling through the pipe.

A forked sender sends ``--batches`` minibatches of 32 channel-first float32
images (3x256x256, 786 KB each, made by a transpose as a loader does, so not
contiguous) and the receiver takes them; the figure is the receiver's wall
time per sample, the sender's copy included (both run at once, as a reader
and the coordinator do). Ways, measured side by side in one run:

- ``ring``: ``wire.Ring`` (what readers use): one strided copy into shared
  memory, which the rank uses in place;
- ``ring-contiguous``: the same for a contiguous array (what the ``image``
  loader returns in ``chw`` layout);
- ``pickle``: ``Connection.send`` of the same minibatch (the array is
  pickled in band because it is not contiguous);
- ``pickle-contiguous``: the same after ``numpy.ascontiguousarray`` in the
  sender (what a user had to know to do before).

    .venv/bin/python benchmarks/transfer.py --batches 40 --repeat 3
"""

import argparse
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stager import wire  # noqa: E402

BATCH = 32


def _minibatch(contiguous):
    hwc = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    # Distinct arrays, as a loader makes: pickle would send a repeated one once.
    chws = [hwc.astype(np.float32).transpose(2, 0, 1) for _ in range(BATCH)]
    return [((np.ascontiguousarray(chw) if contiguous else chw), i) for i, chw in enumerate(chws)]


def _send(way, conn, ring, batches):
    samples = _minibatch(way.endswith("-contiguous"))
    for _ in range(batches):
        if way.startswith("ring"):
            ring.send(conn, samples)
        else:
            conn.send(samples)
    conn.close()


def measure(way, batches):
    """Seconds per sample for ``way``."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    wire.widen(sender)
    ring = wire.Ring()
    proc = ctx.Process(target=_send, args=(way, sender, ring, batches))
    begin = time.perf_counter()
    proc.start()
    sender.close()
    for _ in range(batches):
        got = ring.recv(receiver) if way.startswith("ring") else receiver.recv()
        assert len(got) == BATCH
    elapsed = time.perf_counter() - begin
    proc.join()
    receiver.close()
    ring.close()
    return elapsed / (batches * BATCH)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ways = ("ring", "ring-contiguous", "pickle", "pickle-contiguous")
    best = {way: float("inf") for way in ways}
    for _ in range(args.repeat):  # interleaved, so a busy moment hits every way alike
        for way in ways:
            best[way] = min(best[way], measure(way, args.batches))
    print(f"{'way':20s} {'ms per 786 KB sample':>21s} {'x ring':>7s}  (best of {args.repeat})")
    for way in ways:
        print(f"{way:20s} {best[way] * 1e3:21.3f} {best[way] / best['ring']:7.2f}")


if __name__ == "__main__":
    main()
