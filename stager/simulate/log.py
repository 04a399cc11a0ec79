"""What a simulated job did, and its summary per epoch."""

import numpy as np


class Log:
    """Step ends and waits per rank, and the shared file system's reads over time.

    Args:
        ranks: Ranks in the job.
        epochs: Per step, its epoch.
    """

    def __init__(self, ranks, epochs):
        self.epochs = np.asarray(epochs)
        steps = len(self.epochs)
        self.ends = np.zeros((ranks, steps))
        self.waits = np.zeros((ranks, steps))
        self._source = []  # (time, files, bytes) per completed read of the source

    def step(self, rank, step, now):
        self.ends[rank, step] = now

    def wait(self, rank, step, seconds):
        self.waits[rank, step] = seconds

    def source(self, now, files, nbytes):
        self._source.append((now, files, nbytes))

    def source_reads(self):
        """``(files, bytes)`` read from the source in all."""
        if not self._source:
            return 0, 0
        reads = np.array(self._source, dtype=np.float64)
        return int(reads[:, 1].sum()), int(reads[:, 2].sum())

    def peak_rates(self, bins=100):
        """The highest opens/s and bytes/s the file system was asked for, over ``bins`` windows of the job (1 s at least)."""
        if not self._source:
            return 0.0, 0.0
        reads = np.array(self._source, dtype=np.float64)
        width = max(1.0, float(self.ends.max()) / bins)
        slot = (reads[:, 0] // width).astype(np.int64)
        opens = np.bincount(slot, weights=reads[:, 1]) / width
        nbytes = np.bincount(slot, weights=reads[:, 2]) / width
        return float(opens.max()), float(nbytes.max())

    def per_epoch(self):
        """Per epoch: its time (from the previous epoch's end on the last rank to its own) and its stall share."""
        out, begin = [], 0.0
        for epoch in np.unique(self.epochs):
            steps = np.flatnonzero(self.epochs == epoch)
            end = float(self.ends[:, steps[-1]].max())
            seconds = end - begin
            waited = float(self.waits[:, steps].sum(axis=1).mean())
            out.append({"epoch": int(epoch), "seconds": seconds, "stall": waited / seconds if seconds > 0 else 0.0})
            begin = end
        return out
