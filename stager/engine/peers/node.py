"""A node leader's part in sharing caches: who holds what, the server, the fetchers, the model."""

import collections
import logging
import time

import numpy as np

from .fetcher import PeerFetcher
from .model import RateModel
from .ownership import NO_OWNER
from .protocol import wait
from .server import PeerServer
from ..messages import Adopt, Given, PeerFetch

log = logging.getLogger(__name__)

TIMEOUT_S = 120.0  # a holder that answers nothing for this long is a failure, not a slow peer
SIZES_KEPT = 4096  # the latest files fetched from peers whose sizes give the typical one (a list of all grew per file)


class Peers:
    """What the node's service uses to fetch from other nodes' caches (``staging.peers: partition``).

    Args:
        comm: The leaders' communicator (mpi4py); this leader is ``comm.Get_rank()``.
        holders: Which leader holds each file at each step (``holders.job_holders``).
        source: The ``Source``, for falling back.
        root: The job's node-local directory.
        threads: Fetch threads (the number of prefetchers).
        telemetry: The leader pipeline's ``Telemetry``.
        choice: ``staging.peer_choice``: ``holder`` (a file another node
            holds is always asked of it) or ``measured`` (of whichever way
            the measured rates say is faster).
        wait_s: How long a holder may take (``staging.stall_timeout_s``; 0:
            ``TIMEOUT_S``); then the source is read, and counted.

    Attributes:
        model: The measured rates of both ways (``RateModel``).
    """

    def __init__(self, comm, holders, source, root, threads, telemetry, choice="holder", wait_s=TIMEOUT_S):
        self.comm, self.me, self.holders = comm, comm.Get_rank(), holders
        self.choice = choice
        self.model = RateModel()
        self.cache = None
        self.server = PeerServer(comm, root, telemetry, TIMEOUT_S, self._to_come, self._served,
                                 lambda: holders.low, self._moved, self._offered)
        self.fetcher = PeerFetcher(comm, source, root, threads, wait_s or TIMEOUT_S)
        self.fetcher_sizes = collections.deque(maxlen=SIZES_KEPT)
        self.given = collections.deque()  # Adopts from the server thread, for the service thread
        self._woken = False               # a Given is on its way to the service
        self._closing = False
        # Set by the service while a request waits for room that other nodes' fetches from here make.
        self.wake_on_served = False

    @property
    def conn(self):
        """Where the fetchers' ``Staged`` and ``Failure`` replies arrive."""
        return self.fetcher.conn

    def start(self):
        self.server.start()
        self.fetcher.start()

    def keep_in(self, cache):
        """Makes the node's ``Cache`` keep the files this node holds for the job (the others count on it)."""
        self.cache = cache
        cache.holders = self.holders

    def _to_come(self, index, seq):
        # Called from the server thread: it reads the cache's state, which only
        # this answer's timing depends on (a stale read answers PENDING or MISSING).
        return self.cache is not None and bool(self.holders.to_come(index, self.cache, seq))

    def _moved(self, index):
        # The server thread's: the leader this node gave a file to (-1: none); an int read is atomic.
        return int(self.holders.moved[index]) if self.holders.swaps else -1

    def _served(self, index, seq):
        # The server thread's: another leader fetched a file from here; the room it held may be awaited.
        self.holders.served(index, seq)
        if self.wake_on_served:
            self._wake()

    def _offered(self, peer, ask, handed):
        # The server thread's: what leader ``peer`` gave waits in ``given``.
        if self._closing:  # the service is gone: so is the room it could have taken
            self.holders.served(np.asarray(handed, dtype=np.int64), ask.seq)
            return
        self.given.append(Adopt(peer, ask.epoch, ask.offers, handed, ask.seq))
        self._wake()

    def _wake(self):
        # The service is woken by a message of a few bytes, at most one on its way.
        if not self._woken:
            self._woken = True
            try:
                self.fetcher.send(Given())
            except (OSError, ValueError):
                pass

    def take_given(self):
        """The service thread's: every ``Adopt`` waiting, oldest first."""
        self._woken = False  # before taking: one given after this wakes the service again
        out = []
        while self.given:
            out.append(self.given.popleft())
        return out

    def route(self, indices, sizes, seq):
        """Splits files to fetch at step ``seq`` into ``([(holder, files)...], from the shared file system)``.

        A file another node holds goes to that node (with ``measured``, when
        the model expects that to be faster than opening it on the shared
        file system), unless that node stopped answering.
        """
        owners = self.holders.holder(indices, seq, self.me)
        if self.holders.swaps:  # a file this node gave away is asked of the node it went to
            gone = self.holders.reclaim(indices)
            owners = np.where(gone >= 0, gone, owners)
        elsewhere = (owners != NO_OWNER) & (owners != self.me)
        if self.fetcher.silent:
            elsewhere &= ~np.isin(owners, list(self.fetcher.silent))
        if self.choice == "holder" or not elsewhere.any():
            ask = elsewhere
        else:
            ask = np.zeros(len(indices), dtype=bool)
            ask[elsewhere] = self.model.peer_faster(sizes[elsewhere])
        groups = [(int(o), indices[ask & (owners == o)]) for o in np.unique(owners[ask])]
        return groups, indices[~ask]

    def measure(self, msg):
        """Feeds the model with how long a fetch (a ``Staged``) took, by the way it went."""
        copied = [nbytes for _, nbytes in msg.done if nbytes > 0]
        if msg.route == "peer":
            if len(copied) == len(msg.done):
                self.model.from_peer(len(copied), sum(copied), msg.seconds)
                self.fetcher_sizes.extend(copied)
        elif copied and len(copied) == len(msg.done):  # a file already there would make the open look free
            self.model.from_source(len(copied), sum(copied), msg.seconds)

    def submit(self, task, epoch, step, owner, files, seq=-1, offers=()):
        """Queues ``files`` (``(index, relpath, size, mtime_ns)``) to be asked from leader ``owner`` for step ``seq``.

        ``offers``: files this node dropped for them, given to ``owner`` (``swaps.offered``).
        """
        self.fetcher.tasks.put(PeerFetch(task, epoch, step, owner, files, seq, offers))

    def close(self, wait_s, timeout_s):
        """Stops fetching; serves the other leaders until all have stopped fetching too, or ``wait_s`` passed.

        Args:
            wait_s: How long to keep serving; 0 on an error path, where the
                other leaders may never get here.
            timeout_s: How long threads get to end.
        """
        self._closing = True
        self.fetcher.stop(timeout_s)
        typical = np.array([float(np.median(self.fetcher_sizes))]) if len(self.fetcher_sizes) else None
        if typical is not None and self.model.peer.count and self.model.source.count:
            log.info("stager: node leader %d: a %d-byte file takes %.2f ms from a peer, %.2f ms from the source "
                     "(%d and %d measurements)", self.me, typical[0], 1e3 * self.model.peer.predict(typical)[0],
                     1e3 * self.model.source.predict(typical)[0], self.model.peer.count, self.model.source.count)
        if wait_s:
            # Every leader enters once its own fetches are done; until all
            # have, this one's server still answers them.
            try:
                wait(self.comm.Ibarrier(), time.monotonic() + wait_s, "the other node leaders to finish fetching")
            except OSError:
                pass
        self.server.stop(timeout_s)
