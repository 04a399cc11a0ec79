"""A source that stops answering (a hung file system, emulated by the FUSE
emulator at 600 s per open): the job fails in bounded time naming the file
and the prefetcher, SIGTERM ends a run whose prefetchers are stuck in the
kernel, and nothing is left once the mount is cleared."""

import os
import re
import signal
import subprocess
import time

import pytest
from conftest import make_config, stager_cmd, stager_workers
from stall_tools import exited_within, in_fuse_request, state, wait_until

from stager.engine import Pipeline
from stager.errors import StageError
from stager.slowfs import SlowFS, mount, mount_entry, umount

HUNG_MS = 600_000  # an open that takes ten minutes is, for a test, one that never returns


def hung_config(dataset, mnt, tmp_path, start_method="fork", in_flight=None, **staging):
    root, manifest = dataset
    # The manifest is read from the real tree: reading it through the hung mount would hang the catalog.
    return make_config(mnt, tmp_path / "local", dataset={"manifest": os.path.join(root, "manifest.tsv"),
                                                         "requests_in_flight": in_flight},
                       staging={"prefetchers": 2, **staging},
                       processes={"shutdown_timeout_s": 2.0, "start_method": start_method})


@pytest.mark.parametrize("start_method,in_flight", [("fork", None), ("spawn", None), ("fork", 4)])
def test_a_stalled_source_fails_the_job_naming_the_file_the_prefetcher_and_the_wait(dataset, tmp_path, start_method,
                                                                                    in_flight):
    # With files in flight, every fetch thread of a prefetcher has its own row on the stall board.
    root, _ = dataset
    with SlowFS(root, open_ms=HUNG_MS) as mnt:
        cfg = hung_config(dataset, mnt, tmp_path, start_method, in_flight, stall_timeout_s=2)
        pipe = Pipeline(cfg)
        begin = time.monotonic()
        with pytest.raises(StageError) as info:
            with pipe:
                next(iter(pipe))
        elapsed = time.monotonic() - begin
        assert not stager_workers() and not os.path.exists(pipe.local_dir)
    err = info.value
    assert err.stage == "prefetch" and err.cause == "Stalled" and err.path
    assert re.search(r"stager-prefetch-[01] \(pid \d+\) has waited [2-9] s for " + re.escape(mnt) + "/"
                     + re.escape(err.path) + r" \(minibatch 0 of epoch 0\), more than staging.stall_timeout_s = 2",
                     str(err)), str(err)
    # Noticed within a second of the limit; the shutdown then ends the
    # stalled prefetchers (the emulator lets a signalled open go) within
    # processes.shutdown_timeout_s and a few seconds of terminate and kill.
    assert elapsed < 2 + 1 + 2 + 6 + 5, elapsed


def test_no_stall_timeout_while_the_source_answers(slow_source, tmp_path):
    # A limit far below a run's length: only a wait for one file counts, not the run.
    cfg = make_config(slow_source, tmp_path / "local", staging={"stall_timeout_s": 0.2},
                      plan={"epochs": 3})
    with Pipeline(cfg) as pipe:
        assert sum(len(b.samples) for b in pipe) == 300


def test_sigterm_ends_a_run_stuck_in_the_kernel_and_the_janitor_clears_up_after_the_mount(dataset, tmp_path):
    # A hung server: the prefetchers' opens ignore signals, so a prefetcher
    # survives SIGKILL (state D) until the mount is cleared by force.
    root, manifest = dataset
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    daemon = mount(root, str(mnt), open_ms=HUNG_MS, ignore_interrupts=True)
    proc = None
    try:
        job = tmp_path / "job.yaml"
        job.write_text(f"""
dataset:
  source: {mnt}
  manifest: {os.path.join(root, 'manifest.tsv')}
plan:
  batch_size: 8
staging:
  local_dir: {tmp_path / 'local'}
  prefetchers: 2
  stall_timeout_s: 0
reader:
  workers: 2
processes:
  shutdown_timeout_s: 1
""")
        # Into files: the stuck prefetchers keep their copies of stdout and
        # stderr, so pipes would not reach end-of-file while they live.
        log = tmp_path / "stderr.txt"
        with open(log, "w") as err_file:
            proc = subprocess.Popen(stager_cmd("run", str(job), "--quiet"), stdout=subprocess.DEVNULL,
                                    stderr=err_file)
        wait_until(lambda: len(stager_workers("stager-prefetch", proc.pid)) == 2, 60, "the prefetchers")
        prefetchers = stager_workers("stager-prefetch", proc.pid)
        wait_until(lambda: all(in_fuse_request(p) for p in prefetchers), 60, "both prefetchers to block")
        (job_dir,) = os.listdir(tmp_path / "local")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=60)  # returns: shutdown never waits for the stuck prefetchers
        waited = time.monotonic() - sent
        err = log.read_text()
        assert proc.returncode == 128 + signal.SIGTERM, err
        # shutdown_timeout_s (1), then terminate (1) and kill (5) for all the late prefetchers at once, and the rest.
        assert waited < 1 + 6 + 10, waited
        for pid in prefetchers:
            assert state(pid) == "D"
            assert f"stager-prefetch-{prefetchers.index(pid)} (pid {pid}) survives SIGKILL" in err, err
        assert "Traceback" not in err
        assert os.listdir(tmp_path / "local") == [], "the staging directory is removed at exit all the same"
        janitors = _janitors(tmp_path)
        assert len(janitors) == 1, "the janitor must wait for the stuck prefetchers (they hold its pipe)"
        umount(str(mnt), mode="force")
        for pid in prefetchers:
            assert exited_within(pid, 10), f"prefetcher {pid} outlived the hung mount"
        assert exited_within(janitors[0], 30), "the janitor must exit once the prefetchers are gone"
        assert os.listdir(tmp_path / "local") == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if mount_entry(str(mnt)) is not None:
            umount(str(mnt), mode="force")
        daemon.wait(30)


def _janitors(tmp_path):
    """Janitor processes watching a directory under ``tmp_path``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"shutil.rmtree" in cmdline and str(tmp_path / "local").encode() in cmdline:
            out.append(int(pid))
    return out


def test_a_negative_stall_timeout_is_refused_naming_the_key(tmp_path):
    from stager.errors import ConfigError

    with pytest.raises(ConfigError, match=r"staging.stall_timeout_s must be 0 \(wait without end\) or more"):
        make_config(str(tmp_path), tmp_path / "local", staging={"stall_timeout_s": -1})
