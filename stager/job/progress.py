"""A small progress bar for long work, on standard error.

On a terminal it redraws one line; in a batch log (Slurm output files) it
prints a line at each quarter, so logs stay short.
"""

import sys
import time


class Progress:
    """Counts work done out of ``total`` and shows it.

    Args:
        total: Units of work expected.
        desc: Label printed before the bar.
        unit: Name of a unit, e.g. "files".
        enabled: False shows nothing.
        stream: Where to write; default standard error.
    """

    def __init__(self, total, desc, unit="items", enabled=True, stream=None):
        self.total = max(total, 1)
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.begin = time.perf_counter()
        self._last_draw = 0.0
        self._last_quarter = -1

    def update(self, n=1):
        """Adds ``n`` units of work done."""
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= 0.1 or self.done >= self.total:
                self._last_draw = now
                self._draw("\r", "")
        else:
            quarter = min(4, 4 * self.done // self.total)
            if quarter != self._last_quarter:
                self._last_quarter = quarter
                self._draw("", "\n")

    def _draw(self, head, tail):
        frac = min(1.0, self.done / self.total)
        rate = self.done / max(time.perf_counter() - self.begin, 1e-9)
        bar = "#" * int(frac * 24)
        self.stream.write(f"{head}{self.desc}: [{bar:<24}] {frac:6.1%} {self.done}/{self.total} {self.unit} "
                          f"({rate:,.0f}/s){tail}")
        self.stream.flush()

    def close(self):
        """Finishes the line."""
        if self.enabled and self.tty:
            self._draw("\r", "\n")
