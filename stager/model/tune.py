"""Counts from the model (``auto``): at start from a probe, while running from measured rates.

At start, ``choose_counts`` asks the equations how fast the rest of the
pipeline can go with the cores there are (the compute is not known yet, so
as fast as reading and the CPU allow), and gives the readers and the
prefetchers that rate with some headroom: by Little's law a pool that must
serve ``rate`` items a second, each keeping a worker ``t`` seconds, needs
``rate x t`` workers.

While running, a ``Tuner`` per pool applies the same law to what it measures
over a window: the items asked for per second (the demand) and the worker
seconds each item took. When the workers were nearly all busy and work was
waiting, the demand it saw was held back by the pool itself, so it doubles
instead. It shrinks only well below its size, after two quiet windows and by
half at most (hysteresis), so noise does not make it oscillate. A growth
must pay: when the items finished per second did not rise by 15%, the
workers wait for something more workers cannot add (the CPU), so the pool
goes back and stays at most that size until the time per item changes by
half (the source or the load changed). The caller resizes the pool between minibatches.
"""

import math
from dataclasses import dataclass

from .equations import per_file_s, predict, Settings

HEADROOM = 1.3          # workers beyond the law's count: rates vary file to file
PROCESS_BYTES = 64 << 20  # memory a worker process takes, for the upper bound
MAX_PREFETCHERS = 64
START_PER_CORE = 8      # prefetchers a core at most at start, before any demand is seen
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
        rates: A ``Rates`` from a probe (``calibrate.probe``).
        miss: Fraction of files to fetch (1: a cold cache).
        max_prefetchers: Upper bound for the prefetchers.

    Returns:
        ``(prefetchers, readers)``.
    """
    p_max, r_max = count_limits(rates, max_prefetchers)
    b = rates.batch_size
    # The rate reading and the CPU allow (fetching's CPU included), with every reader there may be
    # and as many prefetchers as it takes.
    best = predict(rates, Settings(prefetchers=_UNBOUNDED, readers=r_max, miss=miss))
    per_batch = b * rates.read_s + rates.batch_s
    readers = _bounded(math.ceil(best.samples_per_s / b * per_batch * HEADROOM), 1, r_max)
    rate = predict(rates, Settings(prefetchers=_UNBOUNDED, readers=readers, miss=miss)).samples_per_s
    # The compute is not known before the run: it may be much slower than the rest. Start at
    # most a few prefetchers a core and let the running tuner grow the pool if the demand is there.
    start_max = max(1, min(p_max, START_PER_CORE * int(max(1, rates.cores))))
    prefetchers = _bounded(math.ceil(rate * miss * per_file_s(rates) * HEADROOM), 1, start_max)
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
        self._grew = None      # (size before, items/s before) after a growth, to check it paid
        self._ceiling = None   # (size, seconds per item) a growth beyond which did not pay
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

    def restart(self, now):
        """Starts a new window at ``now``: the pool was just resized (starting workers takes time)."""
        self._since, self._asked, self._done, self._busy_s = now, 0, 0, 0.0

    def decide(self, now):
        """A ``Decision`` once a window has enough to go on, else None; starts the next window."""
        if self._since is None or now - self._since < self.window_s or self._done < self.min_items:
            return None
        elapsed = now - self._since
        demand, per_item = self._asked / elapsed, self._busy_s / self._done
        rate = self._done / elapsed
        if self._demand is not None:  # smoothed over windows: one burst must not resize the pool
            demand = (demand + self._demand) / 2
            per_item = (per_item + self._per_item) / 2
        self._demand, self._per_item = demand, per_item
        busy = self._busy_s / (self.count * elapsed)
        if self._ceiling is not None and not 1 / 1.5 < per_item / self._ceiling[1] < 1.5:
            self._ceiling = None  # the source or the load changed: growing may pay again
        need = _bounded(math.ceil(demand * per_item * HEADROOM), self.low, self.high)
        target = self.count
        if self._grew is not None and rate < self._grew[1] * 1.15:
            # The last growth did not pay (the workers wait for the CPU, not the
            # source): back to the size before it, and no higher while rates hold.
            target = self._grew[0]
            self._ceiling = (self._grew[0], per_item)
        elif busy > 0.85 and self.outstanding > self.count:
            # Held back by its own size: the demand it saw is what it let through.
            target = max(need, 2 * self.count)
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
        self._grew = (self.count, rate) if target > self.count else None
        self.count = target
        self._since, self._asked, self._done, self._busy_s = now, 0, 0, 0.0
        return Decision(target, demand, per_item, busy)
