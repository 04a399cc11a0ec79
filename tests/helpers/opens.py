"""An outside count of a tree's file opens, by any process, on inotify events.

No code of stager's can bias it: the kernel reports every open of a file
under the watched directories (the FUSE emulator's opens of the backing
files included). inotify merges an event into the previous one when they
are identical and the previous is still unread, so closes are watched too
(a file opened again after its close gives OPEN, CLOSE, OPEN: nothing to
merge) and a thread drains the events as they come. Two opens of one file
at the same moment (two emulated nodes' fetches, each let through after
the emulator's latency) still give OPEN, OPEN; their closes rarely come
together too, so a file's count is the larger of its opens and its closes
seen: never more than it was opened.
"""

import collections
import ctypes
import os
import select
import struct
import threading

_IN_CLOSE_NOWRITE, _IN_OPEN, _IN_ISDIR = 0x10, 0x20, 0x40000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class Opens:
    """Counts opens of files under ``root`` while the ``with`` block runs.

    ``count()`` returns a ``Counter`` of relative path to opens; call it
    once the processes that opened the files have finished.
    """

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.counts = collections.Counter()
        self.closes = collections.Counter()  # a merged OPEN's close still counts it
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._dirs = {}
        self._lock = threading.Lock()
        self._stop = os.pipe()

    def __enter__(self):
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        for dirpath, _, _ in os.walk(self.root):
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(dirpath), _IN_OPEN | _IN_CLOSE_NOWRITE)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {dirpath}")
            self._dirs[wd] = os.path.relpath(dirpath, self.root)
        self._thread = threading.Thread(target=self._drain_until_stopped, daemon=True)
        self._thread.start()
        return self

    def _drain(self):
        while True:
            try:
                data = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                return
            at = 0
            with self._lock:
                while at < len(data):
                    wd, mask, _, length = _EVENT.unpack_from(data, at)
                    name = data[at + _EVENT.size:at + _EVENT.size + length].rstrip(b"\0").decode()
                    at += _EVENT.size + length
                    if mask & _IN_ISDIR or not name:
                        continue
                    path = os.path.normpath(os.path.join(self._dirs[wd], name))
                    if mask & _IN_OPEN:
                        self.counts[path] += 1
                    if mask & _IN_CLOSE_NOWRITE:
                        self.closes[path] += 1

    def _drain_until_stopped(self):
        while self._stop[0] not in select.select([self._fd, self._stop[0]], [], [])[0]:
            self._drain()

    def count(self):
        """Reads what is queued; returns the ``Counter`` so far (relative path -> opens)."""
        self._drain()
        with self._lock:
            return collections.Counter({path: max(n, self.closes[path]) for path, n in self.counts.items()})

    def __exit__(self, *exc):
        os.write(self._stop[1], b"x")
        self._thread.join()
        for fd in (self._fd, *self._stop):
            os.close(fd)
