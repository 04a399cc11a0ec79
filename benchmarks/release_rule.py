"""What holding read minibatches' pins until the rank is its look-ahead past them costs a bounded cache.

The node service unpins a read minibatch when its rank asks for the one
``ahead`` past it, or when room is needed (``engine/readpins.py``), so that
what a clairvoyant cache fetches again does not depend on the readers' pace.
Before, each ``Release`` unpinned at once: with readers that keep ahead of
the consumer, up to ``read_ahead - 1`` more minibatches were unpinned at a
request, and the policy had more files to choose its victims from. This
replays both extremes through the engine's own ``cache.Cache`` and policy
(fetches complete at once) and prints the files fetched again after the
first epoch:

- ``held``: the rule (what every run now fetches, one rank a node);
- ``readers ahead``: readers as far ahead as ``read_ahead`` allows at every
  request (the fewest a run could fetch under the old rule; slower readers
  fetched between the two).

    .venv/bin/python benchmarks/release_rule.py
"""

import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stager import plan  # noqa: E402
from stager.cache import Cache, check_window  # noqa: E402
from stager.config import PlanConfig  # noqa: E402

# (files, batch size, look-ahead, read-ahead, capacity as a share of the dataset)
CASES = [(100, 8, 4, 4, 0.40), (300, 6, 4, 2, 0.35), (300, 6, 4, 2, 0.15), (1_000, 16, 8, 4, 0.20),
         (10_000, 32, 16, 4, 0.25), (10_000, 32, 16, 4, 0.50), (20_000, 64, 8, 8, 0.50), (20_000, 64, 8, 8, 0.10)]
FILE_BYTES = 100_000


def refetched(sizes, spec, capacity, ahead, held):
    """Files fetched after the first epoch when ``held`` requests stay pinned behind each new one."""
    window = check_window(capacity, sizes, spec.batch_size, ahead, 1, spec.most_files())
    cache = Cache(sizes, "clairvoyant", capacity, window)
    cache.add_plan(0, spec)
    pinned, fetched = collections.deque(), 0

    def read_oldest():
        for index in cache.release(pinned.popleft()):
            cache.removed(index)

    for seq, mb in enumerate(spec.minibatches(0)):
        while len(pinned) >= held:
            read_oldest()
        cache.future.advance(0, seq)
        files = np.unique(mb.indices)
        missing, _ = cache.pin(files)
        while (victims := cache.room_for(int(sizes[missing].sum()))) is None:
            read_oldest()
        for index in victims:
            cache.removed(index)
        cache.fetching(missing)
        for index in missing.tolist():
            cache.staged(index)
        pinned.append(files)
        fetched += len(missing) if mb.epoch else 0
    return fetched


def main():
    print("| files | batch | look-ahead | read-ahead | capacity | window / capacity | held | readers ahead | more |")
    print("|---|---|---|---|---|---|---|---|---|")
    for files, batch, ahead, read_ahead, share in CASES:
        sizes = np.full(files, FILE_BYTES, dtype=np.int64)
        spec = plan.PlanSpec.from_config(files, PlanConfig(batch_size=batch, epochs=3, seed=2), 1)
        capacity = int(share * files * FILE_BYTES)
        window = ahead * batch * FILE_BYTES
        held = refetched(sizes, spec, capacity, ahead, ahead)
        early = refetched(sizes, spec, capacity, ahead, ahead - read_ahead + 1)
        print(f"| {files:,} | {batch} | {ahead} | {read_ahead} | {share:.0%} | {window / capacity:.0%} | {held:,} "
              f"| {early:,} | {100 * (held - early) / max(early, 1):+.1f}% |")


if __name__ == "__main__":
    main()
