"""Whether a request short of room waits for the nodes behind, and until when (``staging.peers``).

A node that runs ahead keeps the copies the nodes behind have not fetched
from it yet (``peers.holders``: owed). Short of room, dropping one means a
second read of the source; waiting for the fetches makes the room without
one. That pays where the nodes together hold the dataset beside their
windows (then each file is read once); below that, files go anyway, and
with ``staging.peer_swaps`` a dropped file goes to the holder asked. A wait
lasts ``ROOM_WAIT_S`` at most; the peer server wakes the service at each
fetch from here meanwhile.
"""

import time

# A request short of room waits this long at most for other nodes to fetch the copies kept for them
# (``Cache.room_for``'s ``owed_before``); then it drops files the job reads again.
ROOM_WAIT_S = 10.0


class RoomWait:
    """The service thread's wait for other nodes' fetches.

    Args:
        cache: The node's ``Cache``.
        peers: The node's ``Peers``, or None.
        swaps: ``staging.peer_swaps``.
    """

    def __init__(self, cache, peers, swaps):
        self.peers = peers
        self.patient = peers is not None and not swaps and cache.capacity is not None and \
            cache.capacity >= int(cache.sizes.sum()) / peers.comm.Get_size() + cache.window
        self.until = None  # until when the head request waits (monotonic), or None

    @property
    def waiting(self):
        return self.until is not None

    def owed_before(self, seq):
        """``Cache.room_for``'s ``owed_before`` for a request of step ``seq``: None once waiting is over."""
        return seq if self.patient and (self.until is None or time.monotonic() < self.until) else None

    def begin(self):
        """The head request waits: each fetch from here wakes the service."""
        if self.until is None:
            self.until = time.monotonic() + ROOM_WAIT_S
        self.peers.wake_on_served = True

    def end(self):
        """The head request found its room."""
        if self.until is not None:
            self.until, self.peers.wake_on_served = None, False
