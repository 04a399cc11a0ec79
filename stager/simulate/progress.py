"""A line now and then while a long simulation runs: what it is doing, how far along, how long is left."""

import sys
import time

FIRST_S = 5.0   # a simulation done sooner prints nothing
EVERY_S = 10.0  # then a line at most this often


class Progress:
    """Prints ``stager simulate: <method>: <phase> <done> of <total> (<share>), about <s> s left``.

    Called often (``update``), it prints only once a phase has run
    ``FIRST_S`` and then every ``EVERY_S``; the time left is the phase's
    pace so far, applied to what remains of it.

    Args:
        out: Where lines go (a file; stderr by default).
        clock: Seconds, monotonic.
    """

    def __init__(self, out=None, clock=time.monotonic):
        self.out = out or sys.stderr
        self.clock = clock
        self.method = ""
        self._phase = None
        self._began, self._said = 0.0, None

    def start(self, method):
        """The simulation of ``method`` begins."""
        self.method = method
        self._phase = None

    def update(self, phase, done, total, unit):
        """``done`` of ``total`` ``unit`` of ``phase`` (a few words) are done."""
        now = self.clock()
        if phase != self._phase:
            self._phase, self._began, self._said = phase, now, None
            return
        if now - self._began < FIRST_S or (self._said is not None and now - self._said < EVERY_S) or not total:
            return
        self._said = now
        left = (now - self._began) * (total - done) / done if done else float("nan")
        print(f"stager simulate: {self.method}: {phase}: {unit} {done:,} of {total:,} ({done / total:.0%}), "
              f"about {left:.0f} s left", file=self.out, flush=True)
