"""Each file's next use by the node's ranks, evaluated from their plan descriptions.

Every rank's ``Hello`` carries what it will read (``plan.PlanSpec``); evaluating it gives, per epoch, the sequence number at which
the rank reads each of its files. Only a horizon of the future is held: a
few epochs per rank, sorted arrays of reads (8 bytes an entry), extended as the
rank advances. Where the horizon reaches the end of every rank's plan,
"no next use" means never again.
"""

import math

import numpy as np

# Entries (file reads) held across all ranks' horizons at most, beyond the
# two chunks each rank always holds: about 50 MB; and epochs ahead per rank,
# so an endless plan of a small dataset is not evaluated far for nothing.
_BUDGET = 1 << 22
_MAX_CHUNKS = 64


_SEQ_BITS = 32  # a read is one int64: file index above, sequence number below


class _Chunk:
    """One epoch of a rank's reads: every distinct (file, sequence number), sorted, as ``file << 32 | seq``.

    A file packed with other samples (a container) is read by several
    minibatches of an epoch; each of those reads is kept, so its next use
    is the next of them, not the next epoch's first.
    """

    __slots__ = ("first", "last", "reads")

    def __init__(self, first, last, reads):
        self.first, self.last, self.reads = first, last, reads


class _RankFuture:
    """One rank's reads, one epoch per chunk, evaluated lazily."""

    def __init__(self, spec, rank, to_files):
        self._minibatches = iter(spec.minibatches(rank))
        self._to_files = to_files
        self._pending = None   # the first minibatch of the next chunk, already taken
        self._seq = 0
        self.chunks = []
        self.exhausted = False
        self.now = -1          # the latest sequence number the rank asked for

    def load_chunk(self):
        """Evaluates the next epoch's minibatches into a chunk; False at the plan's end."""
        mb = self._pending or next(self._minibatches, None)
        self._pending = None
        if mb is None:
            self.exhausted = True
            return False
        epoch, first, parts, seqs = mb.epoch, self._seq, [], []
        while mb is not None and mb.epoch == epoch:
            parts.append(mb.indices if self._to_files is None else self._to_files(mb.indices))
            seqs.append(np.full(len(mb.indices), self._seq, dtype=np.int64))
            self._seq += 1
            mb = next(self._minibatches, None)
        self._pending = mb
        if mb is None:
            self.exhausted = True
        reads = np.unique((np.concatenate(parts) << _SEQ_BITS) | np.concatenate(seqs))  # by file, then by time
        self.chunks.append(_Chunk(first, self._seq - 1, reads))
        return True


class Future:
    """The node's future reads, for a clairvoyant policy.

    A file's next use is the earliest next use of any sample it holds
    (``to_files`` maps samples to files, for samples packed in containers).

    Attributes:
        unknown: Some rank's order is known only to its front end (no description).
    """

    def __init__(self, to_files=None):
        self._to_files = to_files
        self._ranks = {}
        self.unknown = False

    def add(self, rank, spec):
        """Records what ``rank`` will read; a ``spec`` without ``minibatches`` leaves the future unknown."""
        if spec is None or not hasattr(spec, "minibatches"):
            self.unknown = True
            return
        self._ranks[rank] = _RankFuture(spec, rank, self._to_files)
        self._extend()

    def remove(self, rank):
        """``rank`` left (a job of a shared group): its reads no longer count."""
        self._ranks.pop(rank, None)

    def advance(self, rank, seq):
        """``rank`` asked for its minibatch ``seq``: forget what lies behind it."""
        future = self._ranks.get(rank)
        if future is None or seq <= future.now:
            return
        future.now = seq
        while future.chunks and future.chunks[0].last < seq:
            future.chunks.pop(0)
        self._extend()

    def _extend(self):
        held = sum(len(c.reads) for f in self._ranks.values() for c in f.chunks)
        for future in self._ranks.values():
            while not future.exhausted and (len(future.chunks) < 2 or (held < _BUDGET
                                                                      and len(future.chunks) < _MAX_CHUNKS)):
                if not future.load_chunk():
                    break
                held += len(future.chunks[-1].reads)

    @property
    def complete(self):
        """Whether every rank's whole remaining plan is in the horizon (no next use = never)."""
        return not self.unknown and all(f.exhausted for f in self._ranks.values())

    def next_use(self, indices):
        """Minibatches until each file's next read by any rank of the node (``inf``: not in the horizon)."""
        indices = np.asarray(indices, dtype=np.int64)
        best = np.full(len(indices), math.inf)
        for future in self._ranks.values():
            mine = np.full(len(indices), math.inf)
            after = (indices << _SEQ_BITS) | (future.now + 1)  # each file's first read past the rank's position
            for chunk in future.chunks:
                if not len(chunk.reads):
                    continue
                pos = np.minimum(np.searchsorted(chunk.reads, after), len(chunk.reads) - 1)
                found = chunk.reads[pos]
                hit = ((found >> _SEQ_BITS) == indices) & (found >= after) & np.isinf(mine)
                mine[hit] = (found[hit] & ((1 << _SEQ_BITS) - 1)) - future.now
            np.minimum(best, mine, out=best)
        return best
