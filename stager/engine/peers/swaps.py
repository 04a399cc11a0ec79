"""Swaps: a node short of room gives the file it drops to the holder it takes a file from.

Under a hard capacity a node that takes a file from its holder must make
room before the holder's copy goes, and the room that copy leaves stays
empty until the holder's own next fetch: the nodes together hold about a
step's transfers less than their capacity, which at a few hundred files a
node kept the job 4-9% above the job-wide optimum of source reads. So the
taker sends the file it drops for the job (held for it, read again) with
its request (``offers``), and the holder keeps it where the room for it
costs no file it holds for the job: free room, or the place of a copy such
as the one it just handed on. The taker's disk never holds more than its
capacity: the offered bytes travel in memory. Whoever asks the taker for
that file later is told where it went (``holders.LatestReaders.gave``).
With ``staging.peer_swaps: true`` only (``holders.swaps``): it moves files
between nodes and sends reads on, which cost time here.

The node service calls these in its own thread: ``offered`` while it makes
room for a request, ``pair`` as it hands the request's files to the
holders, ``adopt`` when the server thread passes on what another node gave.
"""

import errno
import os

import numpy as np

from .protocol import OFFER_MAX, write_all
from ...cache import ABSENT, STAGED, CacheFull
from ...sources.publish import publish
from ... import telemetry as tm


def offered(victims, cache, catalog, root):
    """The victims worth giving to a holder, with their bytes, read before they are deleted.

    Args:
        victims: Files the cache lets go to make room.
        cache: The node's ``Cache`` (its ``holders`` say what the job counts on).
        catalog: The staged files' ``Catalog``.
        root: The job's node-local directory.

    Returns:
        ``{index: (index, relpath, size, mtime_ns, data)}``: files this node
        holds for the job that the job reads again, of at most ``OFFER_MAX`` bytes.
    """
    holders = cache.holders
    if holders is None or not holders.swaps or not len(victims):
        return {}
    victims = np.asarray(victims, dtype=np.int64)
    out = {}
    for index in victims[cache.read_again(victims)].tolist():
        size, rel = int(cache.sizes[index]), catalog.path(index)
        if size > OFFER_MAX:
            continue
        try:
            with open(os.path.join(root, rel), "rb") as fh:
                data = fh.read(size + 1)
        except OSError:
            continue  # gone already: nothing to give
        if len(data) == size:
            out[index] = (index, rel, size, catalog.mtime(index), data)
    return out


def pair(groups, offers, holders):
    """Gives each holder asked at most as many offered files as it is asked for.

    Args:
        groups: ``[(holder, indices)]``: the files asked of each holder.
        offers: ``offered``'s result.
        holders: The node's ``holders`` rule (notes where each file went).

    Returns:
        ``({holder: offers}, indices given to nobody)``.
    """
    pending = list(offers.values())
    given = {}
    for owner, indices in groups:
        take, pending = pending[:len(indices)], pending[len(indices):]
        if take:
            given[owner] = tuple(take)
            for offer in take:
                holders.gave(offer[0], owner)
    return given, [offer[0] for offer in pending]


def adopt(loop, msg):
    """Keeps what another node gave this one (an ``Adopt``) where there is room for it (``keep_given``).

    Not while requests of this node wait for room (theirs comes first), nor
    a file on its way here; a copy already here is kept for the job from now on.
    The files this node handed the giver in exchange are handed on now
    (held until this moment: the room they leave is the gifts').

    Returns:
        The indices kept.
    """
    cache, telemetry = loop.cache, loop.s.telemetry
    if msg.handed:
        cache.holders.served(np.asarray(msg.handed, dtype=np.int64), msg.seq)
    here = {f[0] for f in msg.files if cache.state[f[0]] == STAGED}
    for index in here:
        cache.holders.took(index)
    open_ = loop.failed is None and not loop.admitting
    absent = [f for f in msg.files if open_ and cache.state[f[0]] == ABSENT]
    room, victims = keep_given(cache, [f[0] for f in absent])
    loop.remove(victims)
    kept = set(here)
    for index, rel, size, mtime_ns, data in absent:
        if index in room and _publish(loop, rel, size, mtime_ns, data):
            stage_given(cache, index)
            kept.add(index)
    for index, _, size, _, _ in msg.files:
        # What it gave and this node could not keep is lost to the job: counted as dropped for room.
        telemetry.record(tm.SWAPPED_IN if index in kept else tm.DROPPED, index, size, msg.epoch)
    return sorted(kept)


def keep_given(cache, indices):
    """Which of ``indices`` (files given to this node, absent here) it keeps, and the files to remove for them.

    Each in turn takes free room or the place of copies of files other
    nodes hold (the policy's order: the place of a copy just handed on): a
    file given is never kept at the cost of one the node holds for the job,
    nor kept at all when the job never reads it again. Trading a file held
    for the job for one read sooner gains on paper and lost in the replay
    where the capacity is tight (4 nodes at a quarter of the dataset
    together read 1.043 of the job-wide optimum that way, 1.011 this way,
    1.022 without swaps). Taken together, as one call per gift: each file
    looked at alone cost 1.8 ms in the node's service.

    Returns:
        ``(kept, victims)``: the set of indices kept; the copies to remove
        first (the fewest, in the policy's order, that make the room).
    """
    none = np.zeros(0, dtype=np.int64)
    indices = np.fromiter(dict.fromkeys(int(i) for i in indices), dtype=np.int64)
    if not len(indices):
        return set(), none
    indices = indices[np.isfinite(cache.holders.next_use(indices))]
    sizes = cache.sizes[indices].tolist()
    if cache.capacity is None:
        return set(indices.tolist()), none
    free = cache.capacity - cache.used
    copies = none
    if sum(sizes) > free:
        try:  # outside a spill the policy offers copies only: the files the node holds for the job stay
            copies = np.asarray(cache.policy.victims(cache, sum(sizes) - free), dtype=np.int64)
        except CacheFull:
            pass
    room = free + np.concatenate(([0], np.cumsum(cache.sizes[copies])))  # with the first j copies gone
    kept, taken = set(), 0
    for index, size in zip(indices.tolist(), sizes):
        if taken + size <= room[-1]:
            kept.add(index)
            taken += size
    return kept, copies[:int(np.searchsorted(room, taken))]


def stage_given(cache, index):
    """File ``index``, given to this node, is now published here: the node holds it for the job."""
    cache.fetching(np.array([index], dtype=np.int64))
    cache.staged(index)
    cache.holders.took(index)


def _publish(loop, rel, size, mtime_ns, data):
    """Writes a file given to this node; False where the disk is full after all."""
    try:
        publish(loop.s.local_dir, rel, size, lambda fd: write_all(fd, data) or len(data),
                None if mtime_ns is None else (mtime_ns, mtime_ns))
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return False
    return True
