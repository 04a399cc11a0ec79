"""``minio``: fill once, never replace (CoorDL's MinIO).

The first files read are kept while they fit beside the look-ahead window;
once the retained part is full, every other file is staged through the window
and removed as soon as its minibatch is read. Nothing retained is ever
replaced, so the cache never thrashes; misses go to the source.
"""

import numpy as np


class MinIO:
    """Keeps what fits, drops the rest after use."""

    name = "minio"

    def __init__(self):
        self.retained = None
        self.retained_bytes = 0

    def released(self, cache, indices):
        if self.retained is None:
            self.retained = np.zeros(len(cache.sizes), dtype=bool)
        limit = None if cache.capacity is None else cache.capacity - cache.window
        drop = []
        for index in indices[~self.retained[indices]].tolist():
            size = int(cache.sizes[index])
            if limit is None or self.retained_bytes + size <= limit:
                self.retained[index] = True
                self.retained_bytes += size
            else:
                drop.append(index)
        return drop

    def victims(self, cache, nbytes):
        return []  # retained files stay; the others are gone once read
