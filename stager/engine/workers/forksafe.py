"""Holding SIGTERM back while the main thread forks a worker.

``stager``'s SIGTERM handler raises ``SystemExit`` so that every ``with``
block unwinds. Python runs a handler between bytecodes of the main thread,
and right after ``fork()`` those bytecodes belong to the at-fork callbacks
(``logging`` re-creates its locks there). An exception raised inside such a
callback is printed as "Exception ignored" and dropped: the run goes on as
if nothing had been asked. So while the main thread starts workers, a
SIGTERM is only noted, and replayed once the workers exist (in the parent)
or once the worker has put its own handler back (in a forked child).
"""

import contextlib
import signal
import threading


class _Noted:
    """A SIGTERM handler that notes the signal for later; remembers the handler it replaced."""

    def __init__(self, previous):
        self.previous = previous
        self.signum = None

    def __call__(self, signum, frame):
        self.signum = signum

    def restore(self):
        """Puts the replaced handler back, then gives it the signal that arrived meanwhile."""
        signal.signal(signal.SIGTERM, self.previous)
        if self.signum is not None and callable(self.previous):
            self.previous(self.signum, None)


@contextlib.contextmanager
def sigterm_noted():
    """Inside the block, a SIGTERM to the main thread is replayed at its end instead of lost."""
    previous = signal.getsignal(signal.SIGTERM)
    # Only a Python handler can be swallowed; other threads' forks never run
    # one (handlers run in the main thread, outside the forking thread's callbacks).
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    noted = _Noted(previous)
    signal.signal(signal.SIGTERM, noted)
    try:
        yield
    finally:
        noted.restore()


def restore_in_child():
    """In a worker forked inside ``sigterm_noted``: its parent's handler again, and any signal noted."""
    handler = signal.getsignal(signal.SIGTERM)
    if isinstance(handler, _Noted):
        handler.restore()
