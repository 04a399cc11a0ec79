"""A pseudo-terminal for a child's standard error: what a user at a terminal sees."""

import fcntl
import os
import pty
import struct
import termios
import threading


class Terminal:
    """A pty whose slave end a child writes to; a thread drains the master end.

    Use ``slave`` as the child's ``stderr`` and call ``started()`` once the
    child runs; ``wait_for(text)`` blocks until ``text`` appears (or the child
    closes the terminal); ``text()`` is everything written so far.
    """

    def __init__(self):
        self._master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._drain, daemon=True)

    def started(self):
        os.close(self.slave)  # only the child holds it now: its exit ends the stream
        self._thread.start()

    def _drain(self):
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: every writer is gone
                chunk = b""
            with self._changed:
                if not chunk:
                    self._closed = True
                    self._changed.notify_all()
                    return
                self._buf += chunk
                self._changed.notify_all()

    def wait_for(self, text, timeout=60):
        """True once ``text`` was written; False if the terminal closed or ``timeout`` passed first."""
        needle = text.encode()
        with self._changed:
            return self._changed.wait_for(lambda: needle in self._buf or self._closed, timeout) and \
                needle in self._buf

    def text(self):
        with self._lock:
            return self._buf.decode(errors="replace")

    def close(self, timeout=30):
        """Waits for the drain thread (the child must have exited) and closes the master end."""
        self._thread.join(timeout)
        os.close(self._master)
