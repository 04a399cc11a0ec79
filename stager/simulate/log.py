"""What a simulated job did, and its summary per epoch."""

import numpy as np


class Log:
    """Step ends and waits per rank, and the shared file system's reads over time.

    Args:
        ranks: Ranks simulated.
        epochs: Per step, its epoch.
        weights: Per rank simulated, the ranks of the job it stands for (None: 1 each).
    """

    def __init__(self, ranks, epochs, weights=None):
        self.epochs = np.asarray(epochs)
        steps = len(self.epochs)
        self.ends = np.zeros((ranks, steps))
        self.waits = np.zeros((ranks, steps))
        self.weights = np.ones(ranks) if weights is None else np.asarray(weights, dtype=np.float64)
        self._source = []  # (time, files, bytes) per completed read of the source

    def mean_wait(self, steps=slice(None)):
        """A rank's seconds waiting over ``steps``, on average over the job's ranks."""
        return float(np.average(self.waits[:, steps].sum(axis=1), weights=self.weights))

    def step(self, rank, step, now):
        self.ends[rank, step] = now

    def wait(self, rank, step, seconds):
        self.waits[rank, step] = seconds

    def source(self, now, files, nbytes, since=None):
        """A read of the source ended at ``now``; ``since``: the nodes it stands for ended theirs from then on."""
        self._source.append((now if since is None else since, now, files, nbytes))

    def source_reads(self):
        """``(files, bytes)`` read from the source in all."""
        if not self._source:
            return 0, 0
        reads = np.array(self._source, dtype=np.float64)
        return int(reads[:, 2].sum()), int(reads[:, 3].sum())

    def peak_rates(self, bins=100):
        """The highest opens/s and bytes/s the file system was asked for, over ``bins`` windows of the job (1 s at least)."""
        if not self._source:
            return 0.0, 0.0
        reads = np.array(self._source, dtype=np.float64)
        width = max(1.0, float(self.ends.max()) / bins)
        edges = np.arange(int(reads[:, 1].max() // width) + 2) * width
        # A read standing for several nodes' spreads over the time theirs ended: its share of each window.
        begin, end = reads[:, 0], reads[:, 1]
        span = np.maximum(end - begin, 1e-12)
        opens, nbytes = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
        first, last = (begin // width).astype(np.int64), (end // width).astype(np.int64)
        for k in range(int((last - first).max()) + 1):
            slot = first + k
            inside = slot <= last
            lo, hi = np.maximum(begin, slot * width), np.minimum(end, (slot + 1) * width)
            share = np.where(end > begin, np.clip(hi - lo, 0, None) / span, 1.0) * inside
            opens += np.bincount(slot[inside], weights=(reads[:, 2] * share)[inside], minlength=len(opens))[:len(opens)]
            nbytes += np.bincount(slot[inside], weights=(reads[:, 3] * share)[inside], minlength=len(opens))[:len(opens)]
        return float(opens.max()) / width, float(nbytes.max()) / width

    def per_epoch(self):
        """Per epoch: its time (from the previous epoch's end on the last rank to its own) and its stall share."""
        out, begin = [], 0.0
        for epoch in np.unique(self.epochs):
            steps = np.flatnonzero(self.epochs == epoch)
            end = float(self.ends[:, steps[-1]].max())
            seconds = end - begin
            waited = self.mean_wait(steps)
            out.append({"epoch": int(epoch), "seconds": seconds, "stall": waited / seconds if seconds > 0 else 0.0})
            begin = end
        return out
