"""Counts from the model (``auto``) while running: a ``Tuner`` per pool, from measured rates.

The counts a pool starts with come from ``start.choose_counts``.

A ``Tuner`` per pool applies Little's law to what it measures
over a window (not over the pool's start, until every worker has finished
an item): the items asked for per second (the demand), the worker seconds
each item took, and, where the caller can read it, how busy the machine's
cores were. When the workers
were nearly all busy and work was waiting, the demand it saw was held back
by the pool itself, and the cores decide the step:

- cores with room: every item costs them about the same, so they allow
  ``CORES_FULL / busy`` times the items/s, and at the same time per item
  that takes as many times the workers (at most twice);
- workers *waiting* (more than half of their busy time neither on a core
  nor queued for one, ``perf.clock``: a slow source; where the run queue is
  not known, their CPU under half of it): each takes the share of the
  cores it used, and the room left takes that many more (at most
  ``IDLE_STEP`` times, as where the cores are mostly idle: every window at
  the old size is a stall). Workers queued for a core are not waiting on
  the source, however little CPU they got;
- cores full: none; more workers would only queue for them (and there the
  items/s hardly depend on the count, so a step could not be judged);
  waiting workers, which cost them little, twice the pool;
- load unknown: a quarter more.

The largest size may follow the time per item (``limit``: the source's
bandwidth allows more prefetchers when each file takes longer).

Growth must pay, judged once the pool has grown by a quarter over windows
in a row (a smaller growth promises less than a window's noise): workers as
quick as before promise items/s in proportion to their number, and when the
items/s rose by
less than half of that, the items/s the larger pool got is the pace of
something more workers cannot add (the cores); the pool goes to the size
Little's law gives at that pace with the smaller pool's time per item (never
below the smaller pool), and no higher until the time per item leaves, by
half, what the two sizes measured (the source or the load changed); while
the cores have room and the source's limit bounds the pool, a growth that
did not pay is the window's noise, not a ceiling. It shrinks only well
below its size, after two quiet windows (each judged alone) and by half at
most (hysteresis), so noise does not make it oscillate; an idle pool is
judged too. The caller resizes the pool between minibatches.
"""

import math
from dataclasses import dataclass

from .start import HEADROOM, bounded as _bounded

PAID = 0.5              # share of the items/s a growth promised that it must deliver to stay
# A saturated pool's step where the cores' load is not known, and the growth judged at once
# (a smaller one promises less than a window's noise). The pool starts near the cores' pace,
# so a step refines rather than ramps: near that pace a step is overshoot, and each worker it
# forks pauses the service thread (4-7 ms on the 2-core development machine).
GROWTH = 1.25
CORES_FULL = 0.9        # cores this busy are saturated: the rest is gaps between processes' turns
SAME_ITEM = 1.2         # times per item within this factor of each other are the same (a window's noise)
IDLE_CORES = 0.5        # cores less busy than this are mostly idle: a saturated pool may grow faster
IDLE_STEP = 8           # the most a pool grows in one window where the cores are mostly idle
WAITING = 0.5           # workers on a core less than this share of their busy time are waiting, not working
BACKLOG = 4             # items waiting per worker that show a pool held back even when it looks half idle
IDLE_WINDOWS = 2        # windows with nothing asked and nothing to do after which an idle pool is judged


@dataclass
class Decision:
    """A tuner's verdict over one window.

    Attributes:
        count: The pool's new size.
        demand: Items asked for per second.
        per_item_s: Worker seconds per item.
        busy: Fraction of the pool's worker time spent busy.
        why: The rule that decided, in words (the report's ``counts_timeline``).
    """

    count: int
    demand: float
    per_item_s: float
    busy: float
    why: str = ""


class Tuner:
    """Sizes one pool from its measured rates (see the module's text).

    Args:
        count: The pool's size now.
        low: Smallest size.
        high: Largest size.
        window_s: Shortest time between decisions.
        min_items: Fewest items finished in a window to decide on.
        limit: Optional callable ``(seconds per item) -> size``: the most
            worth having at the time per item measured (the source's
            bandwidth for prefetchers), below ``high``; None: ``high``.
        cores: The cores the pool's workers share (with ``finished``'s
            ``cpu_s``: what a worker costs them), or None.
    """

    def __init__(self, count, low, high, window_s=0.25, min_items=8, limit=None, cores=None):
        self.count, self.low, self.high = count, low, high
        self.limit, self.cores = limit, cores
        self._cpu_s = None  # the workers' CPU seconds over the window, where they report it
        self._queued_s = None  # and their seconds queued for a core, where the kernel tells them
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

    def finished(self, items, busy_s, cpu_s=None, queued_s=None):
        """A worker finished ``items`` in ``busy_s`` seconds, ``cpu_s`` of them on a core and ``queued_s``
        waiting for one (each None where not known)."""
        self._done += items
        self._busy_s += busy_s
        if cpu_s is not None:
            self._cpu_s = (self._cpu_s or 0.0) + cpu_s
            if queued_s is not None:
                self._queued_s = (self._queued_s or 0.0) + queued_s
        self.outstanding = max(0, self.outstanding - items)

    def window(self):
        """``(busy_s, cpu_s, queued_s)`` the window's finished items took so far (None: not reported)."""
        return self._busy_s, self._cpu_s, self._queued_s

    def _paid(self, rate):
        """Whether the last growth raised the items done per second by ``PAID`` of what it promised.

        Workers that each take as long per item as before promise items/s in
        proportion to their number (Little's law).
        """
        before, before_rate, _ = self._grew
        promised = before_rate * (self.count / before - 1)
        return rate - before_rate >= PAID * promised

    def _waiting(self):
        """Whether the pool's workers spent most of their busy time waiting on a source.

        Neither on a core nor queued for one; where the run queue is not
        known, off the cores (a worker queued for a full machine's cores then
        counts as waiting).
        """
        if self._cpu_s is None or self._busy_s <= 0:
            return False
        return self._cpu_s + (self._queued_s or 0.0) < WAITING * self._busy_s

    def _step(self, cores_busy, elapsed):
        """The size a saturated pool goes to, by how busy the cores were (see the module's text)."""
        if cores_busy is None:
            return math.ceil(GROWTH * self.count)  # the next window judges a step
        waiting = self._waiting()
        if cores_busy >= CORES_FULL:
            # The cores, not the pool, hold the items back: more would queue for them. Workers
            # that wait cost them little: twice the pool, which the next windows judge.
            return 2 * self.count if waiting else self.count
        # Twice the pool at most; more where its workers wait or the cores are mostly idle:
        # the items wait on something that costs no CPU (a source slower than before), and
        # every window at the old size is a stall.
        most = IDLE_STEP if waiting or cores_busy < IDLE_CORES else 2
        if waiting and self.cores:
            # Little's law on the cores: each worker takes the share of them it used; the
            # room left takes that many more.
            share = self._cpu_s / (elapsed * self.cores * self.count)
            room = CORES_FULL - cores_busy
            fill = math.ceil(self.count + room / share) if share > 0 else most * self.count
        else:
            # Every item costs the cores about the same, so they allow the items/s they gave times
            # CORES_FULL / cores_busy; Little's law at the same time per item: as many more workers.
            fill = math.ceil(self.count * CORES_FULL / cores_busy) if cores_busy > 0 else most * self.count
        return min(most * self.count, max(self.count + 1, fill))

    def restart(self, now):
        """Starts a new window at ``now``: the pool was just resized (starting workers takes time)."""
        self._since, self._asked, self._done, self._busy_s, self._cpu_s, self._queued_s = now, 0, 0, 0.0, None, None

    def due(self, now):
        """Whether a window has enough to go on (``decide`` would decide)."""
        if self._since is None:
            return False
        if not self._warm:  # the pool's start: over once every worker has finished an item
            return self._done >= max(self.min_items, self.count)
        if self.outstanding == 0 and now - self._since >= IDLE_WINDOWS * self.window_s:
            return True  # nothing asked, nothing to do: an idle pool is judged too, or it would never shrink
        return now - self._since >= self.window_s and self._done >= self.min_items

    def _noise(self, cores_busy, window_per_item):
        """Whether a growth that did not pay was held back by nothing more workers cannot add.

        Cores known to have room, and each item as long as before the growth:
        the shortfall is the window's count of finished items (tasks of many
        files end in bursts), not a ceiling. With a ``limit`` (the source's
        bandwidth at the time per item) an item that got longer is the source
        slowing down or reaching its bandwidth, which the limit already
        bounds: the cores' room decides alone.
        """
        return (cores_busy is not None and cores_busy < CORES_FULL
                and (self.limit is not None or window_per_item < SAME_ITEM * self._grew[2]))

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
            per_item = self._busy_s / self._done if self._done else 0.0
            held = cores_busy is not None and cores_busy < IDLE_CORES and self.outstanding > 2 * self.count
            # Except that work waits while the cores idle: the first items waited on a source
            # slower than the probe saw, and the pool grows now rather than a window later.
            step = self._step(cores_busy, max(now - self._since, 1e-3)) if held else self.count
            self.restart(now)
            if not held:
                return None
            self.count = _bounded(step, self.low, self.high)
            return Decision(self.count, 0.0, per_item, 1.0, "the first items waited while the cores idled")
        elapsed = now - self._since
        rate = self._done / elapsed
        # An idle window finished nothing: its time per item is the last one measured.
        window_per_item = self._busy_s / self._done if self._done else (self._per_item or 0.0)
        demand, per_item = self._asked / elapsed, window_per_item
        if self._demand is not None:  # smoothed over windows: one burst must not resize the pool
            demand = (demand + self._demand) / 2
            per_item = (per_item + self._per_item) / 2
        self._demand, self._per_item = demand, per_item
        busy = self._busy_s / (self.count * elapsed)
        if self._ceiling is not None and not self._ceiling[1] / 1.5 < window_per_item < self._ceiling[2] * 1.5:
            self._ceiling = None  # outside what both sizes measured, by half: the source or the load changed
        high = self.high
        if self.limit is not None and per_item > 0:
            high = max(self.low, min(high, self.limit(per_item)))
        # The smoothed time per item, or the window's where shorter: a stalled source's seconds
        # must not keep growing the pool after it recovered (a slowing one grows it as held back).
        need = _bounded(math.ceil(demand * min(per_item, window_per_item) * HEADROOM), self.low, high)
        # Shrinking is judged on the window alone (two quiet ones in a row are its hysteresis).
        need_now = _bounded(math.ceil(self._asked / elapsed * window_per_item * HEADROOM), self.low, high)
        target, why = self.count, ""
        judge = self._grew is not None and self.count >= GROWTH * self._grew[0]
        if judge and not self._paid(rate) and not self._noise(cores_busy, window_per_item):
            # The workers added mostly waited, for something more workers cannot add (the
            # cores): the items/s the pool got is that thing's pace, and Little's law at it
            # with the smaller pool's time per item is the pool it takes. No higher while
            # the time per item holds.
            before, _, before_per_item = self._grew
            target = _bounded(math.ceil(rate * before_per_item), before, self.count)
            self._ceiling = (target, before_per_item, window_per_item)
            why = "the last growth did not pay: the pool the pace it got needs"
        elif (busy > 0.85 and self.outstanding > self.count) or \
                (busy > 0.5 and self.outstanding > BACKLOG * self.count):
            # Held back: the demand it saw is only what it let through. (A backlog of several items
            # a worker is that too: an item is counted busy when it ends, so a window of items
            # longer than before, a source slowing down, shows its workers less busy than they were.)
            target = self._step(cores_busy, elapsed)
            self._idle_windows = 0
            why = ("held back, waiting on the source" if self._waiting() else
                   "held back, cores to spare" if cores_busy is not None and cores_busy < CORES_FULL else
                   "held back")
        elif need > self.count:
            target = need
            self._idle_windows = 0
            why = "the demand measured needs more (Little's law)"
        elif need_now < 0.6 * self.count and busy < 0.5:
            # Shrink only after two quiet windows in a row, and by half at most.
            self._idle_windows += 1
            if self._idle_windows >= 2:
                target = max(need_now, math.ceil(self.count / 2), self.low)
                self._idle_windows = 0
                why = "two quiet windows: shrinks"
        else:
            self._idle_windows = 0
        if self._ceiling is not None and target > self.count:
            target = max(self.count, min(target, self._ceiling[0]))
        if target > high:
            why = f"{why} (capped by the source's bandwidth or memory)" if why else \
                "capped by the source's bandwidth or memory at the time per item measured"
        target = _bounded(target, self.low, high)
        # Growths are judged once they add up to GROWTH: a smaller one promises less than one
        # window's noise. Growing window after window, the sizes before the first are the base.
        if target <= self.count or judge:
            self._grew = None
        if target > self.count and self._grew is None:
            self._grew = (self.count, rate, window_per_item)
        self.count = target
        self._since, self._asked, self._done, self._busy_s, self._cpu_s, self._queued_s = now, 0, 0, 0.0, None, None
        return Decision(target, demand, per_item, busy, why)
