"""Decoded minibatches shared by the jobs of a group: files in shared memory, and the rule for who decodes.

A stream is what one rank of a job reads and how it decodes it (its plan
description, rank and loader, ``attach.stream_key``): ranks of different
jobs with the same stream receive the same minibatches, decoded the same
way. For each minibatch of a stream, the service (``Shelf``) decides:

- the first rank about to decode it (a reader of its is free for it)
  **publishes** it: its reader decodes it as usual and also writes it to a
  file in the group's shared memory directory (``engine.batchfile.put``);
- a rank whose minibatch is being decoded by another **waits** for it (it
  is at most one decode behind the leader);
- a rank whose minibatch is on the shelf **takes** it: it maps the file
  copy-on-write (``engine.batchfile.read``), neither a decoding nor a copy,
  and holds it until the minibatch's arrays are gone (``LetGo``).

Files are reused: a minibatch written into fresh shared memory costs the
kernel a zeroed page per 4 KiB (13 ms for 25 MB of float32 images here,
against 6 ms into a file written before: ``benchmarks/studies/shelf_copy.py``), so a file that left the
shelf goes to the next publisher once every rank that took it has let it
go. A rank that leaves with arrays it took still alive (its job closed the
loader and kept a minibatch) lets go of files that may still be mapped:
those are unlinked when they leave the shelf, never written again.

A rank waits for another's decoding only so long: at most four times the
stream's usual time from claim to publication (and at least a second).
Past that (the decoding job is stopped, swapping, or much slower), it
decodes the minibatch for itself (**own**) and goes on.

The lag rule: a stream keeps its last ``window`` published minibatches; an
older one leaves the shelf once no rank is taking it. The leader never
waits for anyone; a job more than ``window`` minibatches behind finds its
minibatch gone, decodes it itself and publishes it again for those behind
it. If a publisher leaves or fails before publishing, the first rank
waiting takes over the decoding.
"""

import collections
import os

PUBLISH, SHARED, WAIT, OWN = "publish", "shared", "wait", "own"
_PATIENCE = 4.0   # a waiting rank gives up after this many times the stream's usual decoding
_MIN_WAIT_S = 1.0


class _Entry:
    __slots__ = ("path", "decoder", "waiters", "holders", "since", "orphaned")

    def __init__(self, path, decoder, now):
        self.path, self.decoder = path, decoder   # decoder: the request decoding it; None once published
        self.waiters = []                         # requests waiting for it to be published
        self.holders = 0                          # ranks taking it (between their Claimed and Release)
        self.since = now                          # when its decoding was claimed
        self.orphaned = False                     # a rank left holding it: never written again


class Shelf:
    """Which minibatch each stream has decoded, is decoding or dropped (the service thread's).

    Args:
        directory: The group's shared memory directory (0700).
        window: Published minibatches a stream keeps (``staging.share_window``).
    """

    def __init__(self, directory, window):
        self.directory = directory
        self.window = window
        self._streams = collections.defaultdict(collections.OrderedDict)  # stream -> key -> _Entry
        self._free = []        # files off the shelf that nobody reads: the next publishers write them again
        self._usual = {}       # stream -> moving average of seconds from claim to publication
        self._next = 0
        self.reused = 0

    def holds(self, stream, key):
        """Whether minibatch ``key`` of ``stream`` is on the shelf or being decoded for it."""
        return key in self._streams.get(stream, ())

    def claim(self, stream, key, request, now):
        """What ``request``'s rank, about to decode, does about minibatch ``key`` of ``stream``.

        Returns:
            ``(PUBLISH, path)``, ``(SHARED, path)`` (held until ``let_go``) or ``(WAIT, None)``.
        """
        entries = self._streams[stream]
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = _Entry(self._file(), request, now)
            return PUBLISH, entry.path
        if entry.decoder is None:
            entry.holders += 1
            return SHARED, entry.path
        entry.waiters.append(request)
        return WAIT, None

    def _file(self):
        if self._free:
            self.reused += 1
            return self._free.pop()
        self._next += 1
        return os.path.join(self.directory, f"{self._next - 1}.batch")

    def published(self, stream, key, request, ok, now):
        """``request``'s rank decoded (``ok``: and published) its minibatch, or left without.

        Returns:
            ``[(request, verdict, path)]``: the waiting requests' answers now.
        """
        entries = self._streams[stream]
        entry = entries.get(key)
        if entry is None or entry.decoder is not request:
            return []
        waiters, entry.waiters = entry.waiters, []
        if ok:
            took = now - entry.since
            self._usual[stream] = took if stream not in self._usual else 0.8 * self._usual[stream] + 0.2 * took
            entry.decoder = None
            entry.holders += len(waiters)
            entries.move_to_end(key)
            self._trim(entries)
            return [(w, SHARED, entry.path) for w in waiters]
        if not waiters:
            self._free_file(entries.pop(key).path)
            return []
        entry.decoder = waiters[0]  # the first behind takes over; the rest wait on it
        entry.waiters = waiters[1:]
        entry.since = now
        return [(waiters[0], PUBLISH, entry.path)]

    def overdue(self, now):
        """The waiting requests that waited too long: they decode for themselves (``OWN``)."""
        late = []
        for stream, entries in self._streams.items():
            limit = max(_MIN_WAIT_S, _PATIENCE * self._usual.get(stream, 0.0))
            for entry in entries.values():
                if entry.waiters and now - entry.since > limit:
                    late += entry.waiters
                    entry.waiters = []
        return late

    def withdraw(self, stream, key, request):
        """``request`` waited for minibatch ``key`` and left (its job ended)."""
        entry = self._streams[stream].get(key)
        if entry is not None and request in entry.waiters:
            entry.waiters.remove(request)

    def let_go(self, stream, key, left=False):
        """A rank that took minibatch ``key`` of ``stream`` is done with it (``left``: it left the group,
        perhaps with the arrays still mapped)."""
        entries = self._streams[stream]
        entry = entries.get(key)
        if entry is not None:
            entry.holders -= 1
            entry.orphaned |= left
            self._trim(entries)

    def _trim(self, entries):
        on_shelf = [k for k, e in entries.items() if e.decoder is None]
        for key in on_shelf[:max(0, len(on_shelf) - self.window)]:
            if entries[key].holders <= 0:
                entry = entries.pop(key)
                self._free_file(entry.path, reuse=not entry.orphaned)

    def _free_file(self, path, reuse=True):
        if reuse and len(self._free) < self.window:
            self._free.append(path)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
