"""When the files of a minibatch a rank has read are unpinned.

A rank asks for minibatch ``s`` only once it has read ``s - ahead``
(``Hello.ahead``, the coordinator's look-ahead), and its ``Release`` of
``s - ahead`` reaches the service before that ``Need``; ``Release`` of later
minibatches may come before or after it, as fast as the readers were. So a
read minibatch keeps its files pinned until its rank asks for the minibatch
``ahead`` past it, or until room is needed and it is the read minibatch asked
for first. Unpinning as each ``Release`` arrives would make the files a
bounded cache may evict, and so what it fetches again, depend on the
readers' timing; by this rule one rank's requests meet the cache as
``model.misses.NodeReplay`` replays them, whatever the timing. Pins never
wait on it: a request that needs room takes it from read minibatches first.
"""

import collections


class _Client:
    __slots__ = ("ahead", "last", "pinned")

    def __init__(self, ahead):
        self.ahead = ahead
        self.last = -1                         # the latest minibatch it asked for
        self.pinned = collections.deque()      # [order, seq, request, read], in the order it asked


class ReadPins:
    """Every client's requests whose files are pinned, and which of them were read."""

    def __init__(self):
        self._clients = {}
        self._order = 0

    def hello(self, conn, ahead):
        """``conn`` asks for minibatches ``ahead`` past the one its consumer holds."""
        self._clients[conn] = _Client(ahead)

    def asking(self, conn, seq):
        """``conn`` asks for minibatch ``seq``; returns the requests to unpin before its files are pinned."""
        client = self._clients.setdefault(conn, _Client(0))
        client.last = max(client.last, seq)
        return self._behind(client)

    def pinned(self, conn, seq, request):
        """``request`` (``conn``'s minibatch ``seq``) pinned its files."""
        self._clients[conn].pinned.append([self._order, seq, request, False])
        self._order += 1

    def read(self, conn, seq):
        """``conn`` read minibatch ``seq``; returns the requests to unpin now."""
        client = self._clients.get(conn)
        if client is None:
            return []
        for entry in client.pinned:
            if entry[1] == seq:
                entry[3] = True
                break
        return self._behind(client)

    def oldest_read(self):
        """Room is needed: the read request asked for first among those heading their client's queue
        (a read one behind an unread one of its client waits for it), taken out; None if there is none."""
        heads = [c.pinned for c in self._clients.values() if c.pinned and c.pinned[0][3]]
        if not heads:
            return None
        return min(heads, key=lambda pinned: pinned[0][0]).popleft()[2]

    def leave(self, conn):
        """``conn`` left: every request of it still pinned, read or not."""
        client = self._clients.pop(conn, None)
        return [entry[2] for entry in client.pinned] if client is not None else []

    @staticmethod
    def _behind(client):
        out, pinned = [], client.pinned
        while pinned and pinned[0][3] and pinned[0][1] <= client.last - client.ahead:
            out.append(pinned.popleft()[2])
        return out
