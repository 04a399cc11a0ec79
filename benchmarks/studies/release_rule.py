"""What holding read minibatches' pins until the rank is its look-ahead past them costs a bounded cache.

The node service unpins a read minibatch when its rank asks for the one
``ahead`` past it, or when room is needed (``engine/node/readpins.py``), so that
what a clairvoyant cache fetches again does not depend on the readers' pace.
Before, each ``Release`` unpinned at once: with readers that keep ahead of
the consumer, up to ``read_ahead - 1`` more minibatches were unpinned at a
request, and the policy had more files to choose its victims from. This
replays both extremes through ``model.misses`` (the engine's own
``cache.Cache`` and policy, fetches complete at once) and prints the files fetched again after the
first epoch:

- ``held``: the rule (what every run now fetches, one rank a node);
- ``readers ahead``: readers as far ahead as ``read_ahead`` allows at every
  request (the fewest a run could fetch under the old rule; slower readers
  fetched between the two).

    .venv/bin/python benchmarks/studies/release_rule.py
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager import plan  # noqa: E402
from stager.config import PlanConfig  # noqa: E402
from stager.model import step_misses  # noqa: E402

# (files, batch size, look-ahead, read-ahead, capacity as a share of the dataset)
CASES = [(100, 8, 4, 4, 0.40), (300, 6, 4, 2, 0.35), (300, 6, 4, 2, 0.15), (1_000, 16, 8, 4, 0.20),
         (10_000, 32, 16, 4, 0.25), (10_000, 32, 16, 4, 0.50), (20_000, 64, 8, 8, 0.50), (20_000, 64, 8, 8, 0.10)]
FILE_BYTES = 100_000


def refetched(sizes, spec, capacity, held):
    """Files fetched after the first epoch when ``held`` requests stay pinned behind each new one.

    ``model.misses`` replays a rank that keeps ``ahead`` requests pinned; its window check is the only
    other use of ``ahead``, and the capacities here pass it at either count.
    """
    return int(sum(epoch.sum() for epoch in step_misses(sizes, spec, capacity=capacity, policy="clairvoyant",
                                                         ahead=held)[1:]))


def main():
    print("| files | batch | look-ahead | read-ahead | capacity | window / capacity | held | readers ahead | more |")
    print("|---|---|---|---|---|---|---|---|---|")
    for files, batch, ahead, read_ahead, share in CASES:
        sizes = np.full(files, FILE_BYTES, dtype=np.int64)
        spec = plan.PlanSpec.from_config(files, PlanConfig(batch_size=batch, epochs=3, seed=2), 1)
        capacity = int(share * files * FILE_BYTES)
        window = ahead * batch * FILE_BYTES
        held = refetched(sizes, spec, capacity, ahead)
        early = refetched(sizes, spec, capacity, ahead - read_ahead + 1)
        print(f"| {files:,} | {batch} | {ahead} | {read_ahead} | {share:.0%} | {window / capacity:.0%} | {held:,} "
              f"| {early:,} | {100 * (held - early) / max(early, 1):+.1f}% |")


if __name__ == "__main__":
    main()
