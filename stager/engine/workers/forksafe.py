"""Signals while a worker is forked, and in the worker.

In the parent: ``stager``'s SIGTERM handler raises ``SystemExit`` so that
every ``with`` block unwinds. Python runs a handler between bytecodes of the
main thread, and right after ``fork()`` those bytecodes belong to the at-fork
callbacks (``logging`` re-creates its locks there). An exception raised
inside such a callback is printed as "Exception ignored" and dropped: the run
goes on as if nothing had been asked. So while the main thread starts
workers, a SIGTERM is only noted, and replayed once the workers exist.

In the worker: a forked worker inherits its parent's Python handlers, and
those belong to the training process, not to a worker. Lightning's SIGTERM
handler kills the ranks its launcher started and joins a broadcast of the
parent's process group; its SIGUSR1 handler saves a checkpoint and requeues
the Slurm job. Run in a worker they would act a second time for the job, and
the broadcast, which no rank joins, never returns: ``multiprocessing``'s exit
handler terminates daemonic workers and then joins them without a timeout,
so the training process would never exit. A worker therefore ends at once
on SIGTERM (the kernel's default: the shutdown protocol's terminate step,
which comes only after the worker was told to stop and did not), ignores
Ctrl-C (the parent decides how to stop) and ignores every other signal its
parent handled in Python. The parent holds those signals back while it
forks, so none reaches a worker before it has set them its own way.
"""

import contextlib
import os
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


def _parents():
    """Signals a worker sets its own way: SIGTERM, SIGINT and any the process handles in Python now."""
    mine = {signal.SIGTERM, signal.SIGINT}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(ValueError, OSError):
            if callable(signal.getsignal(signum)):
                mine.add(signum)
    return mine


@contextlib.contextmanager
def held_while_forking():
    """Inside the block the calling thread holds back the signals a worker sets its own way.

    A worker forked here inherits the block, and takes what arrived meanwhile
    once ``worker_signals`` has set its handlers; the parent takes its own
    at the end of the block.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _parents())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_signals():
    """In a worker (first thing): SIGTERM ends it, Ctrl-C and its parent's other Python handlers do nothing.

    A SIGTERM its parent noted before the fork (``sigterm_noted``) ends it
    at once.
    """
    inherited = signal.getsignal(signal.SIGTERM)
    noted = isinstance(inherited, _Noted) and inherited.signum is not None
    held = _parents()
    for signum in held - {signal.SIGTERM, signal.SIGCHLD}:
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.SIGCHLD in held:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # ignored, it would reap a loader's own children unasked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    if noted:
        os.kill(os.getpid(), signal.SIGTERM)
