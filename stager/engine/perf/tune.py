"""Counts from the model (``auto``): at start from a probe, while running from measured rates.

At start, ``choose_counts`` asks the equations how fast the rest of the
pipeline can go with the cores there are (the compute is not known yet, so
as fast as reading and the CPU allow), and gives the readers and the
prefetchers that rate with some headroom: by Little's law a pool that must
serve ``rate`` items a second, each keeping a worker ``t`` seconds, needs
``rate x t`` workers. The CPU's share comes from the probe process's CPU
per file (system calls included), and the headroom never goes past the rate
the cores allow, so the pool starts at about the count beyond which the
cores, not the source, would set the pace.

While running, a ``Tuner`` per pool applies the same law to what it measures
over a window (not over the pool's start, until every worker has finished
an item): the items asked for per second (the demand), the worker seconds
each item took, and, where the caller can read it, how busy the machine's
cores were. When the workers
were nearly all busy and work was waiting, the demand it saw was held back
by the pool itself, and the cores decide the step:

- cores with room: every item costs them about the same, so they allow
  ``CORES_FULL / busy`` times the items/s, and at the same time per item
  that takes as many times the workers (at most twice);
- cores full: none; more workers would only queue for them (and there the
  items/s hardly depend on the count, so a step could not be judged);
- load unknown: a quarter more.

Growth must pay, judged once the pool has grown by a quarter over windows
in a row (a smaller growth promises less than a window's noise): workers as
quick as before promise items/s in proportion to their number, and when the
items/s rose by
less than half of that, the items/s the larger pool got is the pace of
something more workers cannot add (the cores); the pool goes to the size
Little's law gives at that pace with the smaller pool's time per item (never
below the smaller pool), and no higher until the time per item leaves, by
half, what the two sizes measured (the source or the load changed). It
shrinks only well below its size, after two quiet windows and by half at
most (hysteresis), so noise does not make it oscillate. The caller
resizes the pool between minibatches.
"""

import math
from dataclasses import dataclass, replace

from .equations import Settings, per_file_s, predict

HEADROOM = 1.3          # workers beyond the law's count: rates vary file to file
PROCESS_BYTES = 64 << 20  # memory a worker process takes, for the upper bound
MAX_PREFETCHERS = 64
PAID = 0.5              # share of the items/s a growth promised that it must deliver to stay
# A saturated pool's step where the cores' load is not known, and the growth judged at once
# (a smaller one promises less than a window's noise). The pool starts near the cores' pace,
# so a step refines rather than ramps: near that pace a step is overshoot, and each worker it
# forks pauses the service thread (4-7 ms on the 2-core development machine).
GROWTH = 1.25
CORES_FULL = 0.9        # cores this busy are saturated: the rest is gaps between processes' turns
_UNBOUNDED = 1 << 30  # prefetchers enough that fetching sets no limit


def _bounded(count, low, high):
    return int(max(low, min(high, count)))


def count_limits(rates, max_prefetchers=MAX_PREFETCHERS):
    """``(max_prefetchers, max_readers)`` this machine and source allow.

    Readers decode: more than the cores only queue for them. Prefetchers
    mostly wait: beyond the count that fills the source's bandwidth they add
    nothing (allowed twice that, for the probe's error). Both together must fit in half the available memory.
    """
    readers = max(1, int(rates.cores))
    prefetchers = max_prefetchers
    if rates.bandwidth > 0 and rates.file_bytes > 0:
        # Twice the count that fills the bandwidth: eight files read at once can underestimate it.
        prefetchers = min(prefetchers, math.ceil(2 * per_file_s(rates) * rates.bandwidth / rates.file_bytes) + 1)
    if rates.memory:
        room = max(2, int(rates.memory / 2 // PROCESS_BYTES))
        readers = min(readers, max(1, room // 4))
        prefetchers = min(prefetchers, max(1, room - readers))
    return max(1, prefetchers), readers


def choose_counts(rates, miss=1.0, max_prefetchers=MAX_PREFETCHERS):
    """The prefetchers and readers ``auto`` starts with.

    Args:
        rates: A ``Rates`` from a probe (``probe.probe``).
        miss: Fraction of files to fetch (1: a cold cache).
        max_prefetchers: Upper bound for the prefetchers.

    Returns:
        ``(prefetchers, readers)``.
    """
    if rates.cpu_s > 0:
        # The probe's copy time is a wall time among threads that share the cores; its CPU
        # per file is the steadier measure of a file's own cost (what is not decoding is fetching).
        rates = replace(rates, copy_s=max(0.0, rates.cpu_s - rates.read_s))
    p_max, r_max = count_limits(rates, max_prefetchers)
    b = rates.batch_size
    # The rate reading and the CPU allow (fetching's CPU included), with every reader there may be
    # and as many prefetchers as it takes.
    best = predict(rates, Settings(prefetchers=_UNBOUNDED, readers=r_max, miss=miss))
    per_batch = b * rates.read_s + rates.batch_s
    readers = _bounded(math.ceil(best.samples_per_s / b * per_batch * HEADROOM), 1, r_max)
    rate = predict(rates, Settings(prefetchers=_UNBOUNDED, readers=readers, miss=miss))
    # The compute is not known before the run: the pool starts at what the rest allows (the
    # running tuner shrinks it when the training step is slower), with headroom, but never
    # past the rate the cores allow: beyond that, more prefetchers only wait for a core.
    files = min(rate.samples_per_s * HEADROOM, rate.cpu_rate) * miss
    prefetchers = _bounded(math.ceil(files * per_file_s(rates)), 1, p_max)
    return prefetchers, readers


@dataclass
class Decision:
    """A tuner's verdict over one window.

    Attributes:
        count: The pool's new size.
        demand: Items asked for per second.
        per_item_s: Worker seconds per item.
        busy: Fraction of the pool's worker time spent busy.
    """

    count: int
    demand: float
    per_item_s: float
    busy: float


class Tuner:
    """Sizes one pool from its measured rates (see the module's text).

    Args:
        count: The pool's size now.
        low: Smallest size.
        high: Largest size.
        window_s: Shortest time between decisions.
        min_items: Fewest items finished in a window to decide on.
    """

    def __init__(self, count, low, high, window_s=0.25, min_items=8):
        self.count, self.low, self.high = count, low, high
        self.window_s, self.min_items = window_s, min_items
        self._since = None
        self._asked = self._done = 0
        self._busy_s = 0.0
        self._demand = self._per_item = None
        self._idle_windows = 0
        self._warm = False     # whether the pool's start is over
        self._grew = None      # (size, items/s, seconds per item) before growing, to check it paid
        self._ceiling = None   # (size, seconds per item below and above it) a growth beyond which did not pay
        self.outstanding = 0  # items asked for and not finished, across windows

    def asked(self, items, now):
        """``items`` were asked of the pool at ``now``."""
        if self._since is None:
            self._since = now
        self._asked += items
        self.outstanding += items

    def finished(self, items, busy_s):
        """A worker finished ``items`` in ``busy_s`` seconds."""
        self._done += items
        self._busy_s += busy_s
        self.outstanding = max(0, self.outstanding - items)

    def _paid(self, rate):
        """Whether the last growth raised the items done per second by ``PAID`` of what it promised.

        Workers that each take as long per item as before promise items/s in
        proportion to their number (Little's law).
        """
        before, before_rate, _ = self._grew
        promised = before_rate * (self.count / before - 1)
        return rate - before_rate >= PAID * promised

    def _step(self, cores_busy):
        """The size a saturated pool goes to, by how busy the cores were (see the module's text)."""
        if cores_busy is None:
            return math.ceil(GROWTH * self.count)  # the next window judges a step
        if cores_busy >= CORES_FULL:
            return self.count  # the cores, not the pool, hold the items back: more would queue for them
        # Every item costs the cores about the same, so they allow the items/s they gave times
        # CORES_FULL / cores_busy; Little's law at the same time per item: as many more workers.
        fill = math.ceil(self.count * CORES_FULL / cores_busy) if cores_busy > 0 else 2 * self.count
        return min(2 * self.count, max(self.count + 1, fill))

    def restart(self, now):
        """Starts a new window at ``now``: the pool was just resized (starting workers takes time)."""
        self._since, self._asked, self._done, self._busy_s = now, 0, 0, 0.0

    def due(self, now):
        """Whether a window has enough to go on (``decide`` would decide)."""
        if self._since is None:
            return False
        if not self._warm:  # the pool's start: over once every worker has finished an item
            return self._done >= max(self.min_items, self.count)
        return now - self._since >= self.window_s and self._done >= self.min_items

    def decide(self, now, cores_busy=None):
        """A ``Decision`` once a window has enough to go on, else None; starts the next window.

        Args:
            now: The time (the clock of ``asked``).
            cores_busy: Fraction of the machine's cores busy over the window (all
                processes), or None where not known.
        """
        if not self.due(now):
            return None
        if not self._warm:
            # The pool's start (its first items' whole latency, the look-ahead asked at once):
            # neither its items/s nor its demand is the run's.
            self._warm = True
            self.restart(now)
            return None
        elapsed = now - self._since
        rate, window_per_item = self._done / elapsed, self._busy_s / self._done
        demand, per_item = self._asked / elapsed, window_per_item
        if self._demand is not None:  # smoothed over windows: one burst must not resize the pool
            demand = (demand + self._demand) / 2
            per_item = (per_item + self._per_item) / 2
        self._demand, self._per_item = demand, per_item
        busy = self._busy_s / (self.count * elapsed)
        if self._ceiling is not None and not self._ceiling[1] / 1.5 < window_per_item < self._ceiling[2] * 1.5:
            self._ceiling = None  # outside what both sizes measured, by half: the source or the load changed
        need = _bounded(math.ceil(demand * per_item * HEADROOM), self.low, self.high)
        target = self.count
        judge = self._grew is not None and self.count >= GROWTH * self._grew[0]
        if judge and not self._paid(rate):
            # The workers added mostly waited, for something more workers cannot add (the
            # cores): the items/s the pool got is that thing's pace, and Little's law at it
            # with the smaller pool's time per item is the pool it takes. No higher while
            # the time per item holds.
            before, _, before_per_item = self._grew
            target = _bounded(math.ceil(rate * before_per_item), before, self.count)
            self._ceiling = (target, before_per_item, window_per_item)
        elif busy > 0.85 and self.outstanding > self.count:
            # Held back: the demand it saw is only what it let through.
            target = self._step(cores_busy)
            self._idle_windows = 0
        elif need > self.count:
            target = need
            self._idle_windows = 0
        elif need < 0.6 * self.count and busy < 0.5:
            # Shrink only after two quiet windows in a row, and by half at most.
            self._idle_windows += 1
            if self._idle_windows >= 2:
                target = max(need, math.ceil(self.count / 2), self.low)
                self._idle_windows = 0
        else:
            self._idle_windows = 0
        if self._ceiling is not None and target > self.count:
            target = max(self.count, min(target, self._ceiling[0]))
        target = _bounded(target, self.low, self.high)
        # Growths are judged once they add up to GROWTH: a smaller one promises less than one
        # window's noise. Growing window after window, the sizes before the first are the base.
        if target <= self.count or judge:
            self._grew = None
        if target > self.count and self._grew is None:
            self._grew = (self.count, rate, window_per_item)
        self.count = target
        self._since, self._asked, self._done, self._busy_s = now, 0, 0, 0.0
        return Decision(target, demand, per_item, busy)
