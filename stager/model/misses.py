"""How many files a bounded cache fetches from the source, minibatch by minibatch, computed from the plan.

The order of every epoch is known in advance, so the node cache's misses
need not be guessed: ``cache_misses`` replays the node's requests (every rank's
minibatches, ``ahead`` of the reading, as the coordinators ask for them)
through the same ``cache.Cache`` and policy the service uses, admitting a
request once the reads before it have made room, and counts the files each
minibatch had to fetch. With the clairvoyant policy that is what a run fetches,
whatever its timing, since the policy decides from the plan alone.
"""

import collections

import numpy as np

from ..cache import Cache, CacheFull, check_window, policy_name


def cache_misses(sizes, spec, ranks=(0,), capacity=None, policy="auto", ahead=16):
    """Files fetched from the source in each epoch of ``spec`` read by ``ranks`` of one node.

    ``step_misses`` summed over each epoch; the arguments are the same.

    Returns:
        A list: misses per epoch, from the plan's first epoch.
    """
    return [int(epoch.sum()) for epoch in step_misses(sizes, spec, ranks, capacity, policy, ahead)]


def step_misses(sizes, spec, ranks=(0,), capacity=None, policy="auto", ahead=16, to_files=None):
    """Files fetched from the source for each step of each epoch of ``spec`` read by ``ranks`` of one node.

    Args:
        sizes: Catalog sizes in bytes.
        spec: A ``plan.PlanSpec`` with a finite number of epochs.
        ranks: The ranks that share the node's cache.
        capacity: The cache's bytes, or None (unbounded).
        policy: ``staging.cache_policy`` (``auto``: clairvoyant with a capacity).
        ahead: Minibatches each rank asks for past its reading (``staging.lookahead``).
        to_files: Maps samples to the files holding them (containers,
            ``Catalog.file_index``); ``sizes`` are then those files'.

    Returns:
        A list with an array per epoch, from the plan's first epoch: the files
        the node fetched for each of its steps (every rank's minibatch of it).

    Raises:
        ConfigError: For a capacity below the look-ahead window (as ``stager run`` would).
        ValueError: For a plan without end (``epochs: 0``).
    """
    if not spec.epochs:
        raise ValueError("cache_misses needs a plan with a finite number of epochs")
    node = NodeReplay(sizes, spec, ranks, capacity, policy, ahead, to_files)
    misses = collections.defaultdict(list)  # epoch: files fetched for each of its steps
    for seq, step in enumerate(zip(*(spec.minibatches(rank) for rank in ranks))):
        fetched = sum(len(node.request(rank, seq, mb.indices)[0]) for rank, mb in zip(ranks, step))
        misses[step[0].epoch].append(fetched)
    first = spec.start.epoch
    return [np.array(misses[e], dtype=np.int64) for e in range(first, spec.epochs)]


class NodeReplay:
    """One node's cache, driven by its ranks' requests as the service sees them.

    A request is admitted once the reads before it leave room: each rank
    asks ``ahead`` minibatches past its reading, and the oldest request is
    read (its pins released) whenever that many are outstanding or room is
    needed. Fetches complete at once: what is replayed is which files each
    request fetches, not when.

    Args:
        sizes: Sizes of the files in bytes.
        spec: The ranks' ``plan.PlanSpec``.
        ranks: The ranks that share the node's cache.
        capacity: The cache's bytes, or None (unbounded).
        policy: ``staging.cache_policy`` (``auto``: clairvoyant with a capacity).
        ahead: Minibatches each rank asks for past its reading (``staging.lookahead``).
        to_files: Maps samples to the files holding them, or None.
        holders: Which files other nodes count on this one holding
            (``Cache.holders``, with peers), or None.

    Attributes:
        cache: The node's ``cache.Cache``.
        dropped: The files the latest request made room by dropping that the
            node held for the job and the job reads again (with peers: what
            it may give to a holder, ``engine.peers.swaps``).

    Raises:
        ConfigError: For a capacity below the look-ahead window (as ``stager run`` would).
    """

    def __init__(self, sizes, spec, ranks, capacity=None, policy="auto", ahead=16, to_files=None, holders=None):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        window = check_window(capacity, self.sizes, spec.batch_size, ahead, len(ranks), spec.most_files())
        self.cache = Cache(self.sizes, policy_name(policy, capacity), capacity, window, to_files)
        self.cache.holders = holders
        for rank in ranks:
            self.cache.add_plan(rank, spec)
        self._to_files = to_files
        self._most = ahead * len(ranks)
        self._pending = collections.deque()  # files of requests made and not yet read, oldest first
        self._capacity = capacity
        self.dropped = np.zeros(0, dtype=np.int64)

    def _read_oldest(self):
        for index in self.cache.release(self._pending.popleft()):
            self.cache.removed(index)

    def request(self, rank, seq, indices):
        """``rank`` asks for its minibatch ``seq`` of samples ``indices``.

        Returns:
            ``(missing, files)``: the files fetched for it, and all its distinct files.

        Raises:
            CacheFull: When the capacity cannot hold one minibatch.
        """
        cache = self.cache
        while len(self._pending) >= self._most:
            self._read_oldest()
        cache.advance(rank, seq)
        files = np.unique(indices if self._to_files is None else self._to_files(indices))
        missing, _ = cache.pin(files, seq)
        while True:
            victims = cache.room_for(int(self.sizes[missing].sum()))
            if victims is not None:
                break
            if not self._pending:
                raise CacheFull(f"capacity {self._capacity} cannot hold one minibatch")
            self._read_oldest()
        victims = np.asarray(victims, dtype=np.int64)
        swaps = cache.holders is not None and cache.holders.swaps
        self.dropped = victims[cache.read_again(victims)] if swaps and len(victims) else victims[:0]
        for index in victims.tolist():
            cache.removed(index)
        cache.fetching(missing)
        for index in missing.tolist():
            cache.staged(index)
        self._pending.append(files)
        return missing, files
