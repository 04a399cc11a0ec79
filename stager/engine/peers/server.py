"""A node leader's peer server: answers other leaders' requests for files it holds."""

import logging
import threading
import time

from .protocol import ASK, PeerTimeout, serve
from ... import telemetry as tm

log = logging.getLogger(__name__)


class PeerServer:
    """A thread of the node leader that sends local copies to the leaders that ask.

    It reads the job directory, not the cache: a published file is whole, so
    whatever it finds it can send, and a file the cache removes meanwhile
    stays readable through the descriptor it holds (``protocol.serve``).

    Args:
        comm: The leaders' communicator (mpi4py).
        root: The job's node-local directory.
        telemetry: Where each answer is recorded (``SERVED``).
        timeout_s: How long a requester may take to receive an answer.
        to_come: Callable ``(index, seq) -> bool``: whether a file not here
            yet will be, for the requester's step ``seq`` (this node reads
            it before that step and has not staged it so far).
        on_served: Callable ``(index, seq)``: a file was sent for the
            requester's step ``seq``.
        position: Callable: this node's position (its slowest rank's latest
            request), sent with each ``PENDING``.
        moved: Callable ``(index) -> rank``: the leader a file was given to, or -1.
        on_offers: Callable ``(peer, ask, handed)``: an ``Ask`` came with files
            offered (called once it is answered); ``handed``: the files sent
            in exchange, for which ``on_served`` is left to it.
    """

    def __init__(self, comm, root, telemetry, timeout_s, to_come, on_served=lambda index, seq: None,
                 position=lambda: -1, moved=lambda index: -1, on_offers=lambda peer, ask, handed: None):
        self.comm, self.root, self.telemetry, self.timeout_s = comm, root, telemetry, timeout_s
        self.to_come, self.on_served, self.position = to_come, on_served, position
        self.moved, self.on_offers = moved, on_offers
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stager-peer-server", daemon=True)

    def start(self):
        self._thread.start()

    def _run(self):
        from mpi4py import MPI  # deferred: only rank processes import MPI

        status = MPI.Status()
        pause = 20e-6
        while not self._halt.is_set():
            if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=ASK, status=status):
                # Polled, not blocking: a blocking receive in MPICH spins a core.
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
                continue
            pause = 20e-6
            peer = status.Get_source()
            ask = self.comm.recv(source=peer, tag=ASK)
            handed = []
            try:
                to_come = lambda index, seq=ask.seq: self.to_come(index, seq)  # noqa: E731
                for index, sent in serve(self.comm, peer, ask, self.root, self.timeout_s, to_come,
                                         self.position, self.moved):
                    self.telemetry.record(tm.SERVED, index, sent, ask.epoch)
                    if sent > 0 and ask.offers:
                        handed.append(index)
                    elif sent > 0:
                        self.on_served(index, ask.seq)
            except (OSError, PeerTimeout) as exc:
                log.warning("stager: could not answer node leader %s: %s", peer, exc)
            if ask.offers:
                # After the answer: the room the files handed on leave is what the files offered take.
                # Until the service keeps them, the files handed on stay held here, so that its own
                # fetches meanwhile do not take that room (the offers would find none and be lost).
                self.on_offers(peer, ask, tuple(handed))

    def stop(self, timeout_s):
        self._halt.set()
        self._thread.join(timeout=timeout_s)
