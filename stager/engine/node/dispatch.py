"""How the node service turns the files a request must fetch into prefetcher and peer tasks.

Owns what tasks alone need: their numbering, the deadline queue that hands
the prefetchers the most urgent task first (``deadlines.py``), each task's
time until its request is answered, and the split of a minibatch's files
into tasks. The service's loop (``service_loop.py``) decides what to fetch;
this decides how it is handed out.
"""

from .deadlines import DeadlineQueue
from ..messages import StageTask
from ..peers import swaps
from ... import telemetry as tm


AUTO_TASKS = 16  # the fewest tasks a minibatch is split into for an ``auto`` pool of processes


def split_tasks(missing, per):
    """Splits a minibatch's missing files into prefetcher tasks of ``per`` files (the last may hold fewer)."""
    return [missing[i:i + per] for i in range(0, len(missing), per)]


class Request:
    """One client's minibatch from ``Need`` to ``Release``: its tasks and the files it waits on."""

    __slots__ = ("conn", "seq", "epoch", "step", "files", "missing", "tasks", "remaining", "answered")

    def __init__(self, conn, msg, files, missing, remaining):
        self.conn, self.seq, self.epoch, self.step = conn, msg.seq, msg.epoch, msg.step
        self.files, self.missing, self.remaining = files, missing, remaining
        self.tasks = []
        self.answered = False


class Dispatch:
    """The service's tasks: numbered, queued by deadline, timed.

    Args:
        service: The ``StagingService`` (its pool, peers, staging section,
            resizer, catalog and telemetry).
    """

    def __init__(self, service):
        self.s = service
        self.catalog = service.catalog.files
        self.next_task = 0
        self.task_time = {}  # task id -> seconds, until its request is answered
        self.deadlines = DeadlineQueue(service.pool.tasks.put, service.staging.node_schedule == "deadline")

    def files(self, indices):
        """What a task carries for each file: ``(index, path, bytes, mtime)``."""
        catalog = self.catalog
        return [(int(i), catalog.path(i), int(catalog.sizes[i]), catalog.mtime(i)) for i in indices]

    def _new(self, request):
        task = self.next_task
        self.next_task += 1
        self.task_time[task] = None
        request.tasks.append(task)
        return task

    def submit(self, request, missing, offers=None):
        """Hands ``request``'s files to fetch to the peers that hold them and to the prefetchers.

        ``offers``: files dropped to make room for them (``swaps.offered``),
        given to the holders asked; those no holder is asked to take are lost.
        """
        s = self.s
        first, count = self.next_task, len(missing)
        if s.peers is not None:
            groups, missing = s.peers.route(missing, self.catalog.sizes[missing], request.seq)
            given, lost = swaps.pair(groups, offers or {}, s.peers.holders)
            for owner, indices in groups:  # one task per holder
                s.peers.submit(self._new(request), request.epoch, request.step, owner, self.files(indices),
                               request.seq, given.get(owner, ()))
            for index, _, size, _, _ in (offer for batch in given.values() for offer in batch):
                s.telemetry.record(tm.SWAPPED_OUT, index, size, request.epoch)
            for index in lost:
                s.telemetry.record(tm.DROPPED, index, int(self.catalog.sizes[index]), request.epoch)
        for chunk in split_tasks(missing, self.per_task(len(missing))):
            task = self._new(request)
            self.deadlines.push(request.seq, task, StageTask(task, request.epoch, request.step, self.files(chunk)),
                                len(chunk) if self.threaded else 1)
        self.feed()
        if s.resizer is not None:
            s.resizer.asked(len(missing))
        s.telemetry.record(tm.QUEUED, first, self.next_task - first, count)

    def retry(self, indices, epoch):
        """Fetches again files that met a full disk, at once (their requests wait on them)."""
        s = self.s
        for chunk in split_tasks(indices, s.staging.files_per_task or -(-len(indices) // s.pool.size)):
            task = self.next_task
            self.next_task += 1
            s.pool.tasks.put(StageTask(task, epoch, -1, self.files(chunk)))

    def finished(self, msg):
        """A ``Staged`` reply: its task's time is kept, and a prefetcher is free for the next task."""
        if msg.task in self.task_time:
            self.task_time[msg.task] = msg.seconds
        if msg.route == "source":  # a prefetcher's task (the peer fetchers' are not on the deadline queue)
            self.deadlines.done(msg.task)
            self.feed()
            if self.s.resizer is not None:
                self.s.resizer.staged(msg)

    def per_task(self, count):
        """Files a task carries, of a minibatch's ``count`` files to fetch.

        Whole minibatches a task would make the first one wait for a single
        prefetcher to open every file in turn, and leave most prefetchers
        idle at the end of an epoch; one file a task would cost a queue
        round trip (a pickle each way, a wake-up of the service) a file.
        ``staging.files_per_task`` where set. Else, with one file in flight a
        prefetcher, as many tasks as prefetchers; an ``auto`` pool's are finer
        (``AUTO_TASKS`` at least): it may grow before they are handed out, and
        tasks sized for the smaller pool would leave the new prefetchers
        without work. Where each prefetcher keeps files in flight in threads,
        a task fills half of one's threads (at least a task a prefetcher):
        its files are fetched at once all the same, and a prefetcher takes
        its next task while the last one's files finish.
        """
        if self.s.staging.files_per_task:
            return self.s.staging.files_per_task
        resizer, size = self.s.resizer, self.s.pool.size
        if self.threaded:
            per = -(-resizer.threads.value // 2)
            return max(1, min(per, -(-count // size)))
        tasks = size if resizer is None else max(size, AUTO_TASKS)
        return max(1, -(-count // tasks))

    @property
    def threaded(self):
        """Whether the files each prefetcher keeps in flight are tuned: the pool's capacity is then files."""
        resizer = self.s.resizer
        return resizer is not None and resizer.threads is not None

    def takers(self):
        """What the pool works on at once: one task a prefetcher, or one file in flight where those are tuned."""
        return self.s.resizer.size() if self.threaded else self.s.pool.size

    def feed(self):
        """Keeps each prefetcher of the pool (each file in flight, where tuned), as large as it is now, given its
        next task."""
        self.deadlines.feed(self.takers())

    def seconds(self, request):
        """``(seconds, span)`` of ``request``'s tasks, forgotten once asked.

        ``seconds``: the prefetchers' (and peer fetchers') time on them;
        ``span``: how long they take once handed out, their work spread over
        the prefetchers: the longest task, or their total over the pool.
        """
        times = [self.task_time.pop(t, None) or 0.0 for t in request.tasks]
        total = sum(times)
        return total, max(max(times, default=0.0), total / max(1, self.takers()))

    def spare(self):
        """Whether a prefetcher could take more: no task waits, and less is handed out than the pool
        works on at once (tasks or files, ``takers``; twice that with fetch threads, as ``feed`` hands out)."""
        at_once = self.takers() * (2 if getattr(self.s.source, "concurrency", 1) > 1 else 1)
        return not len(self.deadlines) and self.deadlines.handed_out < at_once

    def forget(self, request):
        """``request``'s tasks' times, no longer to be asked for (it was read, or its client left)."""
        for task in request.tasks:
            self.task_time.pop(task, None)

    def clear(self):
        """No task is handed out any more (staging failed)."""
        self.deadlines.clear()
        self.task_time.clear()
