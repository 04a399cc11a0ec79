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
random key handed out by MPI. A client that disconnects (``("bye",)`` or its
process died) is forgotten; ``close()`` waits for the others to leave before
the directory is removed, because they may still be reading from it.
"""

import logging
import multiprocessing
import multiprocessing.connection as mpc
import os
import queue
import secrets
import threading
import time

import numpy as np

from .workers import prefetcher_main

log = logging.getLogger(__name__)

_ABSENT, _IN_FLIGHT, _STAGED = 0, 1, 2


class StagingService:
    """Stages files for the node's ranks (runs on the node leader only).

    Args:
        config: The ``Config``.
        catalog: The job's ``Catalog``.
        local_dir: The job's node-local directory (already created).
        remote_clients: Ranks of this node other than the leader.
        stats: The leader pipeline's ``Stats``; staging totals go there.
        on_staged: Optional callable ``(relpath, bytes, epoch)`` per file copied.
    """

    def __init__(self, config, catalog, local_dir, remote_clients, stats, on_staged=None):
        self.config = config
        self.catalog = catalog
        self.local_dir = local_dir
        self.remote_clients = remote_clients
        self.stats = stats
        self.on_staged = on_staged
        self.address = os.path.join(local_dir, ".service.sock") if remote_clients else None
        self.authkey = secrets.token_bytes(32)
        self.procs = []
        self._halt = threading.Event()
        self._accepting = False
        self._thread = None
        self._listener = None

    def start(self, ctx):
        """Starts the prefetchers and the service thread.

        Returns:
            The leader's own client connection.
        """
        cfg = self.config
        self._stop = ctx.Event()
        self._tasks = ctx.Queue()
        self._replies = ctx.Queue()
        parent = os.getpid()
        for i in range(cfg.staging.prefetchers):
            proc = ctx.Process(target=prefetcher_main, name=f"stager-prefetch-{i}", daemon=True,
                               args=(i, parent, self.catalog.root, self.local_dir, self._tasks, self._replies,
                                     self._stop))
            proc.start()
            self.procs.append(proc)
        if self.remote_clients:
            self._listener = mpc.Listener(self.address, family="AF_UNIX", backlog=self.remote_clients,
                                          authkey=self.authkey)
        own, theirs = multiprocessing.Pipe()
        self._thread = threading.Thread(target=self._run, args=(theirs,), name="stager-service", daemon=True)
        self._thread.start()
        return own

    # The service thread ---------------------------------------------------

    def _run(self, own):
        try:
            _Loop(self, own).run()
        except Exception:
            log.exception("stager: staging service failed")

    def close(self, wait_for_clients_s):
        """Stops the service once its clients have left, or after the wait.

        Args:
            wait_for_clients_s: How long to wait for other ranks to disconnect;
                0 on an error path, where peers may never come.
        """
        if self._thread is not None:
            self._thread.join(timeout=wait_for_clients_s)
            self._halt.set()
            if self._accepting:
                self._wake_accept()
            self._thread.join(timeout=self.config.processes.shutdown_timeout_s)
        self._stop_prefetchers()
        if self._listener is not None:
            self._listener.close()

    def _wake_accept(self):
        try:
            mpc.Client(self.address, family="AF_UNIX", authkey=self.authkey).close()
        except OSError:
            pass

    def _stop_prefetchers(self):
        if not self.procs:
            return
        self._stop.set()
        for _ in self.procs:
            self._tasks.put(None)
        stop_processes(self.procs, self._replies, self.config.processes.shutdown_timeout_s)
        for q in (self._tasks, self._replies):
            q.cancel_join_thread()
            q.close()
        self.procs = []


def stop_processes(procs, replies, timeout_s):
    """Joins worker processes, draining ``replies`` meanwhile; then terminates, then kills."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        while proc.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    replies.get_nowait()
            except (queue.Empty, OSError, ValueError):
                pass
            proc.join(0.05)
    for proc in procs:
        if proc.is_alive():
            log.warning("stager: %s (pid %s) did not stop in time; terminating", proc.name, proc.pid)
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


class _Loop:
    """The service's scheduling state; lives in the service thread."""

    def __init__(self, service, own):
        self.s = service
        self.catalog = service.catalog
        self.state = np.zeros(len(service.catalog), dtype=np.uint8)
        self.clients = [own]
        self.waiting = []       # (conn, seq, indices, task ids) not yet ready
        self.task_time = {}     # task id -> seconds, until its waiters are answered
        self.next_task = 0
        self.failed = None      # the error message sent to clients, once a prefetcher failed

    def run(self):
        s = self.s
        if s.remote_clients:
            s._accepting = True
            while len(self.clients) <= s.remote_clients and not s._halt.is_set():
                conn = s._listener.accept()
                if not s._halt.is_set():
                    self.clients.append(conn)
            s._accepting = False
        reader = s._replies._reader  # a Queue's pipe, waitable as ProcessPoolExecutor does
        while self.clients and not s._halt.is_set():
            ready = mpc.wait(self.clients + [reader], timeout=1.0)
            if not ready:
                self.check_prefetchers()
                continue
            for obj in ready:
                if obj is reader:
                    self.on_reply(s._replies.get())
                else:
                    self.on_client(obj)
        for conn in self.clients:
            conn.close()

    def on_client(self, conn):
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = ("bye",)
        if msg[0] == "fail":
            failure = ("error", "pipeline", "node leader", None, None, None, "PeerFailed", msg[1], None)
            for other in self.clients:
                if other is not conn:
                    self.send(other, failure)
            return
        if msg[0] == "bye":
            self.clients.remove(conn)
            self.waiting = [w for w in self.waiting if w[0] is not conn]
            conn.close()
            return
        _, seq, epoch, step, indices = msg
        if self.failed is not None:
            self.send(conn, self.failed)
            return
        missing = indices[self.state[indices] == _ABSENT]
        tasks = ()
        if len(missing):
            self.state[missing] = _IN_FLIGHT
            task = self.next_task
            self.next_task += 1
            files = [(int(i), self.catalog.path(i), int(self.catalog.sizes[i])) for i in missing]
            self.s._tasks.put((task, epoch, step, files))
            self.task_time[task] = None
            tasks = (task,)
        self.waiting.append((conn, seq, indices, tasks))
        self.answer_ready()

    def on_reply(self, msg):
        stats = self.s.stats
        if msg[0] == "error":
            self.failed = msg
            for conn in self.clients:
                self.send(conn, msg)
            self.waiting = []
            return
        _, task, _worker, done, seconds, epoch = msg
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
        self.answer_ready()

    def answer_ready(self):
        still = []
        for conn, seq, indices, tasks in self.waiting:
            if np.all(self.state[indices] == _STAGED):
                seconds = sum(self.task_time.pop(t) or 0.0 for t in tasks)
                self.send(conn, ("ready", seq, seconds))
            else:
                still.append((conn, seq, indices, tasks))
        self.waiting = still

    def send(self, conn, msg):
        try:
            conn.send(msg)
        except (OSError, EOFError):
            pass  # that client left; its EOF is handled when read

    def check_prefetchers(self):
        for proc in self.s.procs:
            if proc.exitcode is not None and self.failed is None:
                self.on_reply(("error", "prefetch", proc.name, None, None, None, "WorkerDied",
                               f"{proc.name} (pid {proc.pid}) exited unexpectedly with code {proc.exitcode}",
                               None))
