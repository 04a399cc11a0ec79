"""Live progress lines on standard error, drawn by ``tqdm``.

On a terminal one line redraws in place; anywhere else (a batch log, a pipe)
nothing is printed, so Slurm output files stay short: the run's summary line
and ``--report`` say the rest.
"""

import io
import os
import sys
import time

from tqdm import tqdm


def _width(stream):
    """The terminal's columns, or None where it does not say (0: a pty nobody sized)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return None


def _is_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal behind it
        return False


class Progress:
    """Counts work done out of ``total`` and shows it.

    Args:
        total: Units of work expected (0: unknown).
        desc: Label printed before the bar.
        unit: Name of a unit, e.g. "files".
        enabled: False shows nothing.
        stream: Where to write; default standard error.
    """

    def __init__(self, total, desc, unit="items", enabled=True, stream=None):
        stream = stream or sys.stderr
        self.enabled = enabled and _is_terminal(stream)
        self.done = 0
        width = _width(stream) if self.enabled else None
        # Follow the terminal's width as it changes, unless it reports none.
        self._bar = tqdm(total=total or None, desc=desc, unit=f" {unit}", file=stream, disable=not self.enabled,
                         dynamic_ncols=width is not None, ncols=None if width else 120, mininterval=0.2,
                         leave=True)

    def update(self, n=1):
        """Adds ``n`` units of work done."""
        self.done += n
        self._bar.update(n)

    def note(self, text):
        """Shows ``text`` after the bar (rates, totals); drawn with the bar's next refresh."""
        self._bar.set_postfix_str(text, refresh=False)

    def close(self):
        """Finishes the line."""
        self._bar.close()


class RunProgress(Progress):
    """Minibatches consumed, with the pipeline's samples/s, stall and bytes staged.

    Args:
        total: Minibatches expected (0: unknown).
        desc: Label printed before the bar.
        stats: The pipeline's ``Stats`` (read, never written), or a callable
            returning it (or None before the pipeline starts).
        enabled: False shows nothing.
        stream: Where to write; default standard error.
        every_s: Seconds between updates of the figures.
    """

    def __init__(self, total, desc, stats, enabled=True, stream=None, every_s=0.5):
        super().__init__(total, desc, "minibatches", enabled, stream)
        self.stats = stats
        self.every_s = every_s
        self.begin = self._noted = time.perf_counter()

    def update(self, n=1):
        first = not self.done
        super().update(n)
        now = time.perf_counter()
        if self.enabled and (first or now - self._noted >= self.every_s):
            self._noted = now
            self.note(self.figures(now - self.begin))
            if first:  # at once: the figures say that minibatches flow
                self._bar.refresh()

    def figures(self, elapsed):
        """The line's figures after ``elapsed`` seconds: samples/s, stall %, bytes staged."""
        s = self.stats() if callable(self.stats) else self.stats
        if s is None:
            return ""
        elapsed = max(elapsed, 1e-9)
        return (f"{s.samples / elapsed:,.0f} samples/s, stall {min(s.stall_s / elapsed, 1.0):.1%}, "
                f"staged {s.bytes_staged / 1e6:,.1f} MB")

    def close(self):
        if self.enabled:
            self.note(self.figures(time.perf_counter() - self.begin))
        super().close()
