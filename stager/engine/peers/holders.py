"""Which node holds each file for the job at each step: computed from the plan by every node alike.

Two rules, one interface (``holder``, ``kept``, ``next_use``, ``to_come``):

- ``LatestReaders`` (the default): a file is held for the job by the node
  that read it last. The next node to read it fetches it from there, and
  from then on holds it itself, so the copy a node makes to read a file is
  the job's copy: the nodes' caches together keep each file once, and
  a dataset that fits their total capacity is read from the shared file
  system once per job, whatever each node holds of it. Each holder keeps
  its files by when *any* node reads them next (Belady's rule on the whole
  job's plan), so what the job drops is what it needs latest.
- ``FirstReaders``: the node that reads a file in the plan's first epoch
  holds it for the whole job. Used where the whole job's reads cannot be
  listed: a plan without end, or more reads than ``BUDGET``.

A node's position is its ranks' latest request (``advance``). What it
holds for another node it keeps until that node has fetched it (``served``),
however far behind that node runs.

With ``LatestReaders``, a node short of room that takes a file from its
holder may give that holder the file it drops in exchange (``swaps``): the
taker notes where it went (``gave``: it sends the file's next reader there,
and asks there itself) and the holder keeps it for the job (``took``) until
another node has fetched it from there.
"""

import math

import numpy as np

from .ownership import NO_OWNER, first_epoch_owners
from ...plan import job_reads

BUDGET = 1 << 24  # reads of the whole job listed at most: 12 bytes each
# Steps a holder waits for the next reader to fetch a file it holds for it:
# beyond, that reader is taken to have had its own copy.
HANDOFF_STEPS = 64
_HANDOFF_READS = 4  # reads by other nodes since this one's last looked through
_STEP_BITS = 32


class _Position:
    """A node's position: its ranks' latest requests (``advance``)."""

    def _start(self):
        self.now = -1      # the node's latest request, of any of its ranks
        self.low = -1      # the latest request of its slowest rank (sent with PENDING: stuck or moving)
        self._asked = {}   # per rank of the node, its latest request

    def advance(self, seq, rank=0):
        """The node's rank ``rank`` asked for its minibatch ``seq``."""
        self.now = max(self.now, seq)
        self._asked[rank] = max(self._asked.get(rank, -1), seq)
        self.low = min(self._asked.values())  # an int: the server thread reads it while this runs


class LatestReaders(_Position):
    """The last node to read a file holds it, for the next one.

    A node hands a file on when the next reader fetches it from here
    (``served``); until then it keeps it, however far behind that reader is.

    Args:
        steps, nodes, files: Every read of the job (``plan.job_reads``).
        me: This node's index.
        count: Files in the catalog.
    """

    complete = True  # every read of the job is listed: no next use means never again
    swaps = True     # whoever holds a file, every node knows when the job reads it next

    def __init__(self, steps, nodes, files, me, count):
        order = np.lexsort((nodes, steps, files))
        self.keys = (files[order].astype(np.int64) << _STEP_BITS) | steps[order]
        self.nodes = nodes[order].astype(np.int32)
        self.me = me
        self._begin(count)

    def _begin(self, count):
        """A node that has asked for nothing yet, of a catalog of ``count`` files."""
        self._start()
        self.handed = np.full(count, -1, dtype=np.int64)  # per file, the latest step a node fetched it from here for
        self.asked_seq = np.full(count, -1, dtype=np.int64)  # per file, the latest step this node asked it for
        self.fetch_seq = np.full(count, -1, dtype=np.int64)  # per file, the step its latest fetch here began for
        self.moved = np.full(count, -1, dtype=np.int32)  # per file, the node this one gave it to (-1: none)
        # Per file given to this node, the step its next reader reads it at (-1: none given).
        self.given_until = np.full(count, -1, dtype=np.int64)

    def for_node(self, me):
        """The same rule seen from node ``me`` (sharing the listed reads)."""
        other = object.__new__(LatestReaders)
        other.keys, other.nodes, other.me = self.keys, self.nodes, me
        other._begin(len(self.handed))
        return other

    def asked(self, indices, seq):
        """This node's ranks asked for ``indices`` for their step ``seq``."""
        self.asked_seq[indices] = np.maximum(self.asked_seq[indices], seq)

    def fetching(self, indices, seq):
        """This node starts fetching ``indices`` for its ranks' step ``seq``."""
        self.fetch_seq[indices] = seq

    def reclaim(self, indices):
        """Where this node gave each of ``indices`` (-1: it did not), forgotten: it fetches them again.

        Called as the files are routed (after ``fetching``), so that a file
        it gave away is asked of the node it went to; from then on it answers
        for them itself.
        """
        gone = self.moved[indices].copy()
        self.moved[indices] = -1
        return gone

    def served(self, index, seq):
        """Another node fetched file ``index`` (or an array of them) from here for its step ``seq``.

        Called from the server thread, the only one that writes ``handed``.
        """
        self.handed[index] = np.maximum(self.handed[index], seq)
        self.given_until[index] = -1  # handed on: the node that fetched it holds it now

    def gave(self, index, node):
        """This node dropped file ``index`` and gave it to ``node`` (which may not keep it)."""
        self.moved[index] = node

    def took(self, index):
        """Another node gave this one file ``index``: it holds it for the job until its next reader fetches it.

        Or, as for a file owed to a node behind, until ``HANDOFF_STEPS`` after
        that read: its reader has had it from elsewhere.
        """
        self.moved[index] = -1
        pos = int(np.searchsorted(self.keys, (index << _STEP_BITS) | (self.now + 1)))
        if pos < len(self.keys) and self.keys[pos] >> _STEP_BITS == index:
            self.given_until[index] = self.keys[pos] & ((1 << _STEP_BITS) - 1)

    def holder(self, indices, seq, node=None):
        """Per file, the node to ask for it at step ``seq`` (``NO_OWNER``: nobody read it before).

        The last node to read it before ``seq``; at the same step, the
        lowest-numbered node reading it reads it from the source and the
        others (``node`` above it) ask that one. For the asking ``node``
        itself, its own reads are passed over: one of its ranks that reads
        the file earlier may not have asked for it yet.
        """
        indices = np.asarray(indices, dtype=np.int64)
        at = (indices << _STEP_BITS) | seq
        pos = np.searchsorted(self.keys, at)
        out = np.full(len(indices), NO_OWNER, dtype=np.int32)
        inside = pos < len(self.keys)
        same = np.zeros(len(indices), dtype=bool)
        if node is not None:
            same[inside] = self.keys[pos[inside]] == at[inside]
            same[same] &= self.nodes[pos[same]] < node
            out[same] = self.nodes[pos[same]]
        before = ~same & (pos > 0)
        before[before] &= (self.keys[pos[before] - 1] >> _STEP_BITS) == indices[before]
        out[before] = self.nodes[pos[before] - 1]
        if node is not None:
            mine = np.flatnonzero(before & (out == node))
            entry = pos[mine] - 1
            for _ in range(_HANDOFF_READS):
                entry = entry - 1
                ok = entry >= 0
                ok[ok] &= (self.keys[entry[ok]] >> _STEP_BITS) == indices[mine[ok]]
                found = ok.copy()
                found[ok] = self.nodes[entry[ok]] != node
                out[mine[found]] = self.nodes[entry[found]]
                mine, entry = mine[ok & ~found], entry[ok & ~found]
                if not len(mine):
                    break
        return out

    def kept(self, indices):
        """Per file, whether this node holds it for the job now.

        It does while it is the last to have read it (unless a node ahead
        of it has fetched it from here already), and after that while the
        next reader has not fetched it from here (it may be behind).
        """
        last, owed = self._held(indices)
        given = self.given_until[np.asarray(indices, dtype=np.int64)]
        return last | (owed >= 0) | ((given >= 0) & (given > self.now - HANDOFF_STEPS))

    def owed(self, indices):
        """Per file, the step of the node this one keeps it for until that node fetches it from here (-1: none).

        Such a copy frees its room when that node's fetch comes, whatever this
        node does meanwhile: a node ahead of the others waits for that rather
        than drop it (the file would be read again from the source).
        """
        return self._held(indices)[1]

    def owed_before(self, indices, seq):
        """Per file, whether it is owed to a fetch this node's request for step ``seq`` may wait for.

        Fetches for an earlier step, or for the same step by a lower-numbered
        node (which asks nothing of this one at that step: ``holder``). Every
        wait then goes to a fetch strictly earlier in (step, node) order, so
        nodes that wait for each other's fetches never wait in a circle.
        """
        _, step, node = self._held(indices, with_node=True)
        return (step >= 0) & ((step < seq) | ((step == seq) & (node < self.me)))

    def _held(self, indices, with_node=False):
        """Per file: whether this node read it last; and the step of a node that read it since and has not
        fetched it from here yet (-1: none); ``with_node``: and that node (-1: none)."""
        indices = np.asarray(indices, dtype=np.int64)
        pos = np.searchsorted(self.keys, (indices << _STEP_BITS) | (self.now + 1)) - 1  # the latest read so far
        out = np.full(len(indices), -1, dtype=np.int64)
        valid = pos >= 0
        valid[valid] &= (self.keys[pos[valid]] >> _STEP_BITS) == indices[valid]
        last = np.zeros(len(indices), dtype=bool)
        last[valid] = self.nodes[pos[valid]] == self.me
        # A node further on than this one has fetched it from here already: it holds it now.
        on = np.zeros(len(indices), dtype=bool)
        on[last] = self.handed[indices[last]] > (self.keys[pos[last]] & ((1 << _STEP_BITS) - 1))
        last &= ~on
        # Read here last, and before that by a node that asks this one (its read came between two of this
        # node's): that node may be behind, and has it from here only once it fetched it.
        between = last & (pos >= 2)
        between[between] &= ((self.keys[pos[between] - 1] >> _STEP_BITS) == indices[between]) & \
            (self.nodes[pos[between] - 1] != self.me)
        between[between] &= ((self.keys[pos[between] - 2] >> _STEP_BITS) == indices[between]) & \
            (self.nodes[pos[between] - 2] == self.me)
        step = self.keys[pos[between] - 1] & ((1 << _STEP_BITS) - 1)
        out[between] = np.where((self.handed[indices[between]] < step) & (step > self.now - HANDOFF_STEPS), step, -1)
        by = np.full(len(indices), -1, dtype=np.int32)
        by[between] = self.nodes[pos[between] - 1]
        open_ = valid & ~last & ~on  # someone read it after this node: has the first of them fetched it from here?
        for back in range(1, _HANDOFF_READS + 1):
            look = open_ & (pos - back >= 0)
            look[look] &= (self.keys[pos[look] - back] >> _STEP_BITS) == indices[look]
            open_ &= look
            mine = look.copy()
            mine[look] = self.nodes[pos[look] - back] == self.me
            step = self.keys[pos[mine] - back + 1] & ((1 << _STEP_BITS) - 1)
            out[mine] = np.where((self.handed[indices[mine]] < step) & (step > self.now - HANDOFF_STEPS), step, -1)
            by[mine] = self.nodes[pos[mine] - back + 1]
            open_ &= ~mine
        return (last, out, np.where(out >= 0, by, -1)) if with_node else (last, out)

    def next_use(self, indices):
        """Steps until any node reads each file next (``inf``: never again; 0: a node is behind on it)."""
        indices = np.asarray(indices, dtype=np.int64)
        pos = np.searchsorted(self.keys, (indices << _STEP_BITS) | (self.now + 1))
        out = np.full(len(indices), math.inf)
        inside = pos < len(self.keys)
        found = self.keys[pos[inside]]
        hit = (found >> _STEP_BITS) == indices[inside]
        where = np.flatnonzero(inside)[hit]
        out[where] = (found[hit] & ((1 << _STEP_BITS) - 1)) - self.now
        out[self._held(indices)[1] >= 0] = 0  # a node behind this one's requests still has to fetch it from here
        return out

    def to_come(self, index, cache, seq):
        """Whether a file this node does not have will be here for another node's step ``seq``.

        It will when this node reads it before ``seq`` and either has not
        asked for that read yet (or its request has come and not pinned it
        yet: the service thread records the position first), or has asked
        for it and not dropped it since (its fetch is waiting for room, or
        under way for that read or an earlier one, however much later its
        ranks have asked for it again: a container is read at many steps).
        Whatever such a read waits for lies earlier in the plan (a node
        admits its requests in order), so waits between nodes never form a
        cycle. A fetch for a later read of this node could itself wait on
        the requester: then the requester reads the source instead.
        """
        # Up to the asker's own step: at one step, the lowest-numbered reader is asked by the others.
        pos = int(np.searchsorted(self.keys, (index << _STEP_BITS) | (seq + 1))) - 1
        for back in range(_HANDOFF_READS + 1):
            if pos - back < 0 or self.keys[pos - back] >> _STEP_BITS != index:
                return False
            if self.nodes[pos - back] == self.me:
                read = int(self.keys[pos - back] & ((1 << _STEP_BITS) - 1))
                if read > self.low:
                    return True  # the rank that reads it may not have asked yet
                in_flight = cache is not None and cache.state[index] == 1  # IN_FLIGHT
                if in_flight and 0 <= self.fetch_seq[index] <= seq:
                    return True  # fetched for that read or an earlier one
                if not in_flight and self.asked_seq[index] < read:
                    return True  # its request has come and not pinned it yet: it will fetch it for that read
                waiting = in_flight or (cache is not None and cache.pins[index] > 0)
                return bool(waiting and read <= self.asked_seq[index] <= seq)
        return False


class FirstReaders(_Position):
    """The node that reads a file in the plan's first epoch holds it for the whole job.

    Args:
        owners: Per file, the owner's index (``ownership.first_epoch_owners``).
        me: This node's index.
    """

    complete = False  # other nodes' later reads are not listed
    swaps = False     # a node cannot tell when another reads a file it owns
    moved = None

    def __init__(self, owners, me):
        self.owners, self.me = owners, me
        self._start()

    def served(self, index, seq):
        pass

    def asked(self, indices, seq):
        pass

    def fetching(self, indices, seq):
        pass

    def holder(self, indices, seq, node=None):
        return self.owners[indices]

    def kept(self, indices):
        return self.owners[indices] == self.me

    def owed(self, indices):
        return np.full(len(indices), -1, dtype=np.int64)  # an owner keeps its files for the whole job

    def owed_before(self, indices, seq):
        return np.zeros(len(indices), dtype=bool)

    def next_use(self, indices):
        return None

    def to_come(self, index, cache, seq=-1):
        return self.owners[index] == self.me and (cache is None or cache.admitted_at[index] == 0)


def job_holders(spec, files, node_of_rank, me, to_files=None, budget=BUDGET):
    """The rule for this job: ``LatestReaders`` where the job's reads can be listed, else ``FirstReaders``.

    Args:
        spec: The plan description (``PlanSpec``), or None (an order only a front end knows).
        files: Files in the catalog.
        node_of_rank: Per rank, its node's index among the nodes.
        me: This node's index.
        to_files: Maps samples to the files holding them, or None.
        budget: The most reads to list.
    """
    if spec is not None and hasattr(spec, "minibatches") and spec.epochs and \
            spec.samples * (spec.epochs - spec.start.epoch) <= budget:
        steps, nodes, read, _ = job_reads(spec, node_of_rank, to_files, files)
        return LatestReaders(steps, nodes, read, me, files)
    return FirstReaders(first_epoch_owners(spec, files, len(node_of_rank), np.asarray(node_of_rank), to_files), me)
