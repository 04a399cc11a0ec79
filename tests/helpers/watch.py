"""Waiting for a file to grow or a directory to go, on inotify events (no polling)."""

import ctypes
import os
import select
import time

_IN_MODIFY, _IN_CREATE, _IN_MOVED_TO, _IN_DELETE_SELF = 0x2, 0x100, 0x80, 0x400


def lines_in(path):
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait(done, watch, mask, timeout, pid=None):
    """Blocks until ``done()``, asking it again at each inotify event (``mask``) on path ``watch``.

    Returns False if process ``pid`` exits first or ``timeout`` passes.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    watched = [fd]
    try:
        if libc.inotify_add_watch(fd, os.fsencode(watch), mask) < 0:
            if done():  # a path that went before the watch could be set on it
                return True
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {watch}")
        if pid is not None:
            watched.append(os.pidfd_open(pid))
        deadline = time.monotonic() + timeout
        while not done():  # asked after the watch exists: no event can slip between
            left = deadline - time.monotonic()
            ready = select.select(watched, [], [], max(left, 0))[0] if left > 0 else []
            if not ready or (len(watched) > 1 and watched[1] in ready):
                return done()
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
        return True
    finally:
        for each in watched:
            os.close(each)


def wait_for_lines(path, count, pid=None, timeout=120):
    """Blocks until ``path`` holds ``count`` whole lines.

    The file's directory must exist; the file may not yet. Returns False if
    process ``pid`` exits first or ``timeout`` passes.
    """
    return _wait(lambda: lines_in(path) >= count, os.path.dirname(path), _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO,
                 timeout, pid)


def wait_removed(path, timeout=60):
    """Blocks until directory ``path`` is removed (``IN_DELETE_SELF``); False after ``timeout``."""
    return _wait(lambda: not os.path.exists(path), path, _IN_DELETE_SELF, timeout)


def still_running(pids, timeout):
    """Waits up to ``timeout`` seconds for each of ``pids`` to exit (on pidfds); returns those that did not."""
    late = []
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                late.append(pid)
        finally:
            os.close(fd)
    return late
