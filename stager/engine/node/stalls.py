"""What each prefetcher is waiting for, and since when: how a stalled source is noticed.

An open or read on a shared file system that never returns (a hung Lustre
OST) raises nothing and times out nowhere: the prefetcher just sits in the
kernel. So each prefetcher publishes, before each file, which file it is on,
for which minibatch, and since when, in a few shared-memory slots of its
own; the node service reads them when it is idle and fails the job once one
has waited longer than ``staging.stall_timeout_s``.

A slot is written by its prefetcher only and read by the service only: the
time is written before the file, so a read that races a write can pair a
file with a later start (underestimating its wait), never with an earlier one.
"""

import time

from ..messages import Failure

IDLE = -1


class Progress:
    """One slot per fetch thread of each prefetcher in shared memory: ``(file index, epoch, step)`` and a start time.

    Args:
        ctx: The multiprocessing context the prefetchers are started with.
        count: Number of prefetchers.
        threads: Files each prefetcher fetches at once (``source.concurrency``).
    """

    def __init__(self, ctx, count, threads=1):
        self.threads = threads
        self._what = ctx.RawArray("q", 3 * count * threads)  # file index (IDLE between tasks), epoch, step
        self._since = ctx.RawArray("d", count * threads)    # time.monotonic() (one clock for the whole host)
        for slot in range(count * threads):
            self._what[3 * slot] = IDLE

    def __len__(self):
        return len(self._since)

    def slot(self, worker, thread=0):
        """The slot of fetch thread ``thread`` of prefetcher ``worker``.

        An ``auto`` pool gives each worker it starts a new index, so after
        shrinking and growing, indices pass the board's size; the board is
        made with room for the pool's largest size, and live workers' indices
        rarely meet modulo it.
        """
        return (worker % (len(self._since) // self.threads)) * self.threads + thread

    def on(self, worker, index, epoch, step, thread=0):
        """In prefetcher ``worker``: ``thread`` starts waiting for file ``index`` of minibatch (``epoch``, ``step``)."""
        slot = self.slot(worker, thread)
        self._since[slot] = time.monotonic()
        self._what[3 * slot + 1] = epoch
        self._what[3 * slot + 2] = step
        self._what[3 * slot] = index

    def idle(self, worker, thread=0):
        """In prefetcher ``worker``: ``thread`` waits for its next file (which cannot stall)."""
        self._what[3 * self.slot(worker, thread)] = IDLE

    def stalled(self, limit_s):
        """The slots on one file for more than ``limit_s``: ``[(slot, index, epoch, step, seconds)]``."""
        now = time.monotonic()
        out = []
        for worker in range(len(self)):
            index = self._what[3 * worker]
            waited = now - self._since[worker]
            if index != IDLE and waited > limit_s:
                out.append((worker, index, self._what[3 * worker + 1], self._what[3 * worker + 2], waited))
        return out


def stall_failure(progress, pool, catalog, source, limit_s):
    """The ``Failure`` of the first prefetcher of ``pool`` on one file for more than ``limit_s``, or None.

    None also when that prefetcher retired (an ``auto`` pool shrank) after
    its last file: its slot is stale, nobody waits.
    """
    for slot, index, epoch, step, waited in progress.stalled(limit_s):
        procs = [proc for worker, proc in pool.by_conn.values()
                 if progress.slot(worker) == slot - slot % progress.threads]
        if not procs:
            continue
        proc, rel = procs[0], catalog.path(index)
        return Failure("prefetch", proc.name, epoch, step, rel, "Stalled",
                       f"{proc.name} (pid {proc.pid}) has waited {waited:.0f} s for {source.describe(rel)} "
                       f"(minibatch {step} of epoch {epoch}), more than staging.stall_timeout_s = {limit_s:g}: "
                       "the source does not answer (a hung file system?)")
    return None
