"""The node's residency: per file, where it is, its bytes and its pins.

Lives in the node service's thread (one writer, no lock). A file is
``ABSENT``, ``IN_FLIGHT`` (a prefetcher is fetching it) or ``STAGED``
(published in the job directory). A minibatch pins its files from the
moment a rank asks for it until the rank has read it; a pinned file is never
removed. When a file's last pin goes, the policy decides whether it stays;
when a fetch needs room, the policy chooses which unpinned files go.

Bytes are counted exactly: ``used`` is every staged file plus every file
being fetched (its temporary copy grows toward its size), and a fetch starts
only once ``used`` plus its size fits the capacity.
"""

import logging

import numpy as np

from .future import Future
from .policies import make_policy

log = logging.getLogger(__name__)

ABSENT, IN_FLIGHT, STAGED = 0, 1, 2


class Cache:
    """Residency of the node's files and the policy that keeps or removes them.

    Args:
        sizes: Catalog sizes in bytes (int64 array).
        policy: A policy name (``cache.policies``).
        capacity: Bytes the job directory may hold, or None (unbounded).
        window: Bytes the look-ahead window may pin at once (``capacity.window_bytes``).
        to_files: Maps the plan's sample indices to the files that hold them
            (``Catalog.file_index``); None: each sample is its own file.

    Attributes:
        state: Per file: ``ABSENT``, ``IN_FLIGHT`` or ``STAGED``.
        pins: Per file: minibatches in flight or being read that need it.
        staged_bytes: Bytes of the files published here.
        in_flight_bytes: Bytes of the files being fetched.
        admitted_at: Per file, the tick it was last staged (FIFO's order).
        used_at: Per file, the tick it was last read (LRU's order).
        future: Every rank's future reads (``Future``), for a clairvoyant policy.
        holders: With ``staging.peers``, which files other nodes count on
            this one holding (``engine.peers.holders``: ``kept``, and
            ``next_use`` by any node of the job), or None. Such files go
            only when nothing else can, farthest next use by the job first.
    """

    def __init__(self, sizes, policy="unbounded", capacity=None, window=0, to_files=None):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        n = len(self.sizes)
        self.state = np.zeros(n, dtype=np.uint8)
        self.pins = np.zeros(n, dtype=np.int32)
        self.admitted_at = np.zeros(n, dtype=np.int64)
        self.used_at = np.zeros(n, dtype=np.int64)
        self.capacity = capacity
        self.window = window
        self.staged_bytes = 0
        self.in_flight_bytes = 0
        self.future = Future(to_files)
        self.policy = make_policy(policy)
        self.holders = None
        self._spill = False  # while making room, whether it is the kept files' turn
        self.waiting_for_peers = False  # the latest ``room_for`` waits for other nodes' fetches
        self._tick = 0

    @property
    def used(self):
        """Bytes staged or being fetched."""
        return self.staged_bytes + self.in_flight_bytes

    def add_plan(self, rank, spec):
        """Records what ``rank`` will read, so a policy can know each file's next use."""
        if self.policy.name != "clairvoyant":
            return  # only it looks ahead: evaluating plans would cost for nothing
        self.future.add(rank, spec)
        if self.future.unknown:
            log.warning("stager: rank %s's order is known only to its front end (a custom order sampler), so "
                        "the cache cannot see the future: staging.cache_policy clairvoyant falls back to lru", rank)
            self.policy = make_policy("lru")

    def advance(self, rank, seq):
        """``rank`` asked for its minibatch ``seq``: the future behind it no longer counts."""
        self.future.advance(rank, seq)
        if self.holders is not None:
            self.holders.advance(seq, rank)

    def next_use(self, indices):
        """Minibatches until each file is read next: by the node's ranks, or, for a file held for the job, by any node."""
        local = self.future.next_use(indices)
        if self.holders is not None and len(indices):
            job = self.holders.next_use(indices)
            if job is not None:
                kept = self.holders.kept(indices)
                local[kept] = np.minimum(local[kept], job[kept])
        return local

    def read_again(self, indices):
        """Per file, whether the job reads its copy here again (its next reader would take it from here).

        The next reader is this node or another; without this copy that read
        goes to the source. Only reads the node
        knows of count (its ranks' plans as far as they are listed).
        """
        indices = np.asarray(indices, dtype=np.int64)
        again = np.isfinite(self.next_use(indices))
        if self.holders is not None:
            again &= self.holders.kept(indices)  # a node read it since: the next reader asks that one
        return again

    def drop_plan(self, rank):
        """Forgets what ``rank`` would have read (it left before the end of its plan)."""
        self.future.remove(rank)

    def pin(self, indices, seq=-1):
        """A minibatch (the ranks' step ``seq``) needs ``indices`` (distinct): pins them.

        Returns:
            ``(missing, waiting)``: files absent (to fetch), and every file not
            yet staged (the minibatch waits for them).
        """
        self.pins[indices] += 1
        if self.holders is not None:
            self.holders.asked(indices, seq)
        return indices[self.state[indices] == ABSENT], indices[self.state[indices] != STAGED]

    def room_for(self, nbytes, owed_before=None):
        """Makes room for ``nbytes`` more, with the policy's help.

        Args:
            nbytes: Bytes to make room for.
            owed_before: With peers, a step: where only files held for the
                job could still go, and the copies this node keeps until
                other nodes fetch them for their steps before this one (or
                for this one, by a lower-numbered node: ``owed_before``)
                would make the room, wait for those fetches (None is returned and
                ``waiting_for_peers`` is set) rather than drop a file the job
                would read again from the source. None: drop them (with
                ``staging.peer_swaps`` the service gives what it drops to the
                holder it asks, and does not wait).

        Returns:
            The files to remove first (the caller deletes them and calls
            ``removed``), or None when not enough unpinned files can go yet.
        """
        self.waiting_for_peers = False
        if self.capacity is None or self.used + nbytes <= self.capacity:
            return []
        need = self.used + nbytes - self.capacity
        victims = list(self.policy.victims(self, need))
        freed = int(self.sizes[victims].sum()) if victims else 0
        if freed < need and self.holders is not None and owed_before is not None:
            free = np.flatnonzero((self.state == STAGED) & (self.pins == 0))
            if int(self.sizes[free[self.holders.owed_before(free, owed_before)]].sum()) >= need - freed:
                self.waiting_for_peers = True
                return None
        if freed < need and self.holders is not None:
            # Every copy not held for the job goes first, whatever its own next use: losing one
            # costs a transfer from its holder, losing a kept file a read of the source.
            self._spill = True
            try:
                victims += list(self.policy.victims(self, need - freed))
            finally:
                self._spill = False
            freed = int(self.sizes[victims].sum()) if victims else 0
        return victims if freed >= need else None

    def evictable(self):
        """Unpinned staged files: those a policy may remove (kept ones only once the others have all gone)."""
        free = np.flatnonzero((self.state == STAGED) & (self.pins == 0))
        if self.holders is not None and len(free):
            kept = self.holders.kept(free)
            free = free[kept] if self._spill else free[~kept]
        return free

    def fetching(self, indices, seq=None):
        """Fetches of ``indices`` start (for the ranks' step ``seq``; None: again, for the same step)."""
        if self.holders is not None and seq is not None:
            self.holders.fetching(indices, seq)
        self.state[indices] = IN_FLIGHT
        self.in_flight_bytes += int(self.sizes[indices].sum())

    def staged(self, index):
        """A prefetcher published file ``index``."""
        if self.state[index] == IN_FLIGHT:
            size = int(self.sizes[index])
            self.in_flight_bytes -= size
            self.staged_bytes += size
        self.state[index] = STAGED
        self._tick += 1
        self.admitted_at[index] = self._tick

    def not_fetched(self, index):
        """A fetch of ``index`` ended without a file (no room on the disk): it is absent again."""
        if self.state[index] == IN_FLIGHT:
            self.in_flight_bytes -= int(self.sizes[index])
        self.state[index] = ABSENT

    def release(self, indices):
        """A minibatch that pinned ``indices`` (distinct files) was read.

        Returns:
            Files the policy removes now: the caller deletes them, then calls
            ``removed``.
        """
        self.pins[indices] -= 1
        self._tick += 1
        self.used_at[indices] = self._tick
        free = indices[self.pins[indices] == 0]
        if self.holders is not None and len(free):
            if self.holders.complete and self.policy.name == "clairvoyant":
                # Every read of the job is known: only a file nobody reads again goes now. A copy
                # another node holds too stays while there is room: a node running behind may ask for it.
                never = np.isinf(self.holders.next_use(free)) & np.isinf(self.future.next_use(free))
                return free[never].tolist()
            free = free[~self.holders.kept(free)]  # not only the node's own future: others may read them
        return list(self.policy.released(self, free)) if len(free) else []

    def removed(self, index):
        """File ``index`` was deleted from the job directory."""
        if self.state[index] == STAGED:
            self.staged_bytes -= int(self.sizes[index])
        self.state[index] = ABSENT
