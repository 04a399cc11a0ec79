"""How ``stager run`` stops on SIGTERM or SIGINT: at a step boundary, or out of a wait.

A signal must not land between taking a minibatch and counting it: the
records would then hold a minibatch the saved position does not cover, and a
resumed run would read it again. So the handler only raises while the loop
waits (for the next minibatch, or in the simulated compute step); at any
other moment it notes the request, and the loop stops before its next step.
Either way the minibatch in hand is counted in both, or in neither.
"""

import contextlib
import signal
import threading


class Stopped(BaseException):
    """Raised out of an interruptible wait when a stop was asked for.

    Attributes:
        signum: The signal that asked.
    """

    def __init__(self, signum):
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


class StopRequest:
    """Catches SIGTERM and SIGINT for the duration of a ``with`` block (main thread only).

    Attributes:
        signum: The first stop signal received, or None.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum = None
        self._waiting = False
        self._previous = {}

    @property
    def requested(self):
        """Whether a stop signal arrived."""
        return self.signum is not None

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        if self._waiting:  # leave the wait now; outside one, the loop checks ``requested``
            self._waiting = False
            raise Stopped(signum)

    def __enter__(self):
        # Signal handlers can only be set from the main thread; elsewhere the
        # caller's own handling stays in force.
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def interruptible(self):
        """A block a stop signal leaves at once (by ``Stopped``)."""
        if self.signum is not None:
            raise Stopped(self.signum)
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    def exit(self):
        """Ends the process as the signal would have: SIGINT as ``KeyboardInterrupt``, else ``SystemExit``.

        A rank that another rank's signal stopped exits as if it had had SIGTERM.
        """
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + (self.signum or signal.SIGTERM))
