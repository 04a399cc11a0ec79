"""The node's staging service: one pool of prefetchers shared by the node's ranks.

The node leader (local rank 0) owns the job's staging directory, the
prefetcher processes and a service thread. Every rank of the node, the leader
included, is a client: it asks for each of its upcoming minibatches
(``("need", seq, epoch, step, indices)``) and is told when all their files are
local (``("ready", seq, prefetch_seconds)``). The service copies a file at
most once however many ranks or epochs need it, and serves requests in
arrival order, so the node's prefetch capacity is shared and one rank's heavy
minibatch does not hold back its neighbours' for long.

The leader's own pipeline talks to the service over a pipe; the other ranks
of the node connect over a Unix socket in the (0700) job directory, with a
random key handed out by MPI, whenever they are ready: the service serves
whoever is connected meanwhile. A client that disconnects (``("bye",)``, or
its process died) is forgotten; ``close()`` waits for the others to leave
before the directory is removed, because they may still be reading from it.
If the service itself fails, every client is told why.
"""

import logging
import multiprocessing
import multiprocessing.connection as mpc
import os
import queue
import secrets
import threading
import traceback

import numpy as np

from .workerpool import WorkerPool
from .workers import prefetcher_main

log = logging.getLogger(__name__)

_ABSENT, _IN_FLIGHT, _STAGED = 0, 1, 2


def _split(missing, staging):
    """Splits a minibatch's missing files into prefetcher tasks.

    Whole minibatches per task would make the first one wait for a single
    prefetcher to open every file in turn, and leave most prefetchers idle
    at the end of an epoch; one file per task would cost a queue round trip
    per file. Automatic: as many tasks as prefetchers, a few files each.
    """
    if not len(missing):
        return []
    per = staging.files_per_task or -(-len(missing) // staging.prefetchers)
    return [missing[i:i + per] for i in range(0, len(missing), per)]


class StagingService:
    """Stages files for the node's ranks (runs on the node leader only).

    Args:
        config: The ``Config``.
        catalog: The job's ``Catalog``.
        local_dir: The job's node-local directory (already created).
        remote_clients: Ranks of this node other than the leader.
        stats: The leader pipeline's ``Stats``; staging totals go there.
        on_staged: Optional callable ``(relpath, bytes, epoch)`` per file copied.
        keep_fds: Descriptors the prefetchers keep open (see ``WorkerPool``).
    """

    def __init__(self, config, catalog, local_dir, remote_clients, stats, on_staged=None, keep_fds=()):
        self.config = config
        self.catalog = catalog
        self.local_dir = local_dir
        self.remote_clients = remote_clients
        self.stats = stats
        self.on_staged = on_staged
        self.keep_fds = keep_fds
        self.address = os.path.join(local_dir, ".service.sock") if remote_clients else None
        self.authkey = secrets.token_bytes(32)
        self.pool = None
        self._halt = threading.Event()
        self._incoming = queue.Queue()   # connections accepted, not yet served
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._wake_lock = threading.Lock()
        self._listener = None
        self._acceptor = None
        self._thread = None

    def start(self, ctx):
        """Starts the prefetchers, the acceptor and the service thread.

        Returns:
            The leader's own client connection.
        """
        self.pool = WorkerPool(ctx, "stager-prefetch", self.config.staging.prefetchers, prefetcher_main,
                               (self.catalog.root, self.local_dir), self.keep_fds)
        if self.remote_clients:
            try:
                os.unlink(self.address)  # left by a crashed run in a kept directory (ours, 0700)
            except FileNotFoundError:
                pass
            self._listener = mpc.Listener(self.address, family="AF_UNIX", backlog=self.remote_clients,
                                          authkey=self.authkey)
            self._acceptor = threading.Thread(target=self._accept, name="stager-accept", daemon=True)
            self._acceptor.start()
        own, theirs = multiprocessing.Pipe()
        self._thread = threading.Thread(target=self._run, args=(theirs,), name="stager-service", daemon=True)
        self._thread.start()
        return own

    def alive(self):
        """Whether the service thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def _accept(self):
        for _ in range(self.remote_clients):
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, mpc.AuthenticationError) as exc:
                if self._halt.is_set():
                    return
                log.warning("stager: a rank of this node failed to connect to the staging service: %s", exc)
                conn = None
            if self._halt.is_set():
                if conn is not None:
                    conn.close()
                return
            self._incoming.put(conn)
            self._wake()

    def _wake(self):
        with self._wake_lock:
            self._wake_w.send(None)

    def _run(self, own):
        loop = _Loop(self, own)
        try:
            loop.run()
        except BaseException as exc:
            log.exception("stager: staging service failed")
            loop.fail(("error", "prefetch", "service", None, None, None, type(exc).__name__,
                       f"the node's staging service failed: {type(exc).__name__}: {exc}", traceback.format_exc()))
        finally:
            for conn in loop.clients:
                conn.close()

    def close(self, wait_for_clients_s):
        """Stops the service once its clients have left, or after the wait.

        Args:
            wait_for_clients_s: How long to wait for other ranks to disconnect;
                0 on an error path, where peers may never come.
        """
        if self._thread is not None:
            self._thread.join(timeout=wait_for_clients_s)
            self._halt.set()
            self._wake()
            self._thread.join(timeout=self.config.processes.shutdown_timeout_s)
        if self._acceptor is not None and self._acceptor.is_alive():
            try:  # unblocks accept(); it sees the halt flag and returns
                mpc.Client(self.address, family="AF_UNIX", authkey=self.authkey).close()
            except (OSError, EOFError, mpc.AuthenticationError):
                pass
            self._acceptor.join(timeout=self.config.processes.shutdown_timeout_s)
        if self.pool is not None:
            self.pool.stop(self.config.processes.shutdown_timeout_s)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._wake_r.close()
        self._wake_w.close()


class _Waiter:
    """One client's request for a minibatch, until all its files are staged."""

    __slots__ = ("conn", "seq", "tasks", "files", "remaining")

    def __init__(self, conn, seq, tasks, files):
        self.conn, self.seq, self.tasks, self.files = conn, seq, tasks, files
        self.remaining = len(files)


class _Loop:
    """The service's scheduling state; lives in the service thread.

    A request waits on each of its files not yet staged and is answered when
    the last one is, so a reply costs the files it carries, not a scan of
    every waiting request.
    """

    def __init__(self, service, own):
        self.s = service
        self.catalog = service.catalog
        self.state = np.zeros(len(service.catalog), dtype=np.uint8)
        self.clients = [own]
        self.joined = 0          # remote clients accepted so far
        self.pending = set()     # _Waiter: requests not yet ready
        self.waiters = {}        # file index -> [_Waiter] that still need it
        self.task_time = {}      # task id -> seconds, until its waiter is answered
        self.next_task = 0
        self.failed = None       # the error sent to clients, once staging failed

    def run(self):
        s = self.s
        pool_conns = list(s.pool.conns)
        from_pool = set(pool_conns)
        while not s._halt.is_set() and (self.clients or self.joined < s.remote_clients):
            ready = mpc.wait(self.clients + pool_conns + [s._wake_r], timeout=1.0)
            for obj in ready:
                if obj is s._wake_r:
                    s._wake_r.recv()
                    self.admit()
                elif obj in from_pool:
                    try:
                        msg = obj.recv()
                    except (EOFError, OSError):
                        pool_conns.remove(obj)
                        proc = s.pool.by_conn[obj]
                        proc.join(1.0)
                        msg = ("error", "prefetch", proc.name, None, None, None, "WorkerDied",
                               f"{proc.name} (pid {proc.pid}) died (exit code {proc.exitcode})", None)
                    self.on_reply(msg)
                else:
                    self.on_client(obj)

    def admit(self):
        while True:
            try:
                conn = self.s._incoming.get_nowait()
            except queue.Empty:
                return
            self.joined += 1
            if conn is not None:
                self.clients.append(conn)
                if self.failed is not None:
                    self.send(conn, self.failed)

    def on_client(self, conn):
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = ("bye",)
        if msg[0] == "fail":
            self.fail(("error", "pipeline", "node leader", None, None, None, "PeerFailed", msg[1], None),
                      skip=conn)
            return
        if msg[0] == "bye":
            self.clients.remove(conn)
            for waiter in [w for w in self.pending if w.conn is conn]:
                self.forget(waiter)
            conn.close()
            return
        _, seq, epoch, step, indices = msg
        if self.failed is not None:
            self.send(conn, self.failed)
            return
        missing = indices[self.state[indices] == _ABSENT]
        self.state[missing] = _IN_FLIGHT
        tasks = []
        for chunk in _split(missing, self.s.config.staging):
            task = self.next_task
            self.next_task += 1
            files = [(int(i), self.catalog.path(i), int(self.catalog.sizes[i]), self.catalog.mtime(i))
                     for i in chunk]
            self.s.pool.tasks.put((task, epoch, step, files))
            self.task_time[task] = None
            tasks.append(task)
        unique = np.unique(indices)
        waiter = _Waiter(conn, seq, tasks, unique[self.state[unique] != _STAGED].tolist())
        if not waiter.remaining:
            self.answer(waiter)
            return
        self.pending.add(waiter)
        for index in waiter.files:
            self.waiters.setdefault(index, []).append(waiter)

    def fail(self, error, skip=None):
        """Tells every client (but ``skip``) why staging stopped; later requests get the same answer."""
        self.failed = error
        for waiter in list(self.pending):
            self.forget(waiter)
        self.waiters.clear()
        for conn in self.clients:
            if conn is not skip:
                self.send(conn, error)

    def on_reply(self, msg):
        if msg[0] == "error":
            if self.failed is None:
                self.fail(msg)
            return
        stats = self.s.stats
        _, task, _worker, done, seconds, epoch = msg
        if task in self.task_time:
            self.task_time[task] = seconds
        stats.prefetch_s += seconds
        for index, nbytes in done:
            self.state[index] = _STAGED
            if nbytes:
                stats.files_staged += 1
                stats.bytes_staged += nbytes
                if self.s.on_staged is not None:
                    self.s.on_staged(self.catalog.path(index), nbytes, epoch)
            else:
                stats.files_present += 1
            for waiter in self.waiters.pop(index, ()):
                waiter.remaining -= 1
                if not waiter.remaining and waiter in self.pending:
                    self.pending.discard(waiter)
                    self.answer(waiter)

    def answer(self, waiter):
        seconds = sum(self.task_time.pop(t, None) or 0.0 for t in waiter.tasks)
        self.send(waiter.conn, ("ready", waiter.seq, seconds))

    def forget(self, waiter):
        """Drops a request whose client left or that staging failed under."""
        self.pending.discard(waiter)
        for t in waiter.tasks:
            self.task_time.pop(t, None)

    def send(self, conn, msg):
        try:
            conn.send(msg)
        except (OSError, EOFError):
            pass  # that client left; its end-of-file is handled when read
