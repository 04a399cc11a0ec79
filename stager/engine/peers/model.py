"""Which way fetches a file faster: the holder's leader, or the shared file system.

Each way's time for a file is modelled as ``latency + bytes / bandwidth``
and fitted by least squares to what fetches actually took: prefetcher tasks
(several opens and their bytes) for the shared file system, single transfers
for peers. Old measurements fade (each new one weighs ``1 - DECAY``), so the
model follows load on either side. Nothing is configured.

A way that lost is still tried now and then, or a single slow first
transfer (connections are set up on first use) would rule it out for good.
Only the peer way is explored: trying the shared file system for a file a
peer holds would read it a second time.
"""

import numpy as np

DECAY = 0.98
WARMUP = 8     # peer transfers measured before the model may prefer the shared file system
EXPLORE = 16   # of the files the model sends to the shared file system, one in this many asks the peer anyway


class _Fit:
    """``seconds ~ latency * opens + bytes / bandwidth``, weighted toward recent measurements."""

    def __init__(self):
        self.xx = np.zeros((2, 2))
        self.xy = np.zeros(2)
        self.count = 0

    def add(self, opens, nbytes, seconds):
        x = np.array([float(opens), float(nbytes)])
        self.xx = DECAY * self.xx + np.outer(x, x)
        self.xy = DECAY * self.xy + x * seconds
        self.count += 1

    def predict(self, nbytes):
        """Seconds for one file of ``nbytes`` (array), or None before any measurement."""
        if not self.count:
            return None
        xx, xy = self.xx, self.xy
        det = xx[0, 0] * xx[1, 1] - xx[0, 1] * xx[1, 0]
        if abs(det) > 1e-9 * xx[0, 0] * xx[1, 1]:
            latency, per_byte = np.linalg.solve(xx, xy)
            if latency >= 0 and per_byte >= 0:
                return latency + per_byte * np.asarray(nbytes, dtype=float)
        # Files of one size (or too few measurements) cannot tell latency
        # from bandwidth apart: the mean seconds per open is then the model.
        return np.full(np.shape(nbytes), xy[0] / xx[0, 0])


class RateModel:
    """Measured rates of both ways; says per file which one to take."""

    def __init__(self):
        self.source = _Fit()
        self.peer = _Fit()
        self._passed = 0   # files sent to the shared file system though a peer held them

    def from_source(self, opens, nbytes, seconds):
        """A prefetcher fetched ``opens`` files, ``nbytes`` in all, from the shared file system."""
        if opens:
            self.source.add(opens, nbytes, seconds)

    def from_peer(self, files, nbytes, seconds):
        """``files`` files, ``nbytes`` in all, came from a peer leader in one answer."""
        self.peer.add(files, nbytes, seconds)

    def peer_faster(self, sizes):
        """Per file of ``sizes``, whether to ask its holder (True until both ways have been measured)."""
        sizes = np.asarray(sizes)
        if self.peer.count < WARMUP or not self.source.count:
            return np.ones(len(sizes), dtype=bool)
        choice = self.peer.predict(sizes) <= self.source.predict(sizes)
        passed = np.flatnonzero(~choice)
        explore = (self._passed + np.arange(1, len(passed) + 1)) % EXPLORE == 0
        choice[passed[explore]] = True
        self._passed += len(passed)
        return choice
