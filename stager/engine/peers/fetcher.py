"""The requester's side: threads of the node leader that fetch files from their holders.

Prefetchers are processes that never initialise MPI, so transfers from other
leaders run in threads of the leader's rank process. Each ``PeerFetch`` asks
one holder for a minibatch's files it holds, in one message; what arrives is published like any staged file
(``sources.publish``: a temporary name, the catalog's size checked, a
rename). A holder that owns the file but has not staged it yet says so, and
the thread asks again a little later (the owner is the one that reads it
from the shared file system); a holder without a copy says so, and the
thread reads the file from the shared file system instead; a holder that
gave the file to another node names it, and the thread asks that one (at
most ``MAX_HOPS`` times). The first request carries the files the node
dropped to make room for these (``PeerFetch.offers``). Threads take
tasks by step, the earliest first, and one waiting on a file to come hands
its task back for an earlier step's that no thread is free to take (``_Tasks``).
A holder whose
ranks have not moved for ``still_s`` while it says a file is to come, or that
has not staged it within ``PENDING_WAIT_S``, or that does not answer within
``timeout_s``, is given up on for those files (``fallback``: read from the
shared file system, and counted); one that did not answer is asked nothing
more in this job, so no late answer of it is ever taken for another's. Either way the service gets
a ``Staged`` per way the files came, and how long that took (waits for
pending files left out: they say nothing about the rates).
"""

import errno
import heapq
import itertools
import logging
import multiprocessing
import threading
import time
from dataclasses import replace

from .protocol import FIRST_REPLY_TAG, MISSING, MOVED, PENDING, REPLY_TAGS, Ask, PeerTimeout, ask_for, receive, \
    write_all
from ..messages import Failure, Staged
from ...sources.deadline import Deadline
from ...sources.publish import already_published, publish
from ...telemetry import NO_SPACE, PRESENT

log = logging.getLogger(__name__)

# A holder that says a file is to come (``PENDING``) sends its position, its slowest rank's latest request.
# While that moves, the holder is behind and the file is waited for; a holder whose position has not moved
# for ``PENDING_STILL_S`` is stuck: its ranks stall, or two nodes wait on each other's pending files (their
# fetch threads all held by later steps: handed over since, see ``_Tasks``; or, not seen so far, their caches
# full of what they keep for each other). Its pending files are then read from the source and counted,
# and the asker does not wait on it again until it moves. A stall shorter than that costs a wait, a longer
# one a file read twice; a holder whose steps each take longer than this is read around too, and so is one
# that waits on a node far behind it (its position stays where it is meanwhile): 10 s read a file twice in
# one run of the whole suite on 2 busy cores (4 emulated nodes of 1 rank drifting apart), so 30 s.
PENDING_STILL_S = 30.0
# However the holder moves, a pending file is waited for this long at most.
PENDING_WAIT_S = 60.0
# Holders that answer ``MOVED`` in a row before the file is read from the source: a file given on and on
# would otherwise be chased around the nodes.
MAX_HOPS = 4


class _Tasks:
    """The fetch threads' queue: the earliest step first (in the order queued within a step); ``None`` stops a thread.

    A node's ranks may be at different steps, and so may the nodes: a thread
    that waits on a file still to come from another node, while an earlier
    step's task of its own node waits for a thread, may be waiting on that
    very task (the other node's ranks read the file after fetching from
    here). Every thread so held stopped two nodes of two ranks each until
    the still-bound ran out, so the waiting thread hands its task back for
    the earlier one (``hand_over``). The earliest step of all is always
    fetched, so such waits never close a cycle; a later task never
    overtakes an earlier one, which a holder keeps its files for (a fetcher
    that parked files to come and took any new task meanwhile read shared
    containers twice, once in about six runs under load).
    """

    def __init__(self):
        self._heap = []  # (step, order, task, since: when the task was first taken, ``time.monotonic``)
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._idle = 0  # threads waiting in ``get``: they take whatever is queued

    def put(self, task, since=None):
        """Queues ``task`` (a ``PeerFetch``); ``None`` stops a thread before any task still queued."""
        with self._changed:
            step = -float("inf") if task is None else task.seq
            heapq.heappush(self._heap, (step, next(self._order), task, since))
            self._changed.notify_all()

    def get(self):
        """The earliest task and when it was first taken, waiting for one: ``(task, since)``."""
        with self._changed:
            self._idle += 1
            self._changed.wait_for(lambda: self._heap)
            self._idle -= 1
            return _taken(heapq.heappop(self._heap))

    def hand_over(self, task, since, timeout_s):
        """Waits up to ``timeout_s`` for an earlier step's task that no free thread will take.

        Returns:
            ``(task, since)`` of that task, with ``task`` queued in its
            place, or None when none came.
        """
        with self._changed:
            if not self._changed.wait_for(lambda: not self._idle and self._heap and self._heap[0][0] < task.seq,
                                          timeout_s):
                return None
            return _taken(heapq.heappushpop(self._heap, (task.seq, next(self._order), task, since)))


def _taken(entry):
    """``(task, since)`` of a task leaving the queue; ``since`` is set the first time it is taken."""
    _, _, task, since = entry
    return task, time.monotonic() if since is None else since


class PeerFetcher:
    """Fetch threads fed by the service thread, replying on one pipe.

    Args:
        comm: The leaders' communicator (mpi4py).
        source: The ``Source`` to fall back to.
        root: The job's node-local directory.
        threads: Fetches that may run at once.
        timeout_s: How long a holder may take to answer, or to stage a file
            it owns (``staging.stall_timeout_s``); then the source is read.
        still_s: How long a holder's position may stay where it is while it
            says a file is to come (at most ``timeout_s``).

    Attributes:
        silent: Holders that did not answer in time: asked nothing more in this job.
    """

    def __init__(self, comm, source, root, threads, timeout_s, still_s=PENDING_STILL_S):
        self.comm, self.source, self.root, self.timeout_s = comm, source, root, timeout_s
        self.still_s = min(still_s, timeout_s)
        self.silent = set()
        self._heard = {}  # per holder: its position in its latest PENDING, and since when it has been there
        self._heard_lock = threading.Lock()
        self._told = {}   # per holder: the position it was last read around at
        self.tasks = _Tasks()
        self.conn, self._reply = multiprocessing.Pipe(duplex=False)
        self._send_lock = threading.Lock()
        self._tags = itertools.count()
        self._deadline = Deadline(timeout_s)  # its helper threads are reused: fallbacks come file after file
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"stager-peer-fetch-{i}", daemon=True)
                         for i in range(threads)]

    def start(self):
        for thread in self._threads:
            thread.start()

    def send(self, msg):
        """Puts ``msg`` on the pipe the service reads (from any thread); ``OSError`` once it is closed."""
        with self._send_lock:
            if self._reply.closed:
                raise OSError("the node service's pipe from the peer threads is closed")
            self._reply.send(msg)

    def _run(self, worker):
        name = f"peer-fetch-{worker}"
        taken = None
        while True:
            task, since = taken or self.tasks.get()
            taken = None
            if task is None:
                return
            try:
                fetch = self._fetch(task, since)
                while True:
                    try:
                        route, done, seconds = next(fetch)
                    except StopIteration as end:
                        taken = end.value  # an earlier step's task, taken in exchange for this one's files to come
                        break
                    self.send(Staged(task.task, name, done, seconds, task.epoch, route))
            except Exception as exc:  # the service fails the job with where and why
                self.send(Failure.from_exception("prefetch", name, exc, task.epoch, task.step, None,
                                                  f"cannot stage files from node leader {task.owner}: "
                                                  f"{type(exc).__name__}: {exc}"))

    def _fetch(self, task, since):
        """Fetches a task's files; yields ``(route, done, seconds)`` per way they came (``peer``, ``source``).

        Args:
            since: When the task was first taken (``time.monotonic``): the
                patience with files to come counts from then.

        Returns:
            ``(task, since)`` of an earlier step's task taken in exchange for
            this task's files still to come (queued again), or None.
        """
        present = [(f[0], PRESENT) for f in task.files if already_published(self.root, f[1], f[2], f[3])]
        if present:
            yield "source", present, 0.0
        todo = [f for f in task.files if not already_published(self.root, f[1], f[2], f[3])]
        deadline = time.monotonic() + self.timeout_s
        patience = since + min(self.timeout_s, PENDING_WAIT_S)
        pause, taken = 0.002, None
        missing, late, moved, offers = [], [], {}, task.offers
        if task.owner in self.silent:  # it did not answer an earlier task: its late answers are never taken
            late, todo = todo, []
        while todo:
            start = time.perf_counter()
            tag = FIRST_REPLY_TAG + next(self._tags) % REPLY_TAGS
            done, pending, answered, at = [], [], 0, -1
            try:
                ask = Ask([f[:3] for f in todo], task.epoch, tag, task.seq, offers)
                offers = ()  # offered once: a holder that keeps them has them
                ask_for(self.comm, task.owner, ask, self.timeout_s)
                for f in todo:  # the answers come in the order asked
                    outcome, heard = self._receive(task.owner, tag, f, max(deadline - time.monotonic(), 0.0))
                    answered += 1
                    if outcome == PENDING:
                        pending.append(f)
                        at = max(at, heard)
                    elif outcome == MISSING:
                        missing.append(f)
                    elif outcome == MOVED:
                        moved.setdefault(heard, []).append(f)
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
            if todo:  # the holder's ranks read them before the asker's step: ask again rather than read them twice
                still = self._still_for(task.owner, at)
                if still > self.still_s or time.monotonic() > patience:
                    why = (f"its ranks have asked for nothing new for {still:.0f} s" if still > self.still_s else
                           f"within {min(self.timeout_s, PENDING_WAIT_S):g} s")
                    # Said once per holder and position: the report counts every file read around it.
                    told, self._told[task.owner] = self._told.get(task.owner) == at, at
                    (log.debug if told else log.warning)(
                        "stager: node leader %s has not staged %s (%s): reading %d file(s) from the source",
                        task.owner, todo[0][1], why, len(todo))
                    late += todo
                    break
                taken = self.tasks.hand_over(replace(task, files=todo), since, pause)
                if taken is not None:
                    break
                pause = min(2 * pause, 0.05)
        for to, files in moved.items():
            if task.hops < MAX_HOPS and to != self.comm.Get_rank() and to not in self.silent:
                self.tasks.put(replace(task, owner=to, files=files, offers=(), hops=task.hops + 1))
            else:
                missing += files
        for route, files in (("source", missing), ("fallback", late)):
            if files:
                start = time.perf_counter()
                done = [(index, self._from_source(rel, size, mtime_ns)) for index, rel, size, mtime_ns in files]
                yield route, done, time.perf_counter() - start
        return taken

    def _still_for(self, owner, at):
        """Seconds holder ``owner`` has been at position ``at``, as its ``PENDING`` answers tell (0: it moved)."""
        now = time.monotonic()
        with self._heard_lock:
            last, since = self._heard.get(owner, (None, now))
            if at != last:
                self._heard[owner] = (at, now)
                return 0.0
        return now - since

    def _receive(self, owner, tag, file, timeout_s):
        """One file of an answer, published: ``(outcome, at)``.

        The outcome is its bytes, ``NO_SPACE``, ``PENDING``, ``MOVED`` or
        ``MISSING`` (also when cut); ``at`` the holder's position with
        ``PENDING``, the leader given the file with ``MOVED``.
        """
        index, rel, size, mtime_ns = file
        outcome, at = None, -1

        def fill(fd):
            nonlocal outcome, at
            outcome, at = receive(self.comm, owner, tag, rel, lambda data: write_all(fd, data), timeout_s)
            return outcome

        try:
            publish(self.root, rel, size, fill, None if mtime_ns is None else (mtime_ns, mtime_ns))
        except PeerTimeout:
            raise
        except OSError as exc:
            if outcome is not None and outcome < 0:
                return outcome, at  # no copy there: publish refused the empty file
            if exc.errno == errno.ENOSPC:
                return NO_SPACE, -1
            if exc.errno != errno.EIO:
                raise
            log.warning("stager: %s; reading it from the source", exc)
            return MISSING, -1
        return outcome, -1

    def _from_source(self, rel, size, mtime_ns):
        try:
            # The read has the stall limit as every read of the source does (``sources.deadline``).
            fetched = self._deadline.run(self.source.fetch, rel, size, mtime_ns, self.root)
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
        self._deadline.close()
        # Not while another thread sends (the server's wake-up): closing under a send makes it fail
        # half-way. A fetch thread stuck in a send past its join is not waited for.
        locked = self._send_lock.acquire(timeout=timeout_s)
        try:
            self.conn.close()
            self._reply.close()
        finally:
            if locked:
                self._send_lock.release()
