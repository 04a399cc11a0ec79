"""Rendered templates submitted to a real single-node Slurm with sbatch."""

import json
import os
import select
import socket
import subprocess
import sys
import time

import pytest

from conftest import make_job_data
from slurm_cluster import SlurmCluster, _tool, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"Slurm tests skipped: {REASON}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = SlurmCluster(str(tmp_path_factory.mktemp("slurm")))
    c.start()
    yield c
    c.stop()


def write_job(tmp_path, template, epochs=1, extra=""):
    venv = os.path.dirname(os.path.dirname(sys.executable))
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv}}
synthetic: {{samples: 64, bytes: 2000}}
plan: {{batch_size: 4, epochs: {epochs}, seed: 2}}
staging: {{prefetchers: 2}}
reader: {{workers: 1}}
run: {{compute_ms: 20{extra}}}
slurm:
  template: {template}
  nodes: 1
  tasks_per_node: 2
  time: "00:05:00"
  output: {tmp_path}/out-%j.log
  venv: {venv}
  local_dir: {tmp_path}/nvme
  command: [{venv}/bin/stager, run, {tmp_path}/job.yaml, --quiet, --report, {tmp_path}/r.json,
            --record, {tmp_path}/rec]
""")
    make_job_data(tmp_path / "job.yaml")
    os.makedirs(tmp_path / "nvme")
    script = tmp_path / "job.sbatch"
    subprocess.run([sys.executable, "-m", "stager", "slurm", "render", "--config", str(tmp_path / "job.yaml"),
                    "-o", str(script)], check=True, timeout=60)
    return str(script)


# The PyPI MPICH's UCX start-up fails now and then under srun (MPI_Init_thread:
# "Message truncated" in MPIDI_UCX_comm_set_vcis; mpi4py's CI meets it too,
# pmodels/mpich#7417). That is outside stager, so such a job is submitted once
# more, saying so; any other failure fails the test.
MPI_START_FAILED = "Fatal error in internal_Init_thread"


def job_log(tmp_path):
    return "".join(p.read_text() for p in sorted(tmp_path.glob("out-*.log")))


def mpi_failed_to_start(tmp_path):
    log = job_log(tmp_path)
    if MPI_START_FAILED not in log:
        return False
    print(f"MPI failed to start in the job (not stager's doing); submitting once more:\n{log[-800:]}")
    for p in tmp_path.glob("out-*.log"):
        p.unlink()
    return True


def left_behind(tmp_path):
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and _mentions(pid, str(tmp_path))]


def _mentions(pid, text):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return text.encode() in fh.read()
    except OSError:
        return False


def wait_gone(pids, timeout):
    for pid in pids:
        try:
            fd = os.pidfd_open(int(pid))
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], timeout)[0], f"process {pid} outlived the job"
        finally:
            os.close(fd)


@pytest.mark.parametrize("template", ["single", "srun"])
def test_sbatch_wait_runs_a_staged_job_with_two_tasks_and_cleans_up(cluster, tmp_path, template):
    script = write_job(tmp_path, template)
    for attempt in (1, 2):
        proc = cluster.run("sbatch", "--wait", "--chdir", str(tmp_path), script, timeout=300, check=False)
        if proc.returncode == 0 or attempt == 2 or not mpi_failed_to_start(tmp_path):
            break
    assert proc.returncode == 0, proc.stdout + proc.stderr + job_log(tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["world_size"] == 2 and report["samples"] == 64 and report["files_staged"] == 64
    assert sorted(os.listdir(tmp_path / "rec")) == ["rank-0.jsonl", "rank-1.jsonl", f"staged-{socket.gethostname()}.jsonl"]
    assert os.listdir(tmp_path / "nvme") == [], "the node-local job directory must be gone"
    wait_gone(left_behind(tmp_path), 15)


def test_scancel_mid_run_leaves_no_directory_and_no_process(cluster, tmp_path):
    script = write_job(tmp_path, "srun", epochs=0)
    rank0 = tmp_path / "rec" / "rank-0.jsonl"
    for attempt in (1, 2):
        job = cluster.run("sbatch", "--parsable", "--chdir", str(tmp_path), script).stdout.strip().split(";")[0]
        deadline = time.monotonic() + 120
        # No event crosses from the job to here: look until minibatches flow or the job ends.
        while (time.monotonic() < deadline and not (rank0.exists() and rank0.stat().st_size > 0)
               and cluster.job_state(job) is not None):
            time.sleep(0.2)
        if rank0.exists() or attempt == 2 or not mpi_failed_to_start(tmp_path):
            break
    assert rank0.exists(), "the job never started reading:\n" + job_log(tmp_path)
    job_dirs = os.listdir(tmp_path / "nvme")
    assert job_dirs == [f"stager-{job}"]
    running = left_behind(tmp_path)
    assert running
    cluster.run("scancel", job)
    while time.monotonic() < deadline and cluster.job_state(job) is not None:
        time.sleep(0.2)
    assert cluster.job_state(job) is None, "the job did not end after scancel"
    wait_gone(running, 30)
    assert not left_behind(tmp_path)
    assert os.listdir(tmp_path / "nvme") == [], "scancel must not leave the staging directory"


def test_two_slurm_jobs_on_one_node_share_a_group_and_the_service_outlives_the_first(cluster, tmp_path):
    """Job a founds the group; b attaches while a runs and runs on after a ends: Slurm's end of a
    must not take the group's service (and b's staging) with it."""
    from helpers.watch import wait_for_lines
    from stager.job.synth import make_dataset

    venv = os.path.dirname(os.path.dirname(sys.executable))
    make_dataset(str(tmp_path / "data"), 200, nbytes=2000, classes=4, seed=3, progress=False)
    os.makedirs(tmp_path / "nvme")
    scripts = {}
    for name, epochs in (("a", 3), ("b", 8)):
        rec = tmp_path / f"rec-{name}"
        (tmp_path / f"{name}.yaml").write_text(f"""
dataset: {{source: {tmp_path / 'data'}, manifest: manifest.tsv}}
plan: {{batch_size: 4, epochs: {epochs}, seed: 2}}
staging: {{prefetchers: 2, share: slurm-{tmp_path.name}, local_dir: {tmp_path / 'nvme'}}}
reader: {{workers: 1}}
run: {{compute_ms: 25}}
slurm:
  template: single
  job_name: {name}
  nodes: 1
  tasks_per_node: 1
  time: "00:05:00"
  output: {tmp_path}/out-{name}-%j.log
  venv: {venv}
  command: [{venv}/bin/stager, run, {tmp_path}/{name}.yaml, --quiet, --report, {rec}/r.json, --record, {rec}]
""")
        os.makedirs(rec)
        scripts[name] = str(tmp_path / f"{name}.sbatch")
        subprocess.run([sys.executable, "-m", "stager", "slurm", "render", "--config", str(tmp_path / f"{name}.yaml"),
                        "-o", scripts[name]], check=True, timeout=60)
    first = subprocess.Popen([_tool("sbatch"), "--wait", "--chdir", str(tmp_path), scripts["a"]],
                             env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_lines(str(tmp_path / "rec-a" / "rank-0.jsonl"), 1, pid=first.pid, timeout=120), job_log(tmp_path)
        second = cluster.run("sbatch", "--wait", "--chdir", str(tmp_path), scripts["b"], timeout=300, check=False)
    finally:
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err + job_log(tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr + job_log(tmp_path)
    reports = {n: json.loads((tmp_path / f"rec-{n}" / "r.json").read_text()) for n in "ab"}
    assert reports["b"]["samples"] == 8 * 200 and reports["a"]["samples"] == 3 * 200
    assert reports["b"]["group"]["files_from_group"] > 0, "b attached while a ran"
    assert reports["a"]["wall_s"] < reports["b"]["wall_s"]
    assert reports["a"]["group"]["files_fetched"] + reports["b"]["group"]["files_fetched"] == 200, \
        "each file read from the source once for both Slurm jobs"
    assert os.listdir(tmp_path / "nvme") == [], "the group's directory must be gone with its last job"
    wait_gone(left_behind(tmp_path), 30)
