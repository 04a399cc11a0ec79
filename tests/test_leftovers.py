"""Staging directories of jobs that died with their janitor: swept at the next start and by ``stager clean``,
never a live or kept job's."""

import os
import signal
import subprocess
import tempfile

from conftest import child_pids, make_job_data, stager_cmd
from helpers.watch import wait_for_lines
from test_cli import own_tmp, wait_gone


def write_job(tmp_path, name="job.yaml", **staging):
    extra = "".join(f", {k}: {v}" for k, v in staging.items())
    path = tmp_path / name
    path.write_text(f"""
dataset: {{source: data, manifest: manifest.tsv}}
synthetic: {{samples: 40, bytes: 3000}}
plan: {{batch_size: 4, epochs: 0, seed: 1}}
staging: {{local_dir: local, prefetchers: 2, lookahead: 2{extra}}}
reader: {{workers: 1}}
run: {{compute_ms: 20}}
""")
    return make_job_data(path)


def start_run(job, tmp_path, *args):
    """Starts ``stager run JOB`` in a process group of its own and returns it once minibatches flow."""
    records = tempfile.mkdtemp(prefix="records-", dir=tmp_path)
    proc = subprocess.Popen(stager_cmd("run", job, "--record", records, *args), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=own_tmp(tmp_path), start_new_session=True)
    if wait_for_lines(os.path.join(records, "rank-0.jsonl"), 1, proc.pid):
        return proc
    proc.wait()
    raise AssertionError(f"stager run ended early with {proc.returncode}: {proc.stderr.read()}")


def job_dirs(tmp_path):
    local = tmp_path / "local"
    return sorted(p for p in os.listdir(local) if p.startswith("stager-")) if local.exists() else []


def kill_with_its_janitor(job, tmp_path):
    """Runs a job and SIGKILLs it, its workers and its janitor at once, as a node's out-of-memory killer or a
    reboot would; returns the directory it leaves."""
    before = set(job_dirs(tmp_path))
    proc = start_run(job, tmp_path)
    (left,) = set(job_dirs(tmp_path)) - before
    children = child_pids(proc.pid)
    janitors = [p for p in children if b"rmtree" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(janitors) == 1
    os.kill(janitors[0], signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)  # the job's whole process group: rank, prefetchers, readers
    proc.wait()
    proc.stderr.close()
    wait_gone(children, 15)
    assert left in job_dirs(tmp_path) and os.listdir(tmp_path / "local" / left), "nobody removed it"
    return left


def test_the_next_run_removes_a_dead_jobs_directory_and_says_so(tmp_path):
    job = write_job(tmp_path)
    left = kill_with_its_janitor(job, tmp_path)
    proc = subprocess.run(stager_cmd("run", job, "--quiet", "--set", "run.max_batches=3"), capture_output=True,
                          text=True, timeout=120, env=own_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"removed {tmp_path / 'local' / left}, the staging directory of a job that is gone" in proc.stderr
    assert "no longer runs, nobody holds its lock" in proc.stderr
    assert job_dirs(tmp_path) == []


def test_stager_clean_removes_dead_jobs_directories_and_leaves_live_and_kept_ones(tmp_path):
    job = write_job(tmp_path)
    kept = subprocess.run(stager_cmd("run", write_job(tmp_path, "kept.yaml", keep="true", job_id="kept"), "--quiet",
                                     "--set", "run.max_batches=2"), capture_output=True, text=True, timeout=120,
                          env=own_tmp(tmp_path))
    assert kept.returncode == 0, kept.stderr
    live = start_run(job, tmp_path)
    try:
        (live_dir,) = set(job_dirs(tmp_path)) - {"stager-kept"}
        left = kill_with_its_janitor(job, tmp_path)
        dry = subprocess.run(stager_cmd("clean", str(tmp_path / "local"), "--dry-run"), capture_output=True,
                             text=True, timeout=60)
        assert dry.returncode == 0 and f"would remove {tmp_path / 'local' / left}: its job is gone" in dry.stdout
        assert left in job_dirs(tmp_path)
        proc = subprocess.run(stager_cmd("clean", str(tmp_path / "local")), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"removed {tmp_path / 'local' / left}: its job is gone" in proc.stdout
        assert f"left {tmp_path / 'local' / live_dir}: in use by pid {live.pid}" in proc.stdout
        assert f"left {tmp_path / 'local' / 'stager-kept'}: kept (staging.keep)" in proc.stdout
        assert "1 staging directory removed" in proc.stdout
        assert job_dirs(tmp_path) == sorted([live_dir, "stager-kept"])
        assert live.poll() is None, "the live job runs on"
    finally:
        live.send_signal(signal.SIGTERM)
        code = live.wait(timeout=60)
        live.stderr.close()
    assert code == 128 + signal.SIGTERM
    assert job_dirs(tmp_path) == ["stager-kept"]
