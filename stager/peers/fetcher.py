"""The requester's side: threads of the node leader that fetch files from their holders.

Prefetchers are processes that never initialise MPI, so transfers from other
leaders run in threads of the leader's rank process. Each ``PeerFetch`` asks
the file's holder; what arrives is published like any staged file
(``sources.publish``: a temporary name, the catalog's size checked, a
rename). A holder that owns the file but has not staged it yet says so, and
the thread asks again a little later (the owner is the one that reads it
from the shared file system); a holder without a copy says so, and the
thread reads the file from the shared file system instead. Either way the
service gets one ``Staged`` per file, saying which way it came and how long
the transfer took (waits for a pending file left out: they say nothing
about the rates).
"""

import errno
import itertools
import logging
import multiprocessing
import queue
import threading
import time

from ..messages import NO_SPACE, Failure, Staged
from ..sources.publish import already_published, publish
from .protocol import FIRST_REPLY_TAG, MISSING, PENDING, REPLY_TAGS, Ask, PeerTimeout, receive

log = logging.getLogger(__name__)


class _Missing(Exception):
    """The holder had no complete copy (or could not finish sending it)."""


class PeerFetcher:
    """Fetch threads fed by the service thread, replying on one pipe.

    Args:
        comm: The leaders' communicator (mpi4py).
        source: The ``Source`` to fall back to.
        root: The job's node-local directory.
        threads: Fetches that may run at once.
        timeout_s: How long a holder may take to answer.
    """

    def __init__(self, comm, source, root, threads, timeout_s):
        self.comm, self.source, self.root, self.timeout_s = comm, source, root, timeout_s
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
                nbytes, route, seconds = self._fetch(task)
            except Exception as exc:  # the service fails the job with where and why
                self._send(Failure.from_exception("prefetch", name, exc, task.epoch, task.step, task.rel,
                                                  f"cannot stage {task.rel} (holder: node leader {task.owner}): "
                                                  f"{type(exc).__name__}: {exc}"))
                continue
            self._send(Staged(task.task, name, [(task.index, nbytes)], seconds, task.epoch, route))

    def _fetch(self, task):
        """Returns ``(bytes, route, seconds)``: ``peer`` when the holder sent it, ``source`` otherwise."""
        start = time.perf_counter()
        if already_published(self.root, task.rel, task.size, task.mtime_ns):
            return 0, "source", 0.0
        times = None if task.mtime_ns is None else (task.mtime_ns, task.mtime_ns)
        deadline = time.monotonic() + self.timeout_s
        pause = 0.002

        def fill(fd):
            nonlocal start, pause
            while True:
                start = time.perf_counter()
                ask = Ask(task.index, task.rel, task.size, task.epoch,
                          FIRST_REPLY_TAG + next(self._tags) % REPLY_TAGS)
                got = receive(self.comm, task.owner, ask, fd, max(deadline - time.monotonic(), 0.0))
                if got == MISSING:
                    raise _Missing()
                if got != PENDING:
                    return got
                time.sleep(pause)
                pause = min(2 * pause, 0.05)

        try:
            return publish(self.root, task.rel, task.size, fill, times), "peer", time.perf_counter() - start
        except PeerTimeout:
            raise
        except _Missing:
            pass
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                return NO_SPACE, "peer", 0.0
            if exc.errno != errno.EIO:
                raise
            log.warning("stager: %s; reading it from the source", exc)
        start = time.perf_counter()
        try:
            nbytes = self.source.fetch(task.rel, task.size, task.mtime_ns, self.root)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            nbytes = NO_SPACE
        return nbytes, "source", time.perf_counter() - start

    def stop(self, timeout_s):
        for _ in self._threads:
            self.tasks.put(None)
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self.conn.close()
        self._reply.close()
