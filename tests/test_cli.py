"""The ``stager`` command, run as a user would, in its own process."""

import json
import os
import re
import signal
import socket
import subprocess

import pytest

from conftest import child_pids, make_job_data, stager_cmd
from helpers.terminal import Terminal
from helpers.watch import still_running
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig


def slowfs_mounts(root):
    """Emulator mounts under ``root`` (a test's own directory)."""
    with open("/proc/self/mounts") as fh:
        return [line for line in fh if line.startswith("stager-slowfs") and line.split()[1].startswith(str(root))]


def own_tmp(tmp_path):
    """Environment that puts a command's temporary directories (the emulator's
    mount point among them) under the test's own directory."""
    return dict(os.environ, TMPDIR=str(tmp_path))


def write_config(tmp_path, **extra):
    text = f"""
dataset:
  source: data
  manifest: manifest.tsv
synthetic:
  samples: 60
  bytes: 3000
slowfs:
  enabled: true
  open_ms: 1
plan:
  batch_size: 8
  epochs: {extra.get('epochs', 2)}
  seed: 11
staging:
  local_dir: local
  prefetchers: 3
  lookahead: 4
reader:
  workers: 2
"""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return make_job_data(path)


def wait_gone(pids, timeout):
    late = still_running(pids, timeout)
    assert not late, f"processes {late} still run"


def test_run_writes_report_and_records_that_match_the_plan(tmp_path):
    cfg = write_config(tmp_path)
    proc = subprocess.run(stager_cmd("run", cfg, "--report", str(tmp_path / "r.json"),
                                     "--record", str(tmp_path / "rec"), "--set", "run.compute_ms=1"),
                          capture_output=True, text=True, timeout=120, env=own_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "staged: 16 minibatches, 120 samples" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    assert report["epochs"] == 2 and report["batches"] == 16 and report["samples"] == 120
    assert report["files_staged"] == 60 and report["bytes_staged"] == catalog.total_bytes
    assert 0 <= report["stall_s"] <= report["wall_s"]
    assert report["config"]["run"]["compute_ms"] == 1.0

    reads = [json.loads(line) for line in (tmp_path / "rec" / "rank-0.jsonl").read_text().splitlines()]
    expected = [(m.epoch, m.step, [catalog.path(i) for i in m.indices])
                for m in plan.iterate(60, PlanConfig(batch_size=8, epochs=2, seed=11))]
    assert [(r["epoch"], r["step"], r["samples"]) for r in reads] == expected

    staged_file = tmp_path / "rec" / f"staged-{socket.gethostname()}.jsonl"
    staged = [json.loads(line) for line in staged_file.read_text().splitlines()]
    assert sorted(s["path"] for s in staged) == sorted(catalog.paths())
    sizes = dict(zip(catalog.paths(), catalog.sizes.tolist()))
    assert all(s["bytes"] == sizes[s["path"]] and s["epoch"] == 0 for s in staged)

    assert not slowfs_mounts(tmp_path)
    assert os.listdir(tmp_path / "local") == []


def test_run_rejects_an_unknown_key_by_name(tmp_path):
    cfg = write_config(tmp_path)
    proc = subprocess.run(stager_cmd("run", cfg, "--set", "staging.prefetcher=2"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "'staging.prefetcher'" in proc.stderr and "prefetchers = 'auto'" in proc.stderr


def sigterm_while_running(args, tmp_path, inspect=lambda proc: None):
    """Starts ``stager ARGS`` on a terminal, waits until minibatches flow (the
    progress line's figures), calls ``inspect(proc)``, sends SIGTERM and expects a clean exit."""
    term = Terminal()
    proc = subprocess.Popen(stager_cmd(*args), stderr=term.slave, stdout=subprocess.PIPE, text=True,
                            env=own_tmp(tmp_path))
    term.started()
    try:
        assert term.wait_for("samples/s"), term.text()
        found = inspect(proc)
        proc.send_signal(signal.SIGTERM)  # what Slurm sends before the time limit or on preemption
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        return found
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        term.close()
        proc.stdout.close()


def test_sigterm_mid_run_stops_workers_unmounts_and_cleans_up(tmp_path):
    cfg = write_config(tmp_path, epochs=0)

    def inspect(proc):
        workers = child_pids(proc.pid)
        assert len(workers) >= 5  # 3 prefetchers + 2 readers (+ the FUSE daemon)
        local = os.listdir(tmp_path / "local")
        assert len(local) == 1 and local[0].startswith("stager-")
        return workers

    workers = sigterm_while_running(["run", cfg, "--set", "run.compute_ms=5"], tmp_path, inspect)
    wait_gone(workers, 10)
    assert not slowfs_mounts(tmp_path)
    assert os.listdir(tmp_path / "local") == []


def test_make_dataset_writes_jpegs_of_the_sizes_asked_in_turn_and_names_a_wrong_one(tmp_path):
    from PIL import Image

    data = tmp_path / "data"
    proc = subprocess.run(stager_cmd("make-dataset", str(data), "--samples", "5", "--format", "jpeg",
                                     "--image-size", "64x48,40x72", "--bytes", "3000", "--quiet"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    catalog = Catalog.from_manifest(str(data), "manifest.tsv")
    sizes = [Image.open(data / catalog.path(i)).size for i in range(len(catalog))]
    assert sizes == [(64, 48), (40, 72), (64, 48), (40, 72), (64, 48)]
    proc = subprocess.run(stager_cmd("make-dataset", str(tmp_path / "bad"), "--samples", "2", "--format", "jpeg",
                                     "--image-size", "64x48,40by72"), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "'40by72' is not WIDTHxHEIGHT" in proc.stderr
    assert not (tmp_path / "bad").exists()


def test_make_dataset_and_slowfs_mount_umount(tmp_path):
    data, mnt = tmp_path / "data", tmp_path / "mnt"
    proc = subprocess.run(stager_cmd("make-dataset", str(data), "--samples", "5", "--bytes", "2000", "--quiet"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    catalog = Catalog.from_manifest(str(data), "manifest.tsv")
    assert len(catalog) == 5 and set(catalog.sizes.tolist()) == {128 + 2 * 768}
    mnt.mkdir()
    proc = subprocess.run(stager_cmd("slowfs", "mount", str(data), str(mnt), "--open-ms", "1", "--mbps", "100"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    try:
        entry = slowfs_mounts(mnt)
        assert len(entry) == 1
        daemon = int(entry[0].split()[0].split(":")[1])
        first = catalog.path(0)
        assert (mnt / first).read_bytes() == (data / first).read_bytes()
        with pytest.raises(OSError):
            (mnt / "new").write_text("no")
        assert not (data / "new").exists()
    finally:
        proc = subprocess.run(stager_cmd("slowfs", "umount", str(mnt)), capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 0, proc.stderr
    wait_gone([daemon], 10)
    assert not slowfs_mounts(mnt)
    proc = subprocess.run(stager_cmd("slowfs", "umount", str(mnt)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "is not a stager slowfs mount" in proc.stderr


@pytest.mark.parametrize("args", [[], ["run"], ["demo"], ["make-dataset"], ["slowfs"], ["slowfs", "mount"],
                                  ["slowfs", "umount"], ["config"]])
def test_every_command_has_help(args):
    proc = subprocess.run(stager_cmd(*args, "--help"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: stager" in proc.stdout


def test_config_prints_every_key(tmp_path):
    proc = subprocess.run(stager_cmd("config", "--set", "plan.epochs=3"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    assert "epochs: 3" in proc.stdout and "prefetchers: auto" in proc.stdout


def test_demo_runs_both_methods_and_cleans_up(tmp_path):
    proc = subprocess.run(stager_cmd("demo", "--samples", "96", "--quiet"), capture_output=True, text=True,
                          timeout=300, env=own_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"stager \(\d+ x \d+ in flight \+ 2 readers\)", proc.stdout), proc.stdout
    assert "direct (2 readers on the slow file system)" in proc.stdout
    assert "faster than direct reading (96 files" in proc.stdout
    assert os.listdir(tmp_path) == [], "the demo must remove everything it made"
    assert not slowfs_mounts(tmp_path)


def test_a_stopped_run_with_a_state_file_resumes_exactly(tmp_path):
    cfg = write_config(tmp_path, epochs=2)
    state = tmp_path / "state.json"
    common = ["--set", f"run.state_file={state}", "--set", "run.compute_ms=20"]
    sigterm_while_running(["run", cfg, "--record", str(tmp_path / "rec1"), *common], tmp_path)
    saved = json.loads(state.read_text())
    assert saved["epoch"] in (0, 1) and saved["samples"] == 60
    proc = subprocess.run(stager_cmd("run", cfg, "--record", str(tmp_path / "rec2"), *common),
                          capture_output=True, text=True, timeout=120, env=own_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "resuming from epoch" in proc.stderr and not state.exists()
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    lines = [json.loads(x) for rec in ("rec1", "rec2") for x in (tmp_path / rec / "rank-0.jsonl").read_text().splitlines()]
    expected = [(m.epoch, m.step, [catalog.path(i) for i in m.indices])
                for m in plan.iterate(60, PlanConfig(batch_size=8, epochs=2, seed=11))]
    assert [(x["epoch"], x["step"], x["samples"]) for x in lines] == expected
    assert 0 < len((tmp_path / "rec1" / "rank-0.jsonl").read_text().splitlines()) < len(expected)
