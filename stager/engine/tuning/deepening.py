"""``staging.lookahead: auto`` while running: as deep as the source's latency needs, room allowing.

At start ``auto`` is the depth the node's capacity fits, at most
``cache.AUTO_DEPTH``. A source whose fetches last many training steps
(an object store's first byte, a file system under load, against a fast
step) needs more minibatches asked for ahead than that when the
prefetchers could fetch them at once: with a small batch per rank and
many prefetchers, each fetching a file of its own, only the look-ahead
limits how many files are in flight. The coordinator feeds ``Deepening``
what the node and the consumer already tell it, and asks one minibatch
deeper at a time while Little's law (``cache.needed_depth``) asks for more
and a prefetcher had nothing to do, up to the deepest the node's room
allows (``cache.fitting_depth(..., most=MAX_DEPTH)``):

- how long the node took to stage a minibatch's fetched files
  (``Ready.span``), over minibatches that fetched any;
- whether a prefetcher was idle when it was answered (``Ready.spare``):
  where every prefetcher is busy the source's pace, not the depth, is the
  limit, and more requests would only wait in the queue;
- how long the training took per minibatch, the time it waited for one
  left out (``Consumed.stall``): with the waits in, a look-ahead too
  shallow would measure its own stalls as a slow training.

Where the need falls well below the depth (a faster source, a slower
step), it returns towards the start's depth, never below: the node's cache
then meets the requests as ``readpins`` and the simulator's replay say
whatever the depth is now (a rank deeper than its ``Hello`` said only lets
its read files go sooner). Each change is a ``RESIZED`` event
(``POOL_LOOKAHEAD``).
"""

from ... import telemetry as tm
from ...cache import needed_depth

WEIGHT = 0.2  # of each new measurement in the running means: a few minibatches' worth of memory
SHRINK_BELOW = 2  # minibatches the need must fall under the depth before it shrinks: no flapping at a boundary


class Deepening:
    """One rank's ``auto`` look-ahead while running.

    Args:
        start: The depth the rank started with (its floor).
        ceiling: The deepest the node's room allows (above ``start``).
        telemetry: Where changes go (``RESIZED``, ``POOL_LOOKAHEAD``), or
            None (the simulator keeps its own timeline).
    """

    def __init__(self, start, ceiling, telemetry):
        self.start = start
        self.ceiling = max(start, ceiling)
        self.depth = start
        self.telemetry = telemetry
        self.span_s = None  # running mean of ``Ready.span`` over minibatches that fetched
        self.step_s = None  # running mean of the training's time per minibatch
        self.spare = 0.0    # running share of answers that found a prefetcher idle (the first, asked alone, is)
        self._last = None   # when the previous minibatch was consumed

    def staged(self, span_s, spare):
        """A minibatch was staged; its fetches took ``span_s`` seconds (0: nothing fetched), ``spare``: see ``Ready``."""
        if span_s > 0:
            self.span_s = _mean(self.span_s, span_s)
            self.spare = _mean(self.spare, 1.0 if spare else 0.0)

    def consumed(self, now, stall_s):
        """The consumer took a minibatch at ``now`` after waiting ``stall_s``; returns the depth to ask to."""
        if self._last is not None:
            self.step_s = _mean(self.step_s, max(0.0, now - self._last - stall_s))
        self._last = now
        if self.span_s is None or self.step_s is None:
            return self.depth
        need = needed_depth(self.span_s, self.step_s)
        depth = self.depth
        if need > depth and self.spare > 0.5:
            depth = min(self.ceiling, depth + 1)
        elif need < depth - SHRINK_BELOW:
            depth = max(self.start, need)
        if depth != self.depth:
            self.depth = depth
            if self.telemetry is not None:
                self.telemetry.record(tm.RESIZED, tm.POOL_LOOKAHEAD, depth, self.span_s)
        return self.depth


def _mean(mean, value):
    return value if mean is None else (1 - WEIGHT) * mean + WEIGHT * value
