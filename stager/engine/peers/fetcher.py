"""The requester's side: threads of the node leader that fetch files from their holders.

Prefetchers are processes that never initialise MPI, so transfers from other
leaders run in threads of the leader's rank process. Each ``PeerFetch`` asks
one holder for a minibatch's files it holds, in one message; what arrives is published like any staged file
(``sources.publish``: a temporary name, the catalog's size checked, a
rename). A holder that owns the file but has not staged it yet says so, and
the thread asks again a little later (the owner is the one that reads it
from the shared file system); a holder without a copy says so, and the
thread reads the file from the shared file system instead. A holder that
has not staged a file within ``PENDING_WAIT_S`` (or ``wait_s``, if shorter),
or does not answer within ``wait_s``, is given up on for those files
(``fallback``: read from the shared file system, and counted); one that did not answer is asked nothing more in this job, so no
late answer of it is ever taken for another's. Either way the service gets
a ``Staged`` per way the files came, and how long that took (waits for
pending files left out: they say nothing about the rates).
"""

import errno
import itertools
import logging
import multiprocessing
import queue
import threading
import time

from .protocol import FIRST_REPLY_TAG, MISSING, PENDING, REPLY_TAGS, Ask, PeerTimeout, ask_for, receive, write_all
from ..messages import Failure, Staged
from ...sources.deadline import within
from ...sources.publish import already_published, publish
from ...telemetry import NO_SPACE, PRESENT

log = logging.getLogger(__name__)

# How long a file its holder has still to stage (``PENDING``) is waited for, at most; then it is read from
# the source and counted. A holder some steps behind the asker is waited for (a busy node can be tens of
# seconds behind another); one that has not staged the file within a minute is taken to be stuck. Nodes of several ranks each, at different steps, can wait on each other's pending
# files, their caches full of what they keep for each other (seen once in about three 200-epoch runs of
# 4 ranks as 2 nodes): a bounded wait costs a minute and a file read twice, not ``staging.stall_timeout_s``.
PENDING_WAIT_S = 60.0


class PeerFetcher:
    """Fetch threads fed by the service thread, replying on one pipe.

    Args:
        comm: The leaders' communicator (mpi4py).
        source: The ``Source`` to fall back to.
        root: The job's node-local directory.
        threads: Fetches that may run at once.
        timeout_s: How long a holder may take to answer, or to stage a file
            it owns (``staging.stall_timeout_s``); then the source is read.

    Attributes:
        silent: Holders that did not answer in time: asked nothing more in this job.
    """

    def __init__(self, comm, source, root, threads, timeout_s):
        self.comm, self.source, self.root, self.timeout_s = comm, source, root, timeout_s
        self.silent = set()
        self.tasks = queue.Queue()
        self.conn, self._reply = multiprocessing.Pipe(duplex=False)
        self._send_lock = threading.Lock()
        self._tags = itertools.count()
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"stager-peer-fetch-{i}", daemon=True)
                         for i in range(threads)]

    def start(self):
        for thread in self._threads:
            thread.start()

    def _send(self, msg):
        with self._send_lock:
            self._reply.send(msg)

    def _run(self, worker):
        name = f"peer-fetch-{worker}"
        while True:
            task = self.tasks.get()
            if task is None:
                return
            try:
                for route, done, seconds in self._fetch(task):
                    self._send(Staged(task.task, name, done, seconds, task.epoch, route))
            except Exception as exc:  # the service fails the job with where and why
                self._send(Failure.from_exception("prefetch", name, exc, task.epoch, task.step, None,
                                                  f"cannot stage files from node leader {task.owner}: "
                                                  f"{type(exc).__name__}: {exc}"))

    def _fetch(self, task):
        """Fetches a task's files; yields ``(route, done, seconds)`` per way they came (``peer``, ``source``)."""
        start = time.perf_counter()
        present = [(f[0], PRESENT) for f in task.files if already_published(self.root, f[1], f[2], f[3])]
        if present:
            yield "source", present, 0.0
        todo = [f for f in task.files if not already_published(self.root, f[1], f[2], f[3])]
        deadline = time.monotonic() + self.timeout_s
        patience = time.monotonic() + min(self.timeout_s, PENDING_WAIT_S)
        pause = 0.002
        missing, late = [], []
        if task.owner in self.silent:  # it did not answer an earlier task: its late answers are never taken
            late, todo = todo, []
        while todo:
            start = time.perf_counter()
            tag = FIRST_REPLY_TAG + next(self._tags) % REPLY_TAGS
            done, pending, answered = [], [], 0
            try:
                ask_for(self.comm, task.owner, Ask([f[:3] for f in todo], task.epoch, tag, task.seq), self.timeout_s)
                for f in todo:  # the answers come in the order asked
                    outcome = self._receive(task.owner, tag, f, max(deadline - time.monotonic(), 0.0))
                    answered += 1
                    if outcome == PENDING:
                        pending.append(f)
                    elif outcome == MISSING:
                        missing.append(f)
                    else:
                        done.append((f[0], outcome))
            except PeerTimeout as exc:
                log.warning("stager: node leader %s does not answer (%s): reading its files from the source from "
                            "now on", task.owner, exc)
                self.silent.add(task.owner)
                late += pending + todo[answered:]
                pending = []
            if done:
                yield "peer", done, time.perf_counter() - start
            todo = pending
            if todo:  # the owner reads them in its first epoch: ask again rather than read them twice
                if time.monotonic() > patience:
                    log.warning("stager: node leader %s has not staged %s within %g s: reading %d file(s) from the "
                                "source", task.owner, todo[0][1], min(self.timeout_s, PENDING_WAIT_S), len(todo))
                    late += todo
                    break
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        for route, files in (("source", missing), ("fallback", late)):
            if files:
                start = time.perf_counter()
                done = [(index, self._from_source(rel, size, mtime_ns)) for index, rel, size, mtime_ns in files]
                yield route, done, time.perf_counter() - start

    def _receive(self, owner, tag, file, timeout_s):
        """One file of an answer, published; its bytes, ``NO_SPACE``, ``PENDING`` or ``MISSING`` (also when cut)."""
        index, rel, size, mtime_ns = file
        outcome = None

        def fill(fd):
            nonlocal outcome
            outcome = receive(self.comm, owner, tag, rel, lambda data: write_all(fd, data), timeout_s)
            return outcome

        try:
            publish(self.root, rel, size, fill, None if mtime_ns is None else (mtime_ns, mtime_ns))
        except PeerTimeout:
            raise
        except OSError as exc:
            if outcome is not None and outcome < 0:
                return outcome  # no copy there: publish refused the empty file
            if exc.errno == errno.ENOSPC:
                return NO_SPACE
            if exc.errno != errno.EIO:
                raise
            log.warning("stager: %s; reading it from the source", exc)
            return MISSING
        return outcome

    def _from_source(self, rel, size, mtime_ns):
        try:
            # The read has the stall limit as every read of the source does (``sources.deadline``).
            fetched = within(self.timeout_s, self.source.fetch, rel, size, mtime_ns, self.root)
            return PRESENT if fetched is None else fetched
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return NO_SPACE

    def stop(self, timeout_s):
        for _ in self._threads:
            self.tasks.put(None)
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self.conn.close()
        self._reply.close()
