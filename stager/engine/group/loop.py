"""The group service's scheduling state: the node service's, with jobs told apart.

Every rank of every attached job is a client. What differs from one job's
node service (``service_loop.py``):

- a connection's first message is ``Join``: the settings every job of the
  group must agree on are compared with the group's, and a job that differs
  is refused with the setting named;
- clients come and go: the service runs until the last one leaves, and a
  client that fails or dies only detaches (its pins are released, its plan
  leaves the cache's future); a failure of staging itself (the source, the
  local disk) still reaches everyone;
- each ``Ready`` says what the minibatch owed to other jobs (files they
  staged) and what it fetched;
- a rank with a decoded stream asks (``Claim``) before decoding each
  minibatch, when a reader of its is free for it: it decodes and publishes
  it, takes it from the shelf, or waits for the job decoding it
  (``shelf.py``). Claiming at read time, not when the files arrive, lets
  the readers of every job in step decode for all of them. A rank that
  took a minibatch holds its file until its arrays are gone (``LetGo``),
  or until it leaves.
"""

import time

import numpy as np

from .shelf import OWN, PUBLISH, SHARED, WAIT
from ..messages import Bye, Claim, Claimed, Fail, Hello, Join, LetGo, Need, Ready, Release, Welcome
from ..node.service_loop import ServiceLoop
from ...cache import ABSENT


class _Client:
    __slots__ = ("number", "stream", "key")

    def __init__(self, number):
        self.number = number                 # one per job, for ``fetched_by``
        self.stream = None
        self.key = None                      # this client's key in the cache's future


class GroupLoop(ServiceLoop):
    """What the group service's thread does with each message.

    Args:
        service: The ``daemon.GroupService``.
    """

    def __init__(self, service):
        super().__init__(service, None)
        self.clients = []
        self.who = {}                  # connection -> _Client, once joined
        self.jobs = {}                 # job name -> number
        self.next_key = 0
        self.counts = {}               # (conn, seq) -> (files, bytes) from others, (files, bytes) fetched
        self.roles = {}                # (conn, seq) -> (verdict, stream, key) on the shelf
        self.held = {}                 # conn -> {seq: (stream, key)}: shelf files its arrays still view
        self.fetched_by = np.full(len(self.catalog.sizes), -1, dtype=np.int32)  # which job fetched each file
        self.deadline = time.monotonic() + service.first_join_s
        self.next_wait_check = 0.0

    def running(self):
        s = self.s
        if s.halted():
            return False
        return bool(self.clients) or (not self.joined and time.monotonic() < self.deadline)

    def admit_clients(self):
        for conn in self.s.accepted():
            self.joined += 1
            self.clients.append(conn)

    def on_client(self, conn):
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = Bye()
        client = self.who.get(conn)
        if client is None and not isinstance(msg, (Join, Bye)):
            msg = Bye()  # a client speaks Join first
        if isinstance(msg, Join):
            self.join(conn, msg)
        elif isinstance(msg, Need):
            self.need(conn, msg)
        elif isinstance(msg, Claim):
            self.claim(conn, msg.seq)
        elif isinstance(msg, Release):
            self.release(self.requests.pop((conn, msg.seq), None), msg.published, msg.held)
        elif isinstance(msg, LetGo):
            hold = self.held.get(conn, {}).pop(msg.seq, None)
            if hold is not None:
                self.s.shelf.let_go(*hold)
        elif isinstance(msg, Hello):
            client.key = self.next_key
            self.next_key += 1
            client.stream = msg.stream
            self.hello(conn, client.key, msg)
        elif isinstance(msg, (Bye, Fail)):
            # A job that fails or ends detaches; the others go on.
            self.leave(conn)

    def check_stalls(self):
        super().check_stalls()
        now = time.monotonic()
        if now >= self.next_wait_check:
            self.next_wait_check = now + 0.25
            for request in self.s.shelf.overdue(now):  # the job decoding it is late: do not wait on it
                self.roles.pop((request.conn, request.seq), None)
                self.send(request.conn, Claimed(request.seq, OWN, ""))

    def join(self, conn, msg):
        ours = self.s.settings
        for key, value in msg.settings.items():
            if ours.get(key) != value:
                self.send(conn, Welcome(refused=(
                    f"staging.share {self.s.name!r}: the group's service on this node runs with {key} = "
                    f"{ours.get(key)!r} (set by {self.s.founder}), this job ({msg.job}) has {value!r}; jobs of one "
                    f"group must agree on {key}: change it, or name another group")))
                self.leave(conn)
                return
        number = self.jobs.setdefault(msg.job.split(" rank ")[0], len(self.jobs))
        self.who[conn] = _Client(number)
        jobs = len({c.number for c in self.who.values()})  # this one's too
        self.send(conn, Welcome(self.s.local_dir, self.s.ahead, rates=self.s.rates, counts=self.s.counts() + (jobs,),
                                capacity=self.s.capacity))
        if self.failed is not None:
            self.send(conn, self.failed)

    def leave(self, conn):
        if conn not in self.clients:
            return
        self.clients.remove(conn)
        self.forget(conn)
        for hold in self.held.pop(conn, {}).values():  # its arrays may outlive its pipe: files not reused
            self.s.shelf.let_go(*hold, left=True)
        client = self.who.pop(conn, None)
        if client is not None and client.key is not None:
            self.cache.drop_plan(client.key)
        self.rank_of.pop(conn, None)
        if self.clients:
            conn.close()
        else:  # the last one out: it learns (end-of-file) once everything is removed
            self.s.last.append(conn)

    def need(self, conn, msg):
        client = self.who[conn]
        cache = self.cache
        files = np.unique(self.to_files(msg.indices))
        absent = files[cache.state[files] == ABSENT]
        present = files[cache.state[files] != ABSENT]
        theirs = present[self.fetched_by[present] != client.number]
        self.counts[(conn, msg.seq)] = (len(theirs), int(cache.sizes[theirs].sum()),
                                        len(absent), int(cache.sizes[absent].sum()))
        self.fetched_by[absent] = client.number
        super().need(conn, msg)

    def ready(self, request, seconds, span):
        return Ready(request.seq, seconds, self.counts.pop((request.conn, request.seq), None), span)

    def claim(self, conn, seq):
        """Who decodes the minibatch a rank is about to read: it (``publish``), another job (``shared``), or
        another job that is at it now (the answer comes once it has published, or left)."""
        request, client = self.requests.get((conn, seq)), self.who.get(conn)
        if request is None or client is None or client.stream is None:
            return
        key = (request.epoch, request.step)
        verdict, path = self.s.shelf.claim(client.stream, key, request, time.monotonic())
        self.roles[(conn, seq)] = (verdict, client.stream, key)
        if verdict != WAIT:
            self.send(conn, Claimed(seq, verdict, path))

    def release(self, request, published=False, held=False):
        if request is None:
            return
        self.counts.pop((request.conn, request.seq), None)  # released before its answer: its client left
        role = self.roles.pop((request.conn, request.seq), None)
        if role is not None:
            verdict, stream, key = role
            shelf = self.s.shelf
            if verdict == SHARED and held:
                self.held.setdefault(request.conn, {})[request.seq] = (stream, key)
            elif verdict == SHARED:
                shelf.let_go(stream, key)
            elif verdict == PUBLISH:
                for waiter, answer, path in shelf.published(stream, key, request, published, time.monotonic()):
                    self.roles[(waiter.conn, waiter.seq)] = (answer, stream, key)
                    self.send(waiter.conn, Claimed(waiter.seq, answer, path))
            elif verdict == WAIT:  # left while waiting for another rank's decoding
                shelf.withdraw(stream, key, request)
        super().release(request)
