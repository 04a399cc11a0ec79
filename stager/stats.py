"""Timers and totals: where the time went, per minibatch and per run."""

import time
from dataclasses import dataclass, field


@dataclass
class BatchTimes:
    """Timings of one delivered minibatch, in seconds.

    Attributes:
        stall: How long the consumer waited in ``next()`` for it.
        prefetch: Time prefetchers spent copying its files (0 when all were
            already local).
        read: Time a reader spent decoding it.
    """

    stall: float = 0.0
    prefetch: float = 0.0
    read: float = 0.0


@dataclass
class Stats:
    """Running totals of a pipeline.

    Attributes:
        batches: Minibatches delivered.
        samples: Samples delivered.
        stall_s: Total time the consumer waited.
        prefetch_s: Total prefetcher busy time.
        read_s: Total reader busy time.
        files_staged: Files copied to node-local storage.
        bytes_staged: Bytes copied to node-local storage.
        files_present: Files found already staged (a kept directory).
    """

    batches: int = 0
    samples: int = 0
    stall_s: float = 0.0
    prefetch_s: float = 0.0
    read_s: float = 0.0
    files_staged: int = 0
    bytes_staged: int = 0
    files_present: int = 0
    started: float = field(default_factory=time.perf_counter)

    def delivered(self, size, times):
        """Accounts one minibatch handed to the consumer."""
        self.batches += 1
        self.samples += size
        self.stall_s += times.stall

    def summary(self, wall_s=None):
        """Totals as a JSON-ready dictionary, with rates over ``wall_s``."""
        wall = time.perf_counter() - self.started if wall_s is None else wall_s
        return {
            "batches": self.batches,
            "samples": self.samples,
            "files_staged": self.files_staged,
            "bytes_staged": self.bytes_staged,
            "files_present": self.files_present,
            "wall_s": round(wall, 4),
            "stall_s": round(self.stall_s, 4),
            "stall_fraction": round(self.stall_s / wall, 4) if wall > 0 else 0.0,
            "samples_per_s": round(self.samples / wall, 2) if wall > 0 else 0.0,
            "prefetch_busy_s": round(self.prefetch_s, 4),
            "read_busy_s": round(self.read_s, 4),
        }
