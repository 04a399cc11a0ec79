"""A thread's own clocks: its CPU seconds and its seconds queued for a core.

A task's wall time is its CPU, its wait in the run queue (runnable, no
core free) and its wait on something else (the source). Only the last is a
reason to keep more requests in flight; the second says the cores are
full, where more requests would only queue longer. Linux gives both
clocks per thread in ``/proc/thread-self/schedstat`` (nanoseconds on a
core, nanoseconds waiting on a run queue, time slices); where the file is
missing (another kernel, scheduler statistics compiled out), the CPU comes
from ``time.thread_time`` and the queued time is unknown (None): the
tuner then falls back to the CPU alone.
"""

import os
import threading
import time

SCHEDSTAT = "/proc/thread-self/schedstat"

_TICK = os.sysconf("SC_CLK_TCK")

_local = threading.local()  # each thread's open schedstat file: read again with pread, not reopened per task


def _fd():
    fd = getattr(_local, "fd", None)
    if fd is None:
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        _local.fd = fd
    return fd


def thread_clock():
    """``(cpu_s, queued_s)`` of the calling thread so far; ``queued_s`` None where the kernel does not say."""
    fd = _fd()
    if fd >= 0:
        try:
            cpu, queued = os.pread(fd, 128, 0).split()[:2]
            return int(cpu) / 1e9, int(queued) / 1e9
        except (OSError, ValueError):
            pass
    return time.thread_time(), None


def has_schedstat():
    """Whether this kernel tells a thread's run-queue wait (``thread_clock``'s second value)."""
    return thread_clock()[1] is not None


class Span:
    """Wall, CPU and run-queue seconds of the calling thread between ``start`` and ``stop``.

    Attributes (after ``stop``):
        wall_s: Wall seconds.
        cpu_s: Seconds on a core.
        queued_s: Seconds runnable and waiting for a core, or None where not known.
    """

    __slots__ = ("_wall", "_cpu", "_queued", "wall_s", "cpu_s", "queued_s")

    def start(self):
        self._wall = time.perf_counter()
        self._cpu, self._queued = thread_clock()
        return self

    def stop(self):
        cpu, queued = thread_clock()
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = max(0.0, cpu - self._cpu)
        self.queued_s = None if queued is None or self._queued is None else max(0.0, queued - self._queued)
        return self


def process_stat(pid):
    """``(name, cpu_s)`` of process ``pid``: its kernel name and the CPU seconds (user and system, every thread)
    it has spent so far.

    Raises:
        OSError: The process is gone (or never was).
    """
    with open(f"/proc/{pid}/stat", "rb") as fh:
        text = fh.read()
    head, tail = text.rsplit(b")", 1)
    fields = tail.split()
    return head.split(b"(", 1)[1].decode(errors="replace"), (int(fields[11]) + int(fields[12])) / _TICK
