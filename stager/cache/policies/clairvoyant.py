"""``clairvoyant``: Belady's rule on the node's known future (NoPFS).

Every future epoch's order follows from the seed, so the node knows when each
file will be read next by any of its ranks, across epoch boundaries (and,
for a file it holds for other nodes, by any rank of the job). Room is
made by removing the unpinned file whose next read is farthest away; a file
no rank reads again is removed as soon as its minibatch has been read.
"""

import numpy as np


class Clairvoyant:
    """Evicts by farthest next use; drops files never used again."""

    name = "clairvoyant"

    def released(self, cache, indices):
        if not cache.future.complete:
            return []  # beyond the horizon is not never
        return indices[np.isinf(cache.future.next_use(indices))].tolist()

    def victims(self, cache, nbytes):
        candidates = cache.evictable()
        if not len(candidates):
            return []
        # Farthest next use first; among equals, the highest index (a fixed rule).
        order = np.lexsort((-candidates, -cache.next_use(candidates)))
        return take_until(cache, candidates[order], nbytes)


def take_until(cache, ordered, nbytes):
    """The first files of ``ordered`` whose sizes add up to ``nbytes``."""
    total = np.cumsum(cache.sizes[ordered])
    return ordered[:int(np.searchsorted(total, nbytes)) + 1].tolist()
