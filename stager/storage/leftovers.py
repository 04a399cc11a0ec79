"""Staging directories whose job is gone: recognising them and removing them.

The janitor removes a job directory when its owner dies, but a node reboot
or an out-of-memory kill of the whole process group takes the janitor too,
and the directory would stay forever. So the owner holds an ``flock`` on the
job directory's ``.lock`` for as long as it runs, and writes into that file a
small owner record (host, pid and the pid's start time, whether the job keeps
its files). A directory under a base is a leftover when it is
this user's, its record names this host, the job did not ask to keep it,
the recorded process no longer runs, and nobody holds its lock. A node
leader removes leftovers at start (``JobDir.create``); ``stager clean`` does
the same by hand. Directories without a record are never touched: stager
cannot tell that they are its own.
"""

import fcntl
import json
import logging
import os
import shutil
import socket
import stat
from dataclasses import dataclass

LOCK = ".lock"
PREFIX = "stager-"

log = logging.getLogger("stager")


def _start_time(pid):
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_owner(lock_fd, keep):
    """Records this process as the owner in the job directory's lock file (open as ``lock_fd``, locked)."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()), "keep": keep}
    data = json.dumps(record).encode()
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, data, 0)


def live_jobs(base, own=None):
    """How many job directories under ``base`` (``own`` left out) belong to a job running on this host now.

    Read from their owner records alone, without touching a lock: a job
    taking its lock at this moment must not find it held by us.
    """
    count = 0
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(base, name)
        if own is not None and os.path.abspath(path) == os.path.abspath(own):
            continue
        owner = _owner(path)
        if (owner and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int)
                and _start_time(owner["pid"]) == owner.get("start")):
            count += 1
    return count


def is_marked(path):
    """Whether the directory ``path`` holds an owner record, that is, stager made it."""
    return _owner(path) is not None


@dataclass(frozen=True)
class Leftover:
    """A directory looked at by ``sweep``.

    Attributes:
        path: The directory.
        removed: Whether it was (or, dry, would be) removed.
        why: Why it was removed or left.
        nbytes: Bytes of the files in it.
    """

    path: str
    removed: bool
    why: str
    nbytes: int = 0


def _size(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _owner(path):
    try:
        with open(os.path.join(path, LOCK), "rb") as fh:
            record = json.loads(fh.read(4096))
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):  # none, or one being written
        return None


def _examine(path, dry_run):
    """Removes ``path`` if its job is gone; returns a ``Leftover``, or None for a directory without a record."""
    owner = _owner(path)
    if owner is None:
        return None
    host, pid = owner.get("host"), owner.get("pid")
    if host != socket.gethostname():
        return Leftover(path, False, f"its job ran on {host}, not on this host")
    if owner.get("keep"):
        return Leftover(path, False, "kept (staging.keep)")
    if isinstance(pid, int) and _start_time(pid) is not None and _start_time(pid) == owner.get("start"):
        return Leftover(path, False, f"in use by pid {pid}")
    try:
        lock = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return Leftover(path, False, "no lock file")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Leftover(path, False, "its lock is held")
        nbytes = _size(path)
        why = f"owner pid {pid} on {host} no longer runs, nobody holds its lock"
        if not dry_run:
            # Held until the directory is gone: a job starting with the same
            # id meanwhile finds the lock taken and says so, rather than losing files.
            shutil.rmtree(path, ignore_errors=True)
        return Leftover(path, True, why, nbytes)
    finally:
        os.close(lock)


def sweep(base, dry_run=False):
    """Removes this user's staging directories under ``base`` whose job is gone.

    Args:
        base: A node-local base directory (``staging.local_dir``).
        dry_run: Only say what would be removed.

    Returns:
        A ``Leftover`` for each ``stager-*`` directory of this user that holds
        an owner record, removed or not.
    """
    found = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        result = _examine(entry.path, dry_run)
        if result is not None:
            found.append(result)
    return found


def sweep_at_start(base):
    """What a node leader does before making its job directory: removes leftovers, saying so."""
    for item in sweep(base):
        if item.removed:
            log.warning("stager: removed %s, the staging directory of a job that is gone (%s; %.1f MB)",
                        item.path, item.why, item.nbytes / 1e6)


def clean(base, dry_run=False, out=print):
    """``stager clean``: sweeps ``base`` and reports each directory; returns the exit status."""
    items = sweep(base, dry_run)
    verb = "would remove" if dry_run else "removed"
    for item in items:
        if item.removed:
            out(f"{verb} {item.path}: its job is gone ({item.why}); {item.nbytes / 1e6:.1f} MB")
        else:
            out(f"left {item.path}: {item.why}")
    gone = [i for i in items if i.removed]
    out(f"{len(gone)} staging director{'y' if len(gone) == 1 else 'ies'} "
        f"{'would be removed' if dry_run else 'removed'} under {base}, "
        f"{sum(i.nbytes for i in gone) / 1e6:.1f} MB")
    return 0
