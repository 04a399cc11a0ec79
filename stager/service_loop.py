"""The node service's scheduling state: requests, prefetcher tasks, the cache.

Lives in the service thread (``service.py``), which alone touches it. A
request (``Need``) pins its files in the ``Cache``, queues prefetcher tasks
for those absent, and waits on each file not yet staged; it is answered
(``Ready``) when the last one is, so a reply costs the files it carries, not a
scan of every waiting request. A ``Release`` unpins a request's files and
lets the policy remove what it will not keep.
"""

import multiprocessing.connection as mpc
import os

import numpy as np

from . import telemetry as tm
from .cache import Cache
from .messages import Bye, Fail, Failure, Hello, Need, Ready, Release, StageTask, Staged


def split_tasks(missing, prefetchers, files_per_task):
    """Splits a minibatch's missing files into prefetcher tasks.

    Whole minibatches per task would make the first one wait for a single
    prefetcher to open every file in turn, and leave most prefetchers idle
    at the end of an epoch; one file per task would cost a queue round trip
    per file. Automatic (``files_per_task`` 0): as many tasks as prefetchers.
    """
    if not len(missing):
        return []
    per = files_per_task or -(-len(missing) // prefetchers)
    return [missing[i:i + per] for i in range(0, len(missing), per)]


class _Request:
    """One client's minibatch, from ``Need`` until ``Release``."""

    __slots__ = ("conn", "seq", "tasks", "files", "remaining")

    def __init__(self, conn, seq, tasks, files, remaining):
        self.conn, self.seq, self.tasks, self.files, self.remaining = conn, seq, tasks, files, remaining


class ServiceLoop:
    """What the service thread does with each message.

    Args:
        service: The ``StagingService`` (its pool, catalog, staging section,
            telemetry, wake channel and incoming connections).
        own: The leader rank's own connection.
    """

    def __init__(self, service, own):
        self.s = service
        self.catalog = service.catalog
        self.cache = Cache(service.catalog.sizes, service.staging.cache_policy)
        self.clients = [own]
        self.joined = 0          # remote clients accepted so far
        self.requests = {}       # (conn, seq) -> _Request, until released
        self.waiting = {}        # file index -> [_Request] still waiting for it
        self.task_time = {}      # task id -> seconds, until its request is answered
        self.next_task = 0
        self.failed = None       # the Failure sent to clients, once staging failed

    def run(self):
        s = self.s
        pool_conns = list(s.pool.conns)
        from_pool = set(pool_conns)
        while not s.halted() and (self.clients or self.joined < s.remote_clients):
            for obj in mpc.wait(self.clients + pool_conns + [s.wake.conn], timeout=1.0):
                if obj is s.wake.conn:
                    s.wake.recv()
                    self.admit()
                elif obj in from_pool:
                    msg = s.pool.receive(obj)
                    if isinstance(msg, Failure) and msg.cause == "WorkerDied":
                        pool_conns.remove(obj)
                    self.on_reply(msg)
                else:
                    self.on_client(obj)

    def admit(self):
        for conn in self.s.accepted():
            self.joined += 1
            if conn is not None:
                self.clients.append(conn)
                if self.failed is not None:
                    self.send(conn, self.failed)

    def on_client(self, conn):
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = Bye()
        if isinstance(msg, Need):
            self.need(conn, msg)
        elif isinstance(msg, Release):
            self.release(self.requests.pop((conn, msg.seq), None))
        elif isinstance(msg, Hello):
            self.cache.add_plan(msg.rank, msg.plan)
        elif isinstance(msg, Fail):
            self.fail(Failure("pipeline", "node leader", cause="PeerFailed", message=msg.reason), skip=conn)
        elif isinstance(msg, Bye):
            self.clients.remove(conn)
            for key in [k for k in self.requests if k[0] is conn]:
                self.release(self.requests.pop(key))
            conn.close()

    def need(self, conn, msg):
        if self.failed is not None:
            self.send(conn, self.failed)
            return
        s, telemetry = self.s, self.s.telemetry
        missing, pending = self.cache.request(msg.indices)
        tasks = []
        for chunk in split_tasks(missing, s.staging.prefetchers, s.staging.files_per_task):
            task = self.next_task
            self.next_task += 1
            files = [(int(i), self.catalog.path(i), int(self.catalog.sizes[i]), self.catalog.mtime(i))
                     for i in chunk]
            s.pool.tasks.put(StageTask(task, msg.epoch, msg.step, files))
            self.task_time[task] = None
            tasks.append(task)
        if tasks:
            telemetry.record(tm.QUEUED, tasks[0], len(tasks), len(missing))
        request = _Request(conn, msg.seq, tasks, np.unique(msg.indices), len(pending))
        self.requests[(conn, msg.seq)] = request
        if not request.remaining:
            self.answer(request)
            return
        for index in pending.tolist():
            self.waiting.setdefault(index, []).append(request)

    def release(self, request):
        """A request's minibatch was read (or its client left): unpin, let the policy remove."""
        if request is None:
            return
        for t in request.tasks:
            self.task_time.pop(t, None)
        for index in self.cache.release(request.files):
            try:
                os.unlink(os.path.join(self.s.local_dir, self.catalog.path(index)))
            except FileNotFoundError:
                pass
            self.cache.removed(index)

    def fail(self, failure, skip=None):
        """Tells every client (but ``skip``) why staging stopped; later requests get the same answer."""
        self.failed = failure
        self.waiting.clear()
        self.task_time.clear()
        for conn in self.clients:
            if conn is not skip:
                self.send(conn, failure)

    def on_reply(self, msg):
        if isinstance(msg, Failure):
            if self.failed is None:
                self.fail(msg)
            return
        assert isinstance(msg, Staged), msg
        telemetry = self.s.telemetry
        if msg.task in self.task_time:
            self.task_time[msg.task] = msg.seconds
        telemetry.record(tm.TASK, msg.task, len(msg.done), msg.seconds)
        on_staged = self.s.on_staged
        for index, nbytes in msg.done:
            self.cache.staged(index)
            telemetry.record(tm.STAGED, index, nbytes)
            if nbytes and on_staged is not None:
                on_staged(self.catalog.path(index), nbytes, msg.epoch)
            for request in self.waiting.pop(index, ()):
                request.remaining -= 1
                if not request.remaining:
                    self.answer(request)

    def answer(self, request):
        seconds = sum(self.task_time.pop(t, None) or 0.0 for t in request.tasks)
        self.send(request.conn, Ready(request.seq, seconds))

    def send(self, conn, msg):
        try:
            conn.send(msg)
        except (OSError, EOFError):
            pass  # that client left; its end-of-file is handled when read
