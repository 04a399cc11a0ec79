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


def wait_for_lines(path, count, pid=None, timeout=120):
    """Blocks until ``path`` holds ``count`` whole lines.

    The file's directory must exist; the file may not yet. Returns False if
    process ``pid`` exits first or ``timeout`` passes.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    watched = [fd]
    try:
        if libc.inotify_add_watch(fd, os.fsencode(os.path.dirname(path)), _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {os.path.dirname(path)}")
        if pid is not None:
            watched.append(os.pidfd_open(pid))
        deadline = time.monotonic() + timeout
        while lines_in(path) < count:  # checked after the watch exists: no line can slip between
            left = deadline - time.monotonic()
            ready = select.select(watched, [], [], max(left, 0))[0] if left > 0 else []
            if not ready or (len(watched) > 1 and watched[1] in ready):
                return lines_in(path) >= count
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
        return True
    finally:
        for each in watched:
            os.close(each)


def wait_removed(path, timeout=60):
    """Blocks until directory ``path`` is removed (inotify ``IN_DELETE_SELF``); False after ``timeout``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if libc.inotify_add_watch(fd, os.fsencode(path), _IN_DELETE_SELF) < 0:
            return not os.path.exists(path)  # gone before the watch could be set
        deadline = time.monotonic() + timeout
        while os.path.exists(path):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return False
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
        return True
    finally:
        os.close(fd)
