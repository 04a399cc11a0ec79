"""Shared fixtures: a small synthetic dataset, the real FUSE slow file system,
and a guard that every test leaves no child process behind."""

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from stager.catalog import load_catalog as load_catalog_of
from stager.config import config_from_dict
from stager.slowfs import SlowFS
from stager.job.synth import make_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_pids(pid=None):
    """Direct children of a process, from /proc (all of its threads)."""
    pid = pid or os.getpid()
    out = set()
    task_dir = f"/proc/{pid}/task"
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/children") as fh:
                out.update(int(p) for p in fh.read().split())
        except FileNotFoundError:
            pass
    return out


def live_children(pids):
    """The processes among ``pids`` that still run, reaping zombies.

    Python's multiprocessing resource tracker (started by the spawn method) is
    left out: it is the runtime's own helper and lives as long as this process.
    """
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except FileNotFoundError:
            continue
        if state == "Z":
            os.waitpid(pid, os.WNOHANG)
        elif b"multiprocessing.resource_tracker" not in cmdline:
            alive.add(pid)
    return alive


def stager_workers(prefix="stager-", pid=None):
    """Live child processes of ``pid`` (default: this one) named ``prefix...``.

    stager's workers name themselves (``stager-prefetch-<i>``, ``stager-read-<i>``),
    so /proc tells them from other children (the janitor, an emulator daemon).
    """
    out = []
    for child in live_children(child_pids(pid)):
        try:
            with open(f"/proc/{child}/comm") as fh:
                name = fh.read().strip()
        except FileNotFoundError:
            continue
        if name.startswith(prefix):
            out.append(child)
    return sorted(out)


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Fails a test that leaves a child process of the test process alive."""
    before = child_pids()
    yield
    alive = live_children(child_pids() - before)
    assert not alive, f"test left child processes alive: {sorted(alive)}"


@pytest.fixture(autouse=True)
def no_leftover_mpich_segments():
    """Removes the shared-memory segments that MPI jobs started by a test left.

    MPICH unlinks its ``/dev/shm/mpich_shm_*`` segment when its ranks
    finalize; a job ended by ``MPI_Abort`` or ``scancel`` never does. The test
    that started such a job owns what it leaves.
    """
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    yield
    for path in set(glob.glob("/dev/shm/mpich_shm_*")) - before:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@pytest.fixture(scope="session")
def session_dir():
    path = tempfile.mkdtemp(prefix="stager-tests-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def dataset(session_dir):
    """A labelled dataset of 100 small ``.npy`` samples (root, manifest)."""
    root = os.path.join(session_dir, "data")
    manifest = make_dataset(root, 100, nbytes=4096, classes=5, seed=1, progress=False)
    return root, manifest


@pytest.fixture(scope="session")
def slow_source(dataset, session_dir):
    """The dataset mounted through the FUSE emulator (1 ms per open)."""
    root, _ = dataset
    mnt = os.path.join(session_dir, "mnt")
    os.mkdir(mnt)
    with SlowFS(root, mnt, open_ms=1.0, mbps=0) as mounted:
        yield mounted


@contextlib.contextmanager
def size_limited_tmpfs(mnt, size):
    """Mounts a tmpfs of ``size`` (e.g. ``64k``) on the new directory ``mnt`` for a block: a small local disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def make_job_data(job):
    """Writes the synthetic dataset a job file describes, as ``stager make-dataset --config JOB`` does.

    ``stager run`` never writes its source: a test that runs a job makes its data first, as a user would.
    """
    from stager.config import load_config
    from stager.job import write_synthetic

    write_synthetic(load_config(str(job)), progress=False)
    return str(job)


def make_config(source, local_dir, **sections):
    """A Config reading ``source`` (with its manifest) and staging under ``local_dir``."""
    data = {
        "dataset": {"source": source, "manifest": "manifest.tsv", "loader": "npy"},
        "plan": {"batch_size": 8, "epochs": 1, "seed": 3},
        "staging": {"local_dir": str(local_dir), "prefetchers": 2, "lookahead": 4},
        "reader": {"workers": 2},
        "processes": {"shutdown_timeout_s": 10.0},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def load_catalog(cfg):
    return load_catalog_of(cfg.dataset)


def stager_cmd(*args):
    """Command line that runs the stager CLI with this interpreter."""
    return [sys.executable, "-m", "stager", *args]


@pytest.fixture
def cfg(slow_source, tmp_path):
    """A config staging the emulated source with 2 readers (test files may define their own)."""
    return make_config(slow_source, tmp_path / "local", reader={"workers": 2})


@pytest.fixture
def examples(cfg):
    """The same dataset in memory, as MultiprocessIterator would read it."""
    catalog = load_catalog(cfg)
    return [(np.load(os.path.join(catalog.root, catalog.path(i))), catalog.label(i)) for i in range(len(catalog))]


def same_batch(a, b):
    return len(a) == len(b) and all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
