"""What the service does with a prefetcher's ``Staged``: account the fetch, wake the requests it completes.

A ``Staged`` names the files one task fetched (from the source, a peer, or
the fallback), each with its bytes, or ``NO_SPACE`` where the local file
system was full below the capacity (another job's files took the room):
those are evicted for and retried, ``_NO_SPACE_TRIES`` times at most, and
then the job fails naming the directory. Both act on the service thread's
``ServiceLoop``, which alone touches the cache.
"""

import errno
import os

import numpy as np

from ... import telemetry as tm
from ...cache import CacheFull, human
from ...telemetry import NO_SPACE, PRESENT
from ..messages import Failure

_NO_SPACE_TRIES = 3  # fetches of one file that may meet a full disk before the job fails


def staged(loop, msg):
    """Accounts a ``Staged`` and answers the requests whose last file it brought.

    Returns:
        The indices that met a full disk (``out_of_space``'s to retry).
    """
    telemetry, cache, s = loop.s.telemetry, loop.cache, loop.s
    loop.dispatch.finished(msg)
    # Files fetched at once each count their own time: the stage's busy seconds are per slot.
    telemetry.record(tm.TASK, msg.task, len(msg.done), msg.seconds if msg.busy_s is None else msg.busy_s)
    if msg.cpu_s is not None:  # of those seconds, on a core and queued for one: the rest waited on the source
        telemetry.record(tm.TASK_CPU, msg.task, -1 if msg.queued_s is None else round(msg.queued_s * 1e6),
                         msg.cpu_s)
    if s.peers is not None:
        s.peers.measure(msg)
    full = []
    for index, nbytes in msg.done:
        if nbytes == NO_SPACE:
            full.append(index)
            continue
        nbytes = s.probed.pop(index, nbytes) if nbytes == PRESENT else nbytes  # the probe's, at start
        cache.staged(index)
        loop.no_space.pop(index, None)
        if msg.route == "peer":
            telemetry.record(tm.PEER, index, nbytes, msg.epoch)
        else:
            telemetry.record(tm.STAGED, index, nbytes, msg.epoch)
            if msg.route == "fallback":
                telemetry.record(tm.FALLBACK, index, nbytes, msg.epoch)
            if nbytes != PRESENT and s.on_staged is not None:  # an empty file is a file staged
                s.on_staged(loop.catalog.path(index), nbytes, msg.epoch)
        for request in loop.waiting.pop(index, ()):
            request.remaining -= 1
            if not request.remaining and not request.answered:
                loop.answer(request)
    return full


def out_of_space(loop, indices, epoch):
    """The local file system was full below the capacity (another job's files): evict and retry."""
    cache = loop.cache
    for index in indices:
        cache.not_fetched(index)
        loop.no_space[index] += 1
    indices = np.array(indices)
    want = int(cache.sizes[indices].sum())
    victims = []
    if max(loop.no_space[i] for i in indices.tolist()) <= _NO_SPACE_TRIES:
        try:
            victims = cache.policy.victims(cache, want)
            while int(cache.sizes[victims].sum()) < want:
                read = loop.pins.oldest_read()  # the policy may evict too little: read minibatches too
                if read is None:
                    break
                loop.unpin([read])
                victims = cache.policy.victims(cache, want)
        except CacheFull:
            victims = []
    if not victims or int(cache.sizes[victims].sum()) < want:
        rel = loop.catalog.path(indices[0])
        loop.fail(Failure("prefetch", "service", epoch, None, rel, "OSError",
                          f"{os.strerror(errno.ENOSPC)}: the local file system under {loop.s.local_dir} has no "
                          f"room for {rel} and {len(indices) - 1} more file(s) ({human(want)}); this job uses "
                          f"{human(cache.used)} there (staging.capacity "
                          f"{human(cache.capacity) if cache.capacity else 'unbounded'}) and can evict nothing "
                          "more: free space there or lower staging.capacity"))
        return
    loop.remove(victims)
    cache.fetching(indices)
    loop.dispatch.retry(indices, epoch)
