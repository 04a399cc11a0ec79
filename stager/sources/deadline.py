"""Every read of the source has a deadline: a read that never returns ends the run with an error, never a hang.

An open, a stat or a listing on a hung file system (a Lustre OST or a
metadata server that stopped answering) raises nothing and times out
nowhere: the calling thread just waits in the kernel. The prefetchers are
watched by the node service's stall board (``engine.node.stalls``). Everything
else that reads the source in the rank process (listing it, reading a
manifest or a catalog file, the existence check, probing it for ``auto``
counts, a peer fetch falling back to it) runs under a ``Deadline``: in a
helper thread that says, before each read, what it reads
(``with reading("open", path): ...``), while the caller watches the clock
and raises ``SourceStalled`` once one read has waited longer than the limit.
A helper whose call returned in time runs the deadline's next call: a peer
fetch falling back to the source reads file after file, and a thread
started and ended for each file would cost its start and, in a node service
that lives for days, memory each ended thread leaves mapped. A helper
whose read overran stays behind, asleep in the kernel; it ends when the
file system answers, or with the process (which a hung server that ignores
interrupts delays until the mount is cleared: only the kernel can end such
a wait).
"""

import os
import queue
import threading
import time

from ..errors import StagerError

SETTING = "staging.stall_timeout_s"

_current = threading.local()


class SourceStalled(StagerError, TimeoutError):
    """A read of the source did not return within the deadline.

    Attributes:
        what: The read (``open``, ``stat``, ``listing``...).
        path: What it read.
        waited: Seconds it had waited.
    """

    def __init__(self, what, path, waited, limit_s, setting=SETTING):
        super().__init__(f"{what} {path} has not returned after {waited:.0f} s, more than {setting} = {limit_s:g}: "
                         "the source does not answer (a hung file system?)")
        self.what, self.path, self.waited = what, path, waited


class _Reading:
    __slots__ = ("deadline", "what", "path")

    def __init__(self, deadline, what, path):
        self.deadline, self.what, self.path = deadline, what, path

    def __enter__(self):
        if self.deadline is not None:
            self.deadline.on(self.what, self.path)
        return self

    def __exit__(self, *exc):
        if self.deadline is not None:
            self.deadline.off()


def reading(what, path):
    """A context manager around one read of the source: ``what`` (``open``, ``stat``...) of ``path``.

    Costs a little under a microsecond where no deadline is active (the
    read is then not watched: a prefetcher's, on the stall board instead).
    """
    return _Reading(getattr(_current, "deadline", None), what, path)


def current():
    """The ``Deadline`` this thread reads under, or None: threads a read starts are handed it (``adopt``)."""
    return getattr(_current, "deadline", None)


def adopt(deadline):
    """Makes this thread's reads count against ``deadline`` (a thread pool's initializer)."""
    _current.deadline = deadline


class _Helper:
    """A daemon thread that runs a deadline's calls one at a time, until it is told to end."""

    def __init__(self, deadline):
        self.pid = os.getpid()  # a forked child has none of its parent's threads
        self._calls = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(deadline,), name="stager-source-read", daemon=True).start()

    def _serve(self, deadline):
        adopt(deadline)
        while (call := self._calls.get()) is not None:
            call()

    def call(self, fn):
        self._calls.put(fn)

    def end(self):
        """Ends the thread once the call it is in (if any) returns."""
        self._calls.put(None)


class Deadline:
    """The longest a single read of the source may wait, and the work it watches.

    Its helper threads are kept for its next calls: ``close()`` (or the end
    of a ``with`` block) ends the idle ones. Callable from several threads.

    Args:
        limit_s: Seconds one read may wait; 0 waits without end.
        setting: The setting that changes the limit, for messages.
    """

    def __init__(self, limit_s, setting=SETTING):
        self.limit_s = limit_s
        self.setting = setting
        self._lock = threading.Lock()
        self._waits = {}  # thread ident -> (what, path, since)
        self._idle = []   # helpers between calls
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Ends the idle helpers (safe twice); a helper still in a call ends when the call returns."""
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for helper in idle:
            helper.end()

    def _helper(self):
        with self._lock:
            while self._idle:
                helper = self._idle.pop()
                if helper.pid == os.getpid():
                    return helper
        return _Helper(self)

    def _done_with(self, helper):
        with self._lock:
            if not self._closed:
                self._idle.append(helper)
                return
        helper.end()

    def on(self, what, path):
        with self._lock:
            self._waits[threading.get_ident()] = (what, path, time.monotonic())

    def off(self):
        with self._lock:
            self._waits.pop(threading.get_ident(), None)

    def overdue(self):
        """The longest wait past the limit as ``(what, path, seconds)``, or None."""
        now = time.monotonic()
        with self._lock:
            late = [(now - since, what, path) for what, path, since in self._waits.values()
                    if now - since > self.limit_s]
        if not late:
            return None
        waited, what, path = max(late)
        return what, path, waited

    def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its reads watched; raises ``SourceStalled`` once one waits too long.

        Raises:
            SourceStalled: Naming the read, its path, the wait and the setting.
            Whatever ``fn`` raises.
        """
        if not self.limit_s:
            return fn(*args, **kwargs)
        done, box = threading.Event(), {}

        def body():
            try:
                box["result"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, which raises it
                box["error"] = exc
            finally:
                done.set()

        helper = self._helper()
        helper.call(body)
        try:
            while not done.wait(min(1.0, self.limit_s / 4)):
                late = self.overdue()
                if late is not None:
                    raise SourceStalled(*late, self.limit_s, self.setting)
        except BaseException:
            helper.end()  # left in its read: it ends once the read returns, and runs nothing more
            raise
        self._done_with(helper)
        if "error" in box:
            raise box["error"]
        return box["result"]


def parallel(fn, items, threads, name="stager-source-read"):
    """``[fn(item) for item in items]`` in up to ``threads`` daemon threads reading under the caller's deadline.

    Daemon threads, not a thread pool: a pool's threads are joined when the
    interpreter exits, and one asleep in a hung file system would keep the
    process from ever ending after its deadline passed.

    Raises:
        The first exception ``fn`` raised (the other threads take no new item).
    """
    deadline, todo, lock = current(), iter(enumerate(items)), threading.Lock()
    results, errors = [None] * len(items), []

    def work():
        adopt(deadline)
        while True:
            with lock:
                nxt = None if errors else next(todo, None)
            if nxt is None:
                return
            try:
                results[nxt[0]] = fn(nxt[1])
            except BaseException as exc:  # raised in the caller
                with lock:
                    errors.append(exc)
                return

    workers = [threading.Thread(target=work, name=name, daemon=True) for _ in range(min(threads, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results


def within(limit_s, fn, *args, **kwargs):
    """``Deadline(limit_s).run(fn, ...)``; where a deadline is already active (nested), ``fn`` runs under it."""
    if current() is not None:
        return fn(*args, **kwargs)
    with Deadline(limit_s) as deadline:
        return deadline.run(fn, *args, **kwargs)
