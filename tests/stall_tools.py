"""Waiting on processes blocked in a FUSE request, for the tests of stalls and hung mounts."""

import os
import select
import time


def state(pid):
    """The process's state letter (``R``, ``S``, ``D``, ``Z``), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def in_fuse_request(pid):
    """Whether ``pid`` waits in the kernel for a FUSE daemon's answer."""
    try:
        with open(f"/proc/{pid}/wchan") as fh:
            return fh.read().strip() == "request_wait_answer"
    except FileNotFoundError:
        return False


def wait_until(predicate, timeout_s, what):
    """Polls ``predicate`` (a state of /proc that no event announces) until true; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.01)


def exited_within(pid, timeout_s):
    """Whether ``pid`` exits (or has exited) within ``timeout_s``, watched through a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)
