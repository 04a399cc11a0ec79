"""Worker counts the node cannot hold, refused before any worker starts.

Every worker is a process, and the process that starts it keeps a few file
descriptors for it; a count far above what the node allows (a typo such as
``staging.prefetchers: 1000000``) would otherwise fail halfway through
starting the pool, with ``OSError: Too many open files`` or the OOM killer,
after the job directory was made. The rule, per node:

- file descriptors: each worker costs its parent ``FDS_PER_WORKER`` (its reply
  pipe, its sentinel, a reader's shared-memory ring and its pipe), plus
  ``FD_HEADROOM`` for everything else; the total must fit the process's
  ``RLIMIT_NOFILE`` (``ulimit -n``);
- processes: the node's workers (the leader's prefetchers and every local
  rank's readers), with the processes and threads the user already runs,
  must fit ``RLIMIT_NPROC`` (``ulimit -u``; root is exempt, as in the kernel);
- memory: each of the node's workers needs at least ``MIB_PER_WORKER`` MiB of
  its own (an interpreter's private pages after the fork), within the
  node's available memory (``MemAvailable``).
"""

import os
import resource

from ...errors import ConfigError

FDS_PER_WORKER = 4
FD_HEADROOM = 64
MIB_PER_WORKER = 16


def worker_limit_error(counts, own, node, nofile, nproc, tasks_running, mem_available):
    """Why the node cannot hold these workers, or None (a pure function of the numbers).

    Args:
        counts: What the numbers come from, for the message (e.g.
            ``staging.prefetchers = 8, reader.workers = 2``).
        own: Workers this process starts.
        node: Workers the node's ranks start together.
        nofile: ``RLIMIT_NOFILE`` soft limit (``resource.RLIM_INFINITY``: none).
        nproc: ``RLIMIT_NPROC`` soft limit, or ``resource.RLIM_INFINITY``
            (also for root, who is exempt).
        tasks_running: Processes and threads the user runs already.
        mem_available: Bytes of memory available on the node, or None if unknown.
    """
    fds = own * FDS_PER_WORKER + FD_HEADROOM
    if nofile != resource.RLIM_INFINITY and fds > nofile:
        return (f"{counts}: {own} worker processes need about {fds} open files in this process, more than its "
                f"RLIMIT_NOFILE (ulimit -n) of {nofile}: lower the counts or raise the limit")
    if nproc != resource.RLIM_INFINITY and node + tasks_running > nproc:
        return (f"{counts}: {node} worker processes on this node, beside the {tasks_running} processes and "
                f"threads this user runs, exceed RLIMIT_NPROC (ulimit -u) of {nproc}: lower the counts or raise "
                "the limit")
    need = node * MIB_PER_WORKER << 20
    if mem_available is not None and need > mem_available:
        return (f"{counts}: {node} worker processes on this node need at least {need >> 20} MiB "
                f"({MIB_PER_WORKER} MiB each), more than the {mem_available >> 20} MiB available: lower the counts")
    return None


def check_worker_counts(staging, reader, local_size, leader):
    """Raises ``ConfigError`` if this node cannot hold the workers the config asks for.

    Args:
        staging: The ``StagingConfig`` (enabled, prefetchers).
        reader: The ``ReaderConfig`` (workers).
        local_size: Ranks on this node (each starts its own readers).
        leader: Whether this rank starts the node's prefetchers.
    """
    prefetchers = staging.prefetchers if staging.enabled else 0
    counts = f"reader.workers = {reader.workers}"
    if prefetchers:
        counts = f"staging.prefetchers = {prefetchers}, " + counts
    own = reader.workers + (prefetchers if leader else 0)
    node = prefetchers + local_size * reader.workers
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0] if os.geteuid() != 0 else resource.RLIM_INFINITY
    tasks = _user_tasks() if nproc != resource.RLIM_INFINITY else 0
    message = worker_limit_error(counts, own, node, nofile, nproc, tasks, _mem_available())
    if message:
        raise ConfigError(message)


def workers_room():
    """Workers this process can still start within its open-files limit (``RLIMIT_NOFILE``), now."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        return 1 << 30
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        return 1 << 30  # not known: the limits checked at start stand
    return max(0, (nofile - used - FD_HEADROOM) // FDS_PER_WORKER)


def _user_tasks():
    """Processes and threads of this real user: what RLIMIT_NPROC counts."""
    uid, total = str(os.getuid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if fields.get("Uid", "").split()[:1] == [uid]:
            total += int(fields.get("Threads", "1"))
    return total


def _mem_available():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
