"""What a ``stager run`` job writes: records of what was read and staged.

Each record is one line handed to the kernel in one ``write`` as soon as it is
made: a job ended by ``MPI_Abort`` or a kill keeps the record of every
minibatch its ranks delivered, whole lines only. (The resume state is in
``state.py``.)
"""

import json
import os


class Recorder:
    """Writes what was read (``rank-<r>.jsonl``) and, on node leaders, what was staged
    (``staged-<node>.jsonl``) and the node cache's counters per epoch (``cache-<node>.jsonl``)."""

    def __init__(self, directory, catalog, world):
        os.makedirs(directory, exist_ok=True)
        self.directory, self.node = directory, world.node
        self.catalog = catalog
        self._reads = _Lines(os.path.join(directory, f"rank-{world.rank}.jsonl"))
        self._staged = None
        if world.node_leader:
            self._staged = _Lines(os.path.join(directory, f"staged-{world.node}.jsonl"))

    def batch(self, batch):
        paths = [self.catalog.name(i) for i in batch.indices]
        self._reads.write({"epoch": batch.epoch, "step": batch.step, "samples": paths})

    def cache(self, table):
        """Writes the node cache's per-epoch counters (``cache-<node>.jsonl``, node leaders)."""
        if self._staged is None:
            return
        with open(os.path.join(self.directory, f"cache-{self.node}.jsonl"), "w", encoding="utf-8") as fh:
            for row in table:
                fh.write(json.dumps(row) + "\n")

    def staged(self, rel, nbytes, epoch):
        self._staged.write({"path": rel, "bytes": nbytes, "epoch": epoch})

    def close(self):
        self._reads.close()
        if self._staged is not None:
            self._staged.close()


class _Lines:
    """A JSON-lines file written without a buffer in this process: one ``write`` per line."""

    def __init__(self, path):
        self._fh = open(path, "wb", buffering=0)

    def write(self, record):
        data = memoryview((json.dumps(record) + "\n").encode())
        while data:  # a regular file takes it whole; a short write is carried on, not lost
            data = data[self._fh.write(data):]

    def close(self):
        self._fh.close()
