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
    sizes = np.asarray(sizes, dtype=np.int64)
    window = check_window(capacity, sizes, spec.batch_size, ahead, len(ranks), spec.most_files())
    cache = Cache(sizes, policy_name(policy, capacity), capacity, window, to_files)
    for rank in ranks:
        cache.add_plan(rank, spec)
    pending = collections.deque()  # files of requests made and not yet read, oldest first
    misses = collections.defaultdict(list)  # epoch: files fetched for each of its steps

    def read_oldest():
        for index in cache.release(pending.popleft()):
            cache.removed(index)

    for seq, step in enumerate(zip(*(spec.minibatches(rank) for rank in ranks))):
        fetched = 0
        for rank, mb in zip(ranks, step):
            while len(pending) >= ahead * len(ranks):
                read_oldest()
            cache.future.advance(rank, seq)
            files = np.unique(mb.indices if to_files is None else to_files(mb.indices))
            missing, _ = cache.pin(files)
            while True:
                victims = cache.room_for(int(sizes[missing].sum()))
                if victims is not None:
                    break
                if not pending:
                    raise CacheFull(f"capacity {capacity} cannot hold one minibatch")
                read_oldest()
            for index in victims:
                cache.removed(index)
            cache.fetching(missing)
            for index in missing.tolist():
                cache.staged(index)
            fetched += len(missing)
            pending.append(files)
        misses[step[0].epoch].append(fetched)
    first = spec.start.epoch
    return [np.array(misses[e], dtype=np.int64) for e in range(first, spec.epochs)]
