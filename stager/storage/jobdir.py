"""The per-job staging directory on node-local storage.

One directory per job (``stager-<job id>``), created 0700 so that two jobs,
or two users, never share or read each other's staged files, and removed at
the end unless the user asks to keep it.
"""

import fcntl
import os
import shutil
import socket
import stat
import uuid

from .basedir import check_base, not_writable
from .janitor import Janitor
from .leftovers import LOCK, is_marked, sweep_at_start, write_owner
from ..errors import ConfigError

LOCAL_DIR_ENV = "STAGER_LOCAL_DIR"


def local_base(configured, with_env=True):
    """Node-local base directory.

    ``$STAGER_LOCAL_DIR`` first: the sbatch templates set it to the job's
    directory, which they derive from this same order and create on every
    node. Then the config's setting, ``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp``.
    """
    return named_local_base(configured, with_env)[0]


def named_local_base(configured, with_env=True):
    """``(local_base(...), where it came from)``, the second for messages: ``staging.local_dir``, ``$TMPDIR``..."""
    candidates = ((f"${LOCAL_DIR_ENV}", os.environ.get(LOCAL_DIR_ENV) if with_env else None),
                  ("staging.local_dir", configured), ("$SLURM_TMPDIR", os.environ.get("SLURM_TMPDIR")),
                  ("$TMPDIR", os.environ.get("TMPDIR")))
    for name, candidate in candidates:
        if candidate:
            return candidate, name
    return "/tmp", "the default local directory"


def job_id(configured):
    """This job's id: the config's; under Slurm ``$SLURM_JOB_ID``, with ``.$SLURM_STEP_ID``
    inside a job step (steps of one allocation may run at once); else host, pid
    and a random suffix."""
    if configured:
        return configured
    if os.environ.get("SLURM_JOB_ID"):
        step = os.environ.get("SLURM_STEP_ID")
        return os.environ["SLURM_JOB_ID"] + (f".{step}" if step else "")
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def agreed_job_id(staging, world):
    """The job id, the same on every rank: rank 0's when it had to be generated."""
    ident = job_id(staging.job_id)
    if world.comm is not None and not (staging.job_id or os.environ.get("SLURM_JOB_ID")):
        ident = world.comm.bcast(ident, root=0)
    return ident


class JobDir:
    """Creates and removes ``<base>/stager-<job id>``.

    The name is ``stager-<job id>``; with several emulated nodes on one
    machine (``STAGER_NODE_ID``) it ends in ``-<node>``, and ranks that cannot
    share a node's staging service (no MPI) each get ``-rank<r>``.

    Args:
        staging: A ``StagingConfig`` (local_dir, keep).
        source: Dataset root; the job directory must not lie inside it, since
            nothing on the shared file system is ever written.
        ident: The job id (see ``agreed_job_id``).
        world: The ``World``.
    """

    def __init__(self, staging, source, ident, world):
        base, self._base_name = named_local_base(staging.local_dir)
        base = self.base = os.path.abspath(base)
        name = f"stager-{ident}"
        if world.emulated_node:
            name += f"-{world.node}"
        if world.node_comm is None and world.size > 1:
            name += f"-rank{world.rank}"
        self.path = os.path.join(base, name)
        self.keep = staging.keep
        src = os.path.realpath(source)
        real_base = os.path.realpath(base)
        if os.path.commonpath([real_base, src]) == src:
            raise ConfigError(f"staging.local_dir {base} lies inside the dataset source {src}; "
                              "stager never writes to the shared file system")
        self._created = False
        self._janitor = None
        self._lock = None

    def create(self):
        """Makes the directory 0700; reuses one this user already owns (a kept job).

        First the base is checked (``basedir.check_base``) and the
        directories of this user's dead jobs under it are removed
        (``leftovers``). A directory that exists already is reused only if
        stager made it (its ``.lock`` holds an owner record) or it is empty: files
        stager did not write are never deleted, so the job is refused.
        Unless ``keep`` is set, a janitor process removes the directory
        should this process die before ``remove()``. Once made, it is
        returned again as it is (the probe of ``auto`` counts makes it first).
        """
        if self._created:
            return self.path
        check_base(self.base, self._base_name)
        sweep_at_start(self.base)
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            st = os.lstat(self.path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                raise ConfigError(f"staging directory {self.path} exists and is not a directory "
                                  "owned by this user") from None
            foreign = sorted(set(os.listdir(self.path)) - {LOCK})
            if foreign and not is_marked(self.path):
                shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
                raise ConfigError(f"staging directory {self.path} exists and holds files stager did not write "
                                  f"({shown}); stager never deletes them: move them away, or give this job "
                                  "another staging.job_id") from None
        except OSError as exc:
            raise not_writable(exc, self.base, self._base_name) or exc from None
        os.chmod(self.path, 0o700)
        # One user of the directory at a time: a second job step with the
        # same id would otherwise delete the first one's files at its end.
        self._lock = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            self._lock = None
            raise ConfigError(f"staging directory {self.path} is in use by another job or job step; give this "
                              "one its own staging.job_id") from None
        write_owner(self._lock, self.keep)  # after the lock: a sweep never takes a directory being made
        self._created = True
        if not self.keep:
            self._janitor = Janitor(self.path)
        return self.path

    def keep_open(self):
        """File descriptors that processes writing into the directory should inherit (the janitor's pipe)."""
        fd = self._janitor.fileno() if self._janitor is not None else None
        return set() if fd is None else {fd}

    def remove(self, stuck=()):
        """Deletes the directory unless ``keep`` is set; safe to call twice.

        Args:
            stuck: Pids of workers left stuck in the kernel (see
                ``WorkerPool.stop``). One may still write into the directory
                once it wakes, so the janitor is not told all is done: it
                waits for them (they hold its pipe) and removes the
                directory again.
        """
        if self._created and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
        self._created = False
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self._janitor is not None:
            if stuck:
                self._janitor.hand_over()
            else:
                self._janitor.release()
            self._janitor = None
