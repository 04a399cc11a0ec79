"""The node service's scheduling state: requests, prefetcher tasks, the cache.

Lives in the service thread (``service.py``), which alone touches it. A
request (``Need``) pins its files in the ``Cache`` and waits on each file
not yet staged; its absent files are fetched once the cache has room for
them (requests that need room are admitted in arrival order). It is answered
(``Ready``) when its last file is staged, so a reply costs the files it
carries, not a scan of every waiting request. A ``Release`` marks a request
read; its files are unpinned when ``readpins.ReadPins`` says so, and the
policy removes what it will not keep, which may make room for the next
request waiting. How the files to fetch become prefetcher and peer tasks
is ``dispatch.py``'s; what a prefetcher's ``Staged`` does, ``fetched.py``'s.
"""

import collections
import multiprocessing.connection as mpc
import os
import time

import numpy as np

from . import fetched
from .dispatch import Dispatch, Request
from .readpins import ReadPins
from .roomwait import RoomWait
from .stalls import stall_failure
from ..messages import Bye, Fail, Failure, Given, Hello, Need, Ready, Release, Staged
from ..peers import swaps
from ..workers.pool import RETIRED
from ... import telemetry as tm
from ...cache import ABSENT, CacheFull, human


class ServiceLoop:
    """What the service thread does with each message.

    Args:
        service: The ``StagingService`` (its pool, catalog, staging section,
            cache, telemetry, wake channel and incoming connections).
        own: The leader rank's own connection.
    """

    def __init__(self, service, own):
        self.s = service
        self.catalog = service.catalog.files  # what is staged: files, or the containers samples are packed in
        self.to_files = service.catalog.file_index
        self.sample_sizes = None if service.catalog.containers is None else service.catalog.sizes
        self.cache = service.cache
        self.clients = [own]
        self.rank_of = {}        # connection -> the rank that said Hello on it
        self.joined = 0          # remote clients accepted so far
        self.requests = {}       # (conn, seq) -> Request, until read (Release)
        self.pins = ReadPins()   # requests whose files are pinned, until read and let go
        self.waiting = {}        # file index -> [Request] still waiting for it
        self.admitting = collections.deque()  # requests with files to fetch, in arrival order
        self.no_space = collections.Counter()  # file index -> fetches that met a full disk
        self.dispatch = Dispatch(service)
        self.epoch = 0           # of the latest request, for the cache's counters
        self.peak = 0
        self.failed = None       # the Failure sent to clients, once staging failed
        self.next_stall_check = 0.0
        self.room = RoomWait(service.cache, service.peers, service.staging.peer_swaps)

    def run(self):
        s = self.s
        peer_conns = [s.peers.conn] if s.peers is not None else []
        dead = set()  # prefetchers' pipes that reached end-of-file
        while self.running():
            # The pool's pipes are read afresh each turn: an ``auto`` pool grows and shrinks.
            pool_conns = [c for c in s.pool.conns if c not in dead]
            for obj in mpc.wait(self.clients + pool_conns + peer_conns + [s.wake.conn], timeout=1.0):
                if obj is s.wake.conn:
                    s.wake.recv()
                    self.admit_clients()
                elif s.peers is not None and obj is s.peers.conn:
                    self.on_reply(obj.recv())
                elif obj in s.pool.by_conn:
                    msg = s.pool.receive(obj)
                    if msg is RETIRED:
                        continue
                    if isinstance(msg, Failure) and msg.cause == "WorkerDied":
                        dead.add(obj)
                    self.on_reply(msg)
                else:
                    self.on_client(obj)
            self.check_stalls()
            if self.room.waiting:
                self.admit()  # a fetch from here since, or the wait is over: then room is made as without peers
            if s.resizer is not None and self.failed is None and s.resizer.resize():
                self.dispatch.feed()

    def running(self):
        """Whether to serve on: until halted, while clients are connected or still to come."""
        return not self.s.halted() and (self.clients or self.joined < self.s.remote_clients)

    def check_stalls(self):
        """Fails the job once a prefetcher has waited more than ``staging.stall_timeout_s`` for one file.

        Checked at most about once a second (the wait above times out after
        one), so a busy service pays nothing for it.
        """
        limit = self.s.staging.stall_timeout_s
        now = time.monotonic()
        if not limit or self.failed is not None or now < self.next_stall_check:
            return
        self.next_stall_check = now + min(1.0, limit / 4)
        failure = stall_failure(self.s.progress, self.s.pool, self.catalog, self.s.source, limit)
        if failure is not None:
            self.fail(failure)

    def admit_clients(self):
        for conn in self.s.accepted():
            self.joined += 1
            if conn is not None:
                self.clients.append(conn)
                if self.failed is not None:
                    self.send(conn, self.failed)

    def on_client(self, conn, msg=None):
        try:
            msg = conn.recv() if msg is None else msg
        except (EOFError, OSError):
            msg = Bye()
        if isinstance(msg, Need):
            self.need(conn, msg)
        elif isinstance(msg, Release):
            self.release(self.requests.pop((conn, msg.seq), None))
        elif isinstance(msg, Hello):
            self.hello(conn, msg.rank, msg)
        elif isinstance(msg, Fail):
            self.fail(Failure("pipeline", "node leader", cause="PeerFailed", message=msg.reason), skip=conn)
        elif isinstance(msg, Bye):
            self.clients.remove(conn)
            self.forget(conn)
            conn.close()

    def hello(self, conn, key, msg):
        """A client's ``Hello``: its plan joins the cache's future under ``key``."""
        self.rank_of[conn] = key
        self.pins.hello(conn, msg.ahead)
        self.cache.add_plan(key, msg.plan)

    # Requests -------------------------------------------------------------

    def need(self, conn, msg):
        if self.failed is not None:
            self.send(conn, self.failed)
            return
        cache = self.cache
        # First: the future as of the rank's previous request still counts the files this one reads.
        self.unpin(self.pins.asking(conn, msg.seq))
        if conn in self.rank_of:
            cache.advance(self.rank_of[conn], msg.seq)
        self.epoch = msg.epoch
        files = np.unique(self.to_files(msg.indices))
        missing, pending = cache.pin(files, msg.seq)
        self.s.telemetry.record(tm.REQUEST, msg.epoch, len(files) - len(missing), len(missing))
        self.s.telemetry.record(tm.LOCAL, msg.epoch, *self.read_locally(msg.indices, files, missing))
        request = Request(conn, msg, files, missing, len(pending))
        self.requests[(conn, msg.seq)] = request
        self.pins.pinned(conn, msg.seq, request)
        for index in pending.tolist():
            self.waiting.setdefault(index, []).append(request)
        if len(missing):
            self.admitting.append(request)
            self.admit()
        elif not request.remaining:
            self.answer(request)

    def read_locally(self, indices, files, missing):
        """What a minibatch's readers read from copies already here: ``(bytes, samples)`` (of a container: its
        samples asked for, with their own bytes, not the container's)."""
        if self.sample_sizes is None:
            return int(self.cache.sizes[files].sum() - self.cache.sizes[missing].sum()), len(files) - len(missing)
        here = ~np.isin(self.to_files(indices), missing)
        return int(self.sample_sizes[indices[here]].sum()), int(here.sum())

    def admit(self):
        """Starts the fetches of waiting requests, in arrival order, while the cache has room."""
        cache = self.cache
        while self.admitting and self.failed is None:
            request = self.admitting[0]
            missing = request.missing[cache.state[request.missing] == ABSENT]  # an earlier one may fetch some
            try:
                victims = cache.room_for(int(cache.sizes[missing].sum()), self.room.owed_before(request.seq))
            except CacheFull as exc:
                self.fail(Failure("prefetch", "service", request.epoch, request.step, cause="CacheFull",
                                  message=str(exc)))
                return
            if victims is None:
                read = self.pins.oldest_read()
                if read is not None:
                    self.unpin([read])
                    continue
                if cache.waiting_for_peers:
                    self.room.begin()
                    return
                if len(self.requests) == len(self.admitting) and not cache.in_flight_bytes:
                    self.fail(Failure("prefetch", "service", request.epoch, request.step, cause="CacheFull",
                                      message=f"staging.capacity {human(cache.capacity)} cannot hold minibatch "
                                              f"{request.step} of epoch {request.epoch} beside the files pinned "
                                              f"for reading ({human(cache.used)} used)"))
                return  # a Release will make room
            self.room.end()
            offers = swaps.offered(victims, cache, self.catalog, self.s.local_dir) if self.s.peers else {}
            self.remove(victims, offers)
            self.admitting.popleft()
            self.fetch(request, missing, offers)
            if not request.remaining and not request.answered:
                self.answer(request)

    def fetch(self, request, missing, offers=None):
        if not len(missing):
            return
        self.cache.fetching(missing, request.seq)
        if self.cache.used > self.peak:
            self.peak = self.cache.used
            self.s.telemetry.record(tm.USAGE, self.epoch, self.peak)
        self.dispatch.submit(request, missing, offers)

    def release(self, request):
        """A request's minibatch was read (or its client left): its files go once ``ReadPins`` lets them."""
        if request is None:
            return
        self.dispatch.forget(request)
        if request in self.admitting:  # its client left before it could be admitted
            self.admitting.remove(request)
        self.unpin(self.pins.read(request.conn, request.seq))
        self.admit()

    def unpin(self, requests):
        for request in requests:
            self.remove(self.cache.release(request.files))

    def forget(self, conn):
        """A client left: whatever it asked for, read or not, is unpinned."""
        for key in [k for k in self.requests if k[0] is conn]:
            self.release(self.requests.pop(key))
        self.unpin(self.pins.leave(conn))
        self.admit()

    def remove(self, indices, offered=()):
        """Deletes files the policy let go from the job directory (``DROPPED`` too: read again, not ``offered``)."""
        for index, again in zip(indices, self.cache.read_again(indices) if len(indices) else ()):
            again = again and index not in offered
            try:
                os.unlink(os.path.join(self.s.local_dir, self.catalog.path(index)))
            except FileNotFoundError:
                pass
            for kind in (tm.EVICTED, tm.DROPPED)[:1 + again]:
                self.s.telemetry.record(kind, int(index), int(self.cache.sizes[index]), self.epoch)
            self.cache.removed(index)

    # Prefetchers ----------------------------------------------------------

    def on_reply(self, msg):
        if isinstance(msg, Given):  # other nodes gave files, or fetched what this one kept for them
            for adopt in self.s.peers.take_given():
                swaps.adopt(self, adopt)
            self.admit()
            return
        if isinstance(msg, Failure):
            if self.failed is None:
                self.fail(msg)
            return
        assert isinstance(msg, Staged), msg
        full = fetched.staged(self, msg)
        if full:
            fetched.out_of_space(self, full, msg.epoch)

    # Answers --------------------------------------------------------------

    def fail(self, failure, skip=None):
        """Tells every client (but ``skip``) why staging stopped; later requests get the same answer."""
        self.failed = failure
        self.dispatch.clear()
        self.waiting.clear()
        self.admitting.clear()
        for conn in self.clients:
            if conn is not skip:
                self.send(conn, failure)

    def answer(self, request):
        request.answered = True
        self.send(request.conn, self.ready(request, *self.dispatch.seconds(request)))

    def ready(self, request, seconds, span):
        """The answer to a request whose files are all local."""
        return Ready(request.seq, seconds, span=span, spare=self.dispatch.spare())

    def send(self, conn, msg):
        try:
            conn.send(msg)
        except (OSError, EOFError):
            pass  # that client left; its end-of-file is handled when read
