"""CPU seconds per process kind while a method runs: rank, readers, prefetchers, emulator.

On a machine with few cores the sum of every process's CPU, not any one
stage, bounds a run, and a method can lose by burning CPU where wall time
hides it. ``CpuMeter`` samples ``/proc`` for the user and system time of every
descendant of this process and groups them: the emulator's daemon (running
before the meter started), ``stager-prefetch`` workers, any other worker
(``stager-read``, DataLoader and MultiprocessIterator workers: "readers"),
and this process itself (the rank: coordinator, service, training loop).
A worker's last ``interval_s`` before it exits is not seen; the rank's own
figure is exact (``os.times``).
"""

import os
import threading

from ..engine.perf.clock import process_stat

KINDS = ("rank", "readers", "prefetchers", "emulator")


def _children(pid):
    kids = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.update(int(p) for p in fh.read().split())
    except OSError:
        pass  # gone meanwhile
    return kids


def descendants(root):
    """Every process below ``root`` now."""
    found, todo = set(), [root]
    while todo:
        kids = _children(todo.pop()) - found
        found |= kids
        todo += kids
    return found


def readings(pids):
    """``{pid: (process name, CPU seconds so far)}`` of those of ``pids`` still running."""
    out = {}
    for pid in pids:
        try:
            out[pid] = process_stat(pid)
        except (OSError, IndexError, ValueError):
            pass  # exited between the listing and the reading
    return out


class CpuMeter:
    """Context manager; ``seconds()`` afterwards: CPU seconds per kind (``KINDS``)."""

    def __init__(self, interval_s=0.05):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stager-cpu-meter", daemon=True)
        self._last = {}

    def _run(self):
        me = os.getpid()
        while not self._stop.wait(self.interval_s):
            self._last.update(readings(descendants(me)))

    def __enter__(self):
        self._before = readings(descendants(os.getpid()))
        self._times = os.times()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._last.update(readings(descendants(os.getpid())))
        after = os.times()
        self._rank = after.user + after.system - self._times.user - self._times.system

    def seconds(self):
        """``{kind: CPU seconds}`` over the block, rounded to 10 ms."""
        out = dict.fromkeys(KINDS, 0.0)
        out["rank"] = self._rank
        for pid, (name, cpu) in self._last.items():
            if pid in self._before:
                out["emulator"] += cpu - self._before[pid][1]
            elif name.startswith("stager-prefetch"):
                out["prefetchers"] += cpu
            else:
                out["readers"] += cpu
        return {kind: round(value, 2) for kind, value in out.items()}
