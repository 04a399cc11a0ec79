"""Processes killed with SIGKILL in the middle of a run.

A killed main process (no unwinding): its orphaned workers exit by
themselves, quietly, and the janitor and the emulator clean up after it. A
killed prefetcher ends the job with a clear error; it is not restarted
(docs/reliability.md, "Stalls and shutdown", says why).
"""

import os
import re
import signal
import subprocess
import time

import pytest
from conftest import REPO, make_config, make_job_data, stager_cmd, stager_workers
from stall_tools import exited_within, in_fuse_request, wait_until

from stager.engine import Pipeline
from stager.errors import StageError


def test_a_prefetcher_killed_mid_copy_ends_the_job_at_once_with_its_name(dataset, tmp_path):
    from stager.slowfs import SlowFS

    root, _ = dataset
    with SlowFS(root, open_ms=300) as mnt:  # slow opens: the lookahead keeps prefetchers in them for seconds
        cfg = make_config(mnt, tmp_path / "local", plan={"epochs": 0},
                          dataset={"manifest": os.path.join(root, "manifest.tsv")})
        pipe = Pipeline(cfg)
        with pytest.raises(StageError) as info:
            with pipe:
                it = iter(pipe)
                next(it)
                victim = stager_workers("stager-prefetch")[0]
                wait_until(lambda: in_fuse_request(victim), 30, "the prefetcher to be in an open")
                os.kill(victim, signal.SIGKILL)
                killed = time.monotonic()
                for _ in it:  # ends with the error, not a hang
                    pass
        ended = time.monotonic() - killed
        assert not stager_workers() and not os.path.exists(pipe.local_dir)
    assert info.value.stage == "prefetch" and info.value.cause == "WorkerDied"
    assert re.search(rf"stager-prefetch-\d \(pid {victim}\) died \(exit code -9\)", str(info.value)), str(info.value)
    assert ended < 10, ended


def test_workers_orphaned_by_a_killed_run_exit_quietly_and_leave_nothing(tmp_path):
    job = tmp_path / "job.yaml"
    # Slow opens and a deep lookahead keep the prefetchers busy when the
    # main process dies; the readers' loader decodes only once it is dead,
    # so both kinds of worker reply to a parent that is gone.
    job.write_text("""
dataset:
  source: data
  manifest: manifest.tsv
  loader: orphans:npy_once_orphaned
synthetic:
  samples: 100
  bytes: 4096
slowfs:
  enabled: true
  open_ms: 200
plan:
  batch_size: 8
  epochs: 0
staging:
  local_dir: local
  prefetchers: 2
  lookahead: 16
reader:
  workers: 2
""")
    make_job_data(job)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path), STAGER_TEST_MARKS=str(marks),
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "helpers"), os.environ.get("PYTHONPATH", REPO)]))
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err_file:
        # stderr into a file: the orphans keep their copies of it after the main process dies.
        proc = subprocess.Popen(stager_cmd("run", str(job), "--quiet"), stdout=subprocess.DEVNULL, stderr=err_file,
                                env=env)
    try:
        wait_until(lambda: os.listdir(marks) or proc.poll() is not None, 120, "a reader to start decoding")
        assert proc.poll() is None, log.read_text()
        workers = stager_workers(pid=proc.pid)
        assert len(workers) == 4, workers  # 2 prefetchers, 2 readers
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in workers:
        assert exited_within(pid, 10), f"worker {pid} outlived its killed parent by more than 10 s"
    wait_until(lambda: os.listdir(tmp_path / "local") == [], 30, "the janitor to remove the job directory")
    err = log.read_text()
    assert "Traceback" not in err and "Error" not in err, err
    wait_until(lambda: not _mounts_under(tmp_path), 30, "the emulator to unmount itself")


def _mounts_under(path):
    with open("/proc/self/mounts") as fh:
        return [line for line in fh if str(path) in line]
