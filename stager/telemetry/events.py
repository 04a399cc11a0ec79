"""Every minibatch's events with monotonic timestamps, recorded cheaply.

Each thread appends to its own columns (``array`` of doubles and integers:
32 bytes an event, no lock, no Python object kept per event); a reader merges
the threads' columns when it asks. A stall report or a tuner reads the events;
``stats.Stats`` is a running view of the totals.

Per-minibatch events are all kept, some 250 bytes a minibatch (250 MB for
a million of them): each thread keeps its latest ``STEP_CHUNKS_KEPT`` full
chunks in memory and writes older ones to an unnamed temporary file
(``_Spill``), read back when the whole log is asked for, so a run of days
holds a bounded log in memory. Per-file events (``FILE_KINDS``) would grow
with the dataset times the epochs (ImageNet's 1.28 million files on one
node: about 100 MB an epoch), so each thread keeps only its latest
``FILE_EVENTS_KEPT`` to ``FILE_EVENTS_KEPT + CHUNK`` of them and folds older
ones into totals (``file_totals``): what the accounting reads is exact
however long the run.

An event is ``(time, kind, a, b, value)``; what ``a``, ``b`` and ``value``
mean depends on the kind:

=============  ===================  ==================  ==========================
kind           a                    b                   value
=============  ===================  ==================  ==========================
``NEEDED``     rank's minibatch seq  files in it        0
``QUEUED``     first task id        tasks queued        files missing
``STAGED``     catalog index        bytes (-2: present) epoch of the task
``TASK``       task id              files in it         prefetcher seconds (files
                                                         fetched at once: each one's)
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
``RESIZED``    0 prefetch, 1 read,  the pool's new size  measured seconds per item
               2 look-ahead,        (look-ahead: depth)  (look-ahead: fetch span)
               3 files in flight
``LOCAL``      epoch                bytes read locally  samples read locally
``FALLBACK``   catalog index        bytes               epoch (read from the source: its holder stalled)
``GROUP``      what (below)         files or samples    bytes (files), seconds (taken) or 0
``DROPPED``    catalog index        bytes               epoch being requested (an evicted file read again)
``SWAP_OUT``   catalog index        bytes               epoch (dropped for room, given to a holder)
``SWAP_IN``    catalog index        bytes               epoch (another node gave it; kept here)
``TASK_CPU``   task id              us queued for a     seconds on a core (of a
                                    core (-1: unknown)  ``TASK``'s busy seconds)
``DECODED``    samples built from   decoded copies      decoding seconds those
               decoded copies       kept                samples saved (a reader's minibatch)
``EPOCH_CPU``  epoch ended (-1:     0 rank, 1 readers,  CPU seconds so far
               the start)           2 prefetchers,      (samples: that epoch's)
                                    3 samples
=============  ===================  ==================  ==========================

A ``GROUP`` event (a job of a shared group, ``staging.share``) says, by its
``a``: ``GROUP_FILES``, files of a minibatch another job had staged;
``GROUP_FETCHED``, files this job's minibatch had fetched from the source;
``GROUP_TAKEN``, a minibatch another job decoded (``b``: its samples; the
value: its reader's seconds decoding it);
``GROUP_GIVEN``, a minibatch this job decoded and published for the others.

``FINISHED`` is the ``next()`` that found the plan's end: with the
``CONSUMED`` events it accounts for every moment of the consumer's loop
(``stager.telemetry.accounting``).
"""

import os
import tempfile
import threading
import time
from array import array

NEEDED, QUEUED, STAGED, TASK, READY, READ, DELIVERED, CONSUMED, REQUEST, EVICTED, USAGE, PEER, SERVED, \
    FINISHED, RESIZED, LOCAL, FALLBACK, GROUP, DROPPED, SWAPPED_OUT, SWAPPED_IN, TASK_CPU, DECODED, \
    EPOCH_CPU = range(24)
GROUP_FILES, GROUP_FETCHED, GROUP_TAKEN, GROUP_GIVEN = range(4)
# A ``RESIZED`` event's pool (or the ``auto`` look-ahead, or the files each prefetcher keeps in flight).
POOL_PREFETCH, POOL_READ, POOL_LOOKAHEAD, POOL_IN_FLIGHT = range(4)
# What a ``STAGED`` event's bytes (and a prefetcher's ``Staged.done``) may hold besides a count:
NO_SPACE = -1  # the local file system was full; nothing was published
PRESENT = -2  # a matching copy was already there; nothing was copied
KINDS = ("needed", "queued", "staged", "task", "ready", "read", "delivered", "consumed", "request", "evicted",
         "usage", "peer", "served", "finished", "resized", "local", "fallback", "group", "dropped", "swap_out",
         "swap_in", "task_cpu", "decoded", "epoch_cpu")
FILE_KINDS = frozenset((STAGED, EVICTED, PEER, SERVED, FALLBACK, DROPPED, SWAPPED_OUT, SWAPPED_IN))  # one event per file, not per minibatch


_TYPES = ("d", "b", "q", "q", "d")  # time, kind, a, b, value
CHUNK = 4096  # events in a chunk of a column (128 KiB): a log grows by whole chunks, never by copying itself
FILE_EVENTS_KEPT = 2 * CHUNK  # per-file events a thread keeps, and up to a chunk more: 256 to 384 KiB
STEP_CHUNKS_KEPT = 2  # full chunks of per-minibatch events a thread keeps in memory; older ones are spilled
_WIDTHS = tuple(array(code).itemsize for code in _TYPES)


class _Spill:
    """Full chunks of events written out, oldest first, to an unnamed temporary file (gone with the process).

    Opened at the first chunk spilled; a forked child that spills opens its
    own (chunks its parent wrote stay readable in the parent's).
    """

    def __init__(self):
        self._file, self._pid, self._end = None, None, 0

    def write(self, chunk):
        """Writes a chunk's columns; returns where it lies: ``(file, offset, events)``."""
        if self._pid != os.getpid():
            self._file, self._pid, self._end = tempfile.TemporaryFile(prefix="stager-events-"), os.getpid(), 0
        data = b"".join(col.tobytes() for col in chunk)
        where = (self._file, self._end, len(chunk[0]))
        os.pwrite(self._file.fileno(), data, self._end)
        self._end += len(data)
        return where

    @staticmethod
    def read(where):
        """The columns of the chunk written at ``where``."""
        file, offset, n = where
        data = os.pread(file.fileno(), n * sum(_WIDTHS), offset)
        out = []
        for code, width in zip(_TYPES, _WIDTHS):
            col = array(code)
            col.frombytes(data[:n * width])
            data = data[n * width:]
            out.append(col)
        return out


class _Columns:
    """Events in chunks of ``CHUNK``: the full ones, oldest first, and the one being filled.

    A column grown as one array would be copied to a larger block at each
    growth, leaving the old one as a hole in the heap: a long run's memory
    would grow by those holes too.
    """

    __slots__ = ("spilled", "full", "t", "kind", "a", "b", "value")

    def __init__(self):
        self.spilled = []  # where each chunk written out lies in the log's ``_Spill``
        self.full = []
        self.t, self.kind, self.a, self.b, self.value = (array(code) for code in _TYPES)

    def __len__(self):
        # ``value`` is appended last: every column holds at least this many.
        return (len(self.spilled) + len(self.full)) * CHUNK + len(self.value)

    def spill_oldest(self, spill):
        """Writes the oldest full chunk out (under the log's lock)."""
        self.spilled.append(spill.write(self.full.pop(0)))

    def full_now(self):
        return len(self.value) >= CHUNK

    def rotate(self):
        """Files the chunk being filled with the full ones (under the log's lock: readers see both or neither)."""
        self.full.append((self.t, self.kind, self.a, self.b, self.value))
        self.t, self.kind, self.a, self.b, self.value = (array(code) for code in _TYPES)

    def append(self, t, kind, a, b, value):
        self.t.append(t)
        self.kind.append(kind)
        self.a.append(a)
        self.b.append(b)
        self.value.append(value)

    def snapshot(self):
        """Copies of the columns, all of one length (the owner may append meanwhile; it never rewrites)."""
        n = len(self.value)
        out = [array(code) for code in _TYPES]
        for chunk in [_Spill.read(where) for where in self.spilled] + self.full:
            for col, part in zip(out, chunk):
                col.extend(part)
        for col, part in zip(out, (self.t, self.kind, self.a, self.b, self.value)):
            col.extend(part[:n])
        return tuple(out)


class _Thread:
    """One thread's events: per-minibatch ``steps``, the latest per-file ``files``, the older ones' totals."""

    __slots__ = ("steps", "files", "folded")

    def __init__(self):
        self.steps, self.files = _Columns(), _Columns()
        self.folded = {}  # kind -> [events with b >= 0 (a file's bytes), their bytes, events with b == PRESENT]

    def fold_oldest(self):
        """Counts the oldest chunk of per-file events into ``folded`` and drops it."""
        _, kinds, _, bs, _ = self.files.full.pop(0)
        for kind, b in zip(kinds, bs):
            total = self.folded.setdefault(kind, [0, 0, 0])
            if b >= 0:
                total[0] += 1
                total[1] += b
            elif b == PRESENT:
                total[2] += 1


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
        self._lock = threading.Lock()  # to register a thread's columns, and while chunks change places
        self._spill = _Spill()

    def _thread(self):
        mine = getattr(self._local, "mine", None)
        if mine is None:
            mine = self._local.mine = _Thread()
            with self._lock:
                self._threads.append(mine)
        return mine

    def record(self, kind, a=0, b=0, value=0.0):
        """Appends one event, stamped now."""
        mine = self._thread()
        cols = mine.files if kind in FILE_KINDS else mine.steps
        if cols.full_now():
            with self._lock:  # readers copy under it: they never see a chunk in neither place
                cols.rotate()
                if len(mine.files.full) * CHUNK > FILE_EVENTS_KEPT:
                    mine.fold_oldest()
                if len(mine.steps.full) > STEP_CHUNKS_KEPT:
                    mine.steps.spill_oldest(self._spill)
        cols.append(time.monotonic(), kind, a, b, value)
        if self.on_event is not None:
            self.on_event(kind, a, b, value)

    def _snapshots(self):
        with self._lock:
            return [cols.snapshot() for mine in self._threads for cols in (mine.steps, mine.files)]

    def file_totals(self, kind):
        """Per-file events of ``kind`` so far, kept or folded: ``(files, bytes, present)``.

        ``files`` and ``bytes`` count the events whose ``b`` is a file's bytes
        (0 or more); ``present`` those with ``PRESENT`` (a copy found already
        there). ``NO_SPACE`` events are in neither.
        """
        import numpy as np

        files = nbytes = present = 0
        with self._lock:
            for mine in self._threads:
                folded = mine.folded.get(kind, (0, 0, 0))
                files, nbytes, present = files + folded[0], nbytes + folded[1], present + folded[2]
                _, kinds, _, bs, _ = mine.files.snapshot()
                if len(bs):
                    b = np.frombuffer(bs, dtype=np.int64)[np.frombuffer(kinds, dtype=np.int8) == kind]
                    files, nbytes = files + int((b >= 0).sum()), nbytes + int(b[b >= 0].sum())
                    present += int((b == PRESENT).sum())
        return files, nbytes, present

    def events(self, kinds=None):
        """Every event kept, merged across threads in time order (per-file ones: each thread's latest).

        Args:
            kinds: Keep only these kinds; None keeps all.

        Returns:
            A list of ``(seconds_since_start, kind_name, a, b, value)``.
        """
        out = []
        for t, kind, a, b, value in self._snapshots():
            for i in range(len(t)):
                if kinds is None or kind[i] in kinds:
                    out.append((t[i] - self.started, KINDS[kind[i]], a[i], b[i], value[i]))
        out.sort(key=lambda e: e[0])
        return out

    def arrays(self):
        """Every event kept as numpy arrays, merged across threads in time order.

        Cheaper than ``events()`` for a reader that sums over many events.

        Returns:
            ``(t, kind, a, b, value)``: seconds since start (float64), kind
            numbers (int8), ``a`` and ``b`` (int64), ``value`` (float64).
        """
        import numpy as np

        snapshots = self._snapshots()
        parts = [[], [], [], [], []]
        for columns in snapshots:
            for part, col, dtype in zip(parts, columns, (np.float64, np.int8, np.int64, np.int64, np.float64)):
                part.append(np.frombuffer(col, dtype=dtype) if len(col) else np.empty(0, dtype))
        if not snapshots:
            return (np.empty(0), np.empty(0, np.int8), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))
        t, kind, a, b, value = (np.concatenate(p) for p in parts)
        order = np.argsort(t, kind="stable")
        return t[order] - self.started, kind[order], a[order], b[order], value[order]

    def __len__(self):
        """Events kept."""
        with self._lock:
            return sum(len(mine.steps) + len(mine.files) for mine in self._threads)
