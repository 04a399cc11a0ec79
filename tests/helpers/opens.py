"""An outside count of a tree's file opens, by any process, on inotify events.

No code of stager's can bias it: the kernel reports every open of a file
under the watched directories (the FUSE emulator's opens of the backing
files included). inotify merges an event into the previous one when they
are identical and the previous is still unread. Two opens of one file at
the same moment (two emulated nodes' fetches, let through together after
the emulator's latency) would give OPEN, OPEN, merged into one. So each
file is watched both on its own and through its directory: every open
queues two events that differ (the file's watch, and the directory's with
the file's name), and two opens never leave two identical events side by
side, except where both land between the two events of one open (a few
instructions apart). A file's count is then the larger of its opens and its
closes seen on its own watch: never more than it was opened. Files made
after the count began (and any past the system's limit of watches) are
counted through their directory alone, as before. A thread drains the
events as they come.
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
        self.closes = collections.Counter()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._files = {}  # the files' own watches: wd -> relative path
        self._dirs = {}  # wd -> relative path
        self._lock = threading.Lock()
        self._stop = os.pipe()

    def __enter__(self):
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        for dirpath, _, names in os.walk(self.root):
            # Its events sit between any two of a file's own: none identical side by side.
            self._dirs[self._watch(dirpath)] = os.path.relpath(dirpath, self.root)
            for name in names:
                path = os.path.join(dirpath, name)
                if os.path.isfile(path):
                    wd = self._watch(path, spare=True)
                    if wd is not None:
                        self._files[wd] = os.path.normpath(os.path.relpath(path, self.root))
        self._watched = set(self._files.values())
        self._thread = threading.Thread(target=self._drain_until_stopped, daemon=True)
        self._thread.start()
        return self

    def _watch(self, path, spare=False):
        """A watch on ``path``; with ``spare``, None where the system's watches run out."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_OPEN | _IN_CLOSE_NOWRITE)
        if wd < 0:
            errno = ctypes.get_errno()
            if spare and errno == 28:  # ENOSPC: fs.inotify.max_user_watches reached
                return None
            raise OSError(errno, f"inotify_add_watch {path}")
        return wd

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
                    if mask & _IN_ISDIR:
                        continue
                    path = self._files.get(wd)
                    if path is None and name and wd in self._dirs:
                        path = os.path.normpath(os.path.join(self._dirs[wd], name))
                        if path in self._watched:
                            continue  # counted on the file's own watch
                    if path is None:
                        continue
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
