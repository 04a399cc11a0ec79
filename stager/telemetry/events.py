"""Every minibatch's events with monotonic timestamps, recorded cheaply.

Each thread appends to its own columns (``array`` of doubles and integers:
32 bytes an event, no lock, no Python object kept per event); a reader merges
the threads' columns when it asks. A stall report or a tuner reads the events;
``stats.Stats`` is a running view of the totals.

An event is ``(time, kind, a, b, value)``; what ``a``, ``b`` and ``value``
mean depends on the kind:

=============  ===================  ==================  ==========================
kind           a                    b                   value
=============  ===================  ==================  ==========================
``NEEDED``     rank's minibatch seq  files in it        0
``QUEUED``     first task id        tasks queued        files missing
``STAGED``     catalog index        bytes (-2: present) epoch of the task
``TASK``       task id              files in it         prefetcher seconds
``READY``      seq                  0                   prefetch seconds for it
``READ``       seq                  samples             reader seconds
``DELIVERED``  seq                  samples             0
``CONSUMED``   seq                  samples             seconds the consumer waited
``REQUEST``    epoch                files local (hits)  files to fetch (misses)
``EVICTED``    catalog index        bytes               epoch being requested
``USAGE``      epoch                bytes (a new peak)  0
``PEER``       catalog index        bytes               epoch (from a peer's copy)
``SERVED``     catalog index        bytes (0: missing)  the asking peer's epoch
``FINISHED``   minibatches consumed  0                  seconds the consumer waited
``RESIZED``    0 prefetch, 1 read   the pool's new size  measured seconds per item
``LOCAL``      epoch                bytes local (hits)  0
``FALLBACK``   catalog index        bytes               epoch (read from the source: its holder stalled)
``GROUP``      what (below)         files or samples    bytes (files) or 0
=============  ===================  ==================  ==========================

A ``GROUP`` event (a job of a shared group, ``staging.share``) says, by its
``a``: ``GROUP_FILES``, files of a minibatch another job had staged;
``GROUP_FETCHED``, files this job's minibatch had fetched from the source;
``GROUP_TAKEN``, a minibatch another job decoded (``b``: its samples);
``GROUP_GIVEN``, a minibatch this job decoded and published for the others.

``FINISHED`` is the ``next()`` that found the plan's end: with the
``CONSUMED`` events it accounts for every moment of the consumer's loop
(``stager.telemetry.accounting``).
"""

import threading
import time
from array import array

NEEDED, QUEUED, STAGED, TASK, READY, READ, DELIVERED, CONSUMED, REQUEST, EVICTED, USAGE, PEER, SERVED, \
    FINISHED, RESIZED, LOCAL, FALLBACK, GROUP = range(18)
GROUP_FILES, GROUP_FETCHED, GROUP_TAKEN, GROUP_GIVEN = range(4)
POOL_PREFETCH, POOL_READ = range(2)  # a ``RESIZED`` event's pool
# What a ``STAGED`` event's bytes (and a prefetcher's ``Staged.done``) may hold besides a count:
NO_SPACE = -1  # the local file system was full; nothing was published
PRESENT = -2  # a matching copy was already there; nothing was copied
KINDS = ("needed", "queued", "staged", "task", "ready", "read", "delivered", "consumed", "request", "evicted",
         "usage", "peer", "served", "finished", "resized", "local", "fallback", "group")


class _Columns:
    __slots__ = ("t", "kind", "a", "b", "value")

    def __init__(self):
        self.t, self.kind, self.a, self.b, self.value = array("d"), array("b"), array("q"), array("q"), array("d")

    def __len__(self):
        # ``value`` is appended last: every column holds at least this many.
        return len(self.value)


class Telemetry:
    """A pipeline's event log, written by any thread.

    Args:
        on_event: Optional callable ``(kind, a, b, value)`` told of every
            event as it is recorded, by the recording thread (running totals).
    """

    def __init__(self, on_event=None):
        self.on_event = on_event
        self.started = time.monotonic()
        self._local = threading.local()
        self._threads = []
        self._lock = threading.Lock()  # only to register a thread's columns

    def _columns(self):
        cols = getattr(self._local, "cols", None)
        if cols is None:
            cols = self._local.cols = _Columns()
            with self._lock:
                self._threads.append(cols)
        return cols

    def record(self, kind, a=0, b=0, value=0.0):
        """Appends one event, stamped now."""
        cols = self._columns()
        cols.t.append(time.monotonic())
        cols.kind.append(kind)
        cols.a.append(a)
        cols.b.append(b)
        cols.value.append(value)
        if self.on_event is not None:
            self.on_event(kind, a, b, value)

    def events(self, kinds=None):
        """Every event so far, merged across threads in time order.

        Args:
            kinds: Keep only these kinds; None keeps all.

        Returns:
            A list of ``(seconds_since_start, kind_name, a, b, value)``.
        """
        with self._lock:
            threads = list(self._threads)
        out = []
        for cols in threads:
            n = len(cols)  # the owner may append meanwhile; it never rewrites
            for i in range(n):
                if kinds is None or cols.kind[i] in kinds:
                    out.append((cols.t[i] - self.started, KINDS[cols.kind[i]], cols.a[i], cols.b[i],
                                cols.value[i]))
        out.sort(key=lambda e: e[0])
        return out

    def arrays(self):
        """Every event so far as numpy arrays, merged across threads in time order.

        Cheaper than ``events()`` for a reader that sums over many events.

        Returns:
            ``(t, kind, a, b, value)``: seconds since start (float64), kind
            numbers (int8), ``a`` and ``b`` (int64), ``value`` (float64).
        """
        import numpy as np

        with self._lock:
            threads = list(self._threads)
        parts = [[], [], [], [], []]
        for cols in threads:
            n = len(cols)  # slices are copies: the owner may append meanwhile
            for part, col, dtype in zip(parts, (cols.t, cols.kind, cols.a, cols.b, cols.value),
                                        (np.float64, np.int8, np.int64, np.int64, np.float64)):
                part.append(np.frombuffer(col[:n], dtype=dtype) if n else np.empty(0, dtype))
        if not threads:
            return (np.empty(0), np.empty(0, np.int8), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))
        t, kind, a, b, value = (np.concatenate(p) for p in parts)
        order = np.argsort(t, kind="stable")
        return t[order] - self.started, kind[order], a[order], b[order], value[order]

    def __len__(self):
        with self._lock:
            return sum(len(c) for c in self._threads)
