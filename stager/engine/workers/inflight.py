"""A prefetcher that keeps several stage tasks' files in flight at once.

For a source with latency per request (an object store, or a shared file
system whose every open is a round trip), a prefetcher runs
``source.concurrency`` fetches at once in threads (sharing an object
store's connection pool); each thread says on the stall board which file it
waits for. Taking one task at a time would cap the requests in flight
at the task's size (a minibatch's missing files spread over the
prefetchers: often fewer than the threads) and leave the threads idle
between the end of one task and the start of the next. So the prefetcher
takes another task from the shared queue whenever fewer files than threads
are in flight, and replies for each task as soon as its last file is local,
whatever order the tasks finish in. The bound keeps a prefetcher from
hoarding tasks another one could start: it holds at most ``threads - 1``
files in flight plus one task's files. With ``requests_in_flight: auto``
the bound is a shared integer the service's tuner moves while running
(threads are started as the bound first needs them). Each file's fetch is
timed on its thread's own clocks (``perf.clock``), so the reply tells the
tuner how much of the time was waiting on the source.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..messages import Failure, Staged
from ..perf.clock import Span

WAIT_S = 0.5  # how often a prefetcher waiting for a free thread looks at the stop event
LIMIT_WAIT_S = 0.05  # with a moving bound: how soon a raised bound starts more fetches


class _Open:
    """A task whose files are being fetched."""

    __slots__ = ("task", "start", "left", "done", "busy_s", "cpu_s", "queued_s")

    def __init__(self, task):
        self.task, self.start, self.left, self.done = task, time.perf_counter(), len(task.files), []
        self.busy_s, self.cpu_s, self.queued_s = 0.0, 0.0, 0.0

    def timed(self, span):
        """Adds one file's fetch (a stopped ``Span``); the caller holds the lock."""
        self.busy_s += span.wall_s
        self.cpu_s += span.cpu_s
        self.queued_s = None if span.queued_s is None or self.queued_s is None else self.queued_s + span.queued_s


class InFlight:
    """One prefetcher's fetch threads and the tasks they work on.

    Args:
        worker: The prefetcher's number, for replies.
        reply: The prefetcher's reply pipe.
        stop: The pool's stop event.
        source: The ``Source`` to fetch from.
        dst_root: The job's node-local directory.
        threads: The most fetches at once (``source.concurrency``).
        fetch: ``fetch(source, dst_root, index, rel, size, mtime_ns)`` ->
            ``(index, bytes or NO_SPACE)`` (``workers._fetch``).
        progress: The service's ``stalls.Progress``, told which file each
            thread waits for, or None.
        limit: A shared integer, the fetches at once now (at most
            ``threads``), or None: ``threads``.
    """

    def __init__(self, worker, reply, stop, source, dst_root, threads, fetch, progress=None, limit=None):
        self.worker, self.reply, self.stop = worker, reply, stop
        self.source, self.dst_root, self.most, self.fetch = source, dst_root, threads, fetch
        self.limit = limit
        self.progress = progress
        self.pool = ThreadPoolExecutor(threads, "stager-fetch", initializer=self._name_thread)
        self.local = threading.local()
        self.named = 0
        self.cond = threading.Condition()
        self.busy = 0            # files submitted and not finished
        self.failed = False      # a Failure was sent: drop every task from now on
        self.send_lock = threading.Lock()  # replies come from the fetch threads

    @property
    def threads(self):
        """Fetches at once now."""
        return self.most if self.limit is None else max(1, min(self.most, self.limit.value))

    def run(self, tasks):
        """Fetches every task of ``tasks`` (an iterator of ``StageTask``), then returns.

        Returns once ``tasks`` ends and its files are fetched, or at once
        (dropping the rest) when the stop event is set or a file failed.
        """
        try:
            for task in tasks:
                if self.failed:
                    continue  # the service stops us; a task after a failure is not worth fetching
                if not task.files:
                    self._send(Staged(task.task, self.worker, [], 0.0, task.epoch))
                    continue
                opened = _Open(task)
                with self.cond:
                    self.busy += len(task.files)
                for file in task.files:
                    self.pool.submit(self._one, opened, file)
                with self.cond:
                    while self.busy >= self.threads and not self.stop.is_set() and not self.failed:
                        self.cond.wait(WAIT_S if self.limit is None else LIMIT_WAIT_S)
        finally:
            # Told to stop, drop what is left; at the end of the tasks, finish
            # the files in flight, as a prefetcher taking one task at a time would.
            stopping = self.stop.is_set() or self.failed
            self.pool.shutdown(wait=not stopping, cancel_futures=stopping)

    def _name_thread(self):
        with self.cond:
            self.local.thread, self.named = self.named, self.named + 1  # its row of the stall board

    def _one(self, opened, file):
        if self.failed or self.stop.is_set():
            self._finished()
            return
        task, thread = opened.task, self.local.thread
        try:
            if self.progress is not None:
                self.progress.on(self.worker, file[0], task.epoch, task.step, thread)
            span = Span().start()
            try:
                result = self.fetch(self.source, self.dst_root, *file)
            finally:
                span.stop()
                if self.progress is not None:
                    self.progress.idle(self.worker, thread)
        except Exception as exc:  # reported once, with its context; the service then stops us
            task, rel = opened.task, file[1]
            failure = Failure.from_exception("prefetch", self.worker, exc, task.epoch, task.step, rel,
                                             f"cannot stage {self.source.describe(rel)}: "
                                             f"{type(exc).__name__}: {exc}")
            with self.cond:
                first = not self.failed
                self.failed = True
            if first:
                self._send(failure)
            self._finished()
            return
        with self.cond:
            opened.done.append(result)
            opened.timed(span)
            opened.left -= 1
            complete = not opened.left and not self.failed
        if complete and not self.stop.is_set():
            task = opened.task
            self._send(Staged(task.task, self.worker, opened.done, time.perf_counter() - opened.start, task.epoch,
                              cpu_s=opened.cpu_s, busy_s=opened.busy_s, queued_s=opened.queued_s))
        self._finished()

    def _finished(self):
        with self.cond:
            self.busy -= 1
            self.cond.notify()

    def _send(self, msg):
        with self.send_lock:
            try:
                self.reply.send(msg)
            except (OSError, EOFError):
                pass  # the service is gone; the prefetcher's loop ends when told or orphaned
