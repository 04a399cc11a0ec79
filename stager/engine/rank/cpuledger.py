"""What each epoch cost in CPU, by process kind: the training process, its readers, the node's prefetchers.

The rank marks the CPU seconds each kind has spent so far when its
pipeline starts, and again when its consumer first asks for an epoch's
minibatch after the last one's (and at the plan's end), as
``EPOCH_CPU`` events; the accounting turns the differences into
milliseconds a sample, epoch by epoch (``stager report``'s ledger). A staged
epoch 1 pays for the copies; later ones read them: the ledger shows where
each epoch's CPU went, kind by kind. The marks are the consumer's epoch
boundaries; the workers run a few minibatches ahead of it, so their work on
an epoch's first minibatches falls in the row before (the rows' sum is
exact).

The counts come from ``/proc/<pid>/stat`` (user and system time of every
thread), read a few times a run. A worker that exits (a pool shrunk by
``auto``) keeps what it had spent at the last mark; what it spent after is
not counted. The prefetchers are counted on a node's leader, where they
run; a job of a shared group (``staging.share``) has none of its own.
"""

import os

from ..perf.clock import process_stat
from ... import telemetry as tm
from ...telemetry.ledger import PREFETCHERS, RANK, READERS, SAMPLES


class CpuLedger:
    """Marks each kind's CPU seconds so far in a rank's telemetry.

    Args:
        telemetry: The rank's ``telemetry.Telemetry``.
    """

    def __init__(self, telemetry):
        self.telemetry = telemetry
        self._seen = ({}, {})  # readers', prefetchers': pid -> CPU seconds at the last mark

    def mark(self, epoch, readers, prefetchers, samples=0):
        """Records the CPU seconds so far of this process and of the workers of two pools.

        Args:
            epoch: The epoch that just ended (``BEFORE`` at the start).
            readers, prefetchers: Each a ``WorkerPool``, or None (not started, or not this rank's).
            samples: Samples consumed in that epoch.
        """
        times = os.times()
        record = self.telemetry.record
        record(tm.EPOCH_CPU, epoch, RANK, times.user + times.system)
        self.look(readers, prefetchers)
        for kind, seen in zip((READERS, PREFETCHERS), self._seen):
            record(tm.EPOCH_CPU, epoch, kind, sum(seen.values()))
        record(tm.EPOCH_CPU, epoch, SAMPLES, samples)

    def look(self, readers, prefetchers):
        """Reads the workers' CPU so far, for the next mark (before they stop: a process gone keeps its last)."""
        for pool, seen in zip((readers, prefetchers), self._seen):
            for proc in list(pool.procs if pool is not None else ()):
                try:
                    seen[proc.pid] = process_stat(proc.pid)[1]
                except (OSError, TypeError):
                    pass  # exited (its CPU when last read is kept), or not started (no pid yet)
