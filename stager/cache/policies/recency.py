"""``lru`` and ``fifo``: the policies that know only the past.

``lru`` removes the unpinned file read longest ago; ``fifo`` the one staged
longest ago. Both keep every file until room is needed.
"""

import numpy as np

from .clairvoyant import take_until


class LRU:
    """Least recently read goes first."""

    name = "lru"
    stamp = "used_at"

    def released(self, cache, indices):
        return []

    def victims(self, cache, nbytes):
        candidates = cache.evictable()
        order = np.lexsort((candidates, getattr(cache, self.stamp)[candidates]))
        return take_until(cache, candidates[order], nbytes) if len(candidates) else []


class FIFO(LRU):
    """First staged goes first."""

    name = "fifo"
    stamp = "admitted_at"
