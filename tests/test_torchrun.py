"""Jobs launched by the venv's torchrun, as PyTorch users start them: one
staging service per node with collectives over torch.distributed (gloo),
two torchrun agents on one machine as two nodes, a failing rank, and the
PyTorch example with DDP, plain and restarted by the elastic agent."""

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter

import pytest

from conftest import REPO
from helpers.stacks import free_port
from test_examples import jpeg_folder, torch_example
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig
from test_mpi_run import MPIEXEC, SAMPLES, assert_nothing_left, mpirun, read_records, write_job

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")

pytestmark = pytest.mark.skipif(not os.path.exists(TORCHRUN), reason=f"no torchrun at {TORCHRUN} (install torch)")


def torch_env(tmp_path):
    """This checkout and the failing loaders importable by every worker; temporary files under ``tmp_path``."""
    path = os.pathsep.join([REPO, os.path.join(REPO, "tests", "helpers")])
    return dict(os.environ, PYTHONPATH=path, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")


def agents(tmp_path, command, nodes=1, nproc=2, timeout=300, extra=(), env=None):
    """Runs ``nodes`` torchrun agents of ``nproc`` workers each on this machine, rendezvous on 127.0.0.1.

    Returns:
        One ``(returncode, output)`` per agent, output being stdout and stderr.
    """
    if nodes == 1:
        launch = [["--standalone"]]
    else:
        port = free_port()
        launch = [[f"--nnodes={nodes}", f"--node_rank={n}", "--master_addr=127.0.0.1", f"--master_port={port}"]
                  for n in range(nodes)]
    procs = [subprocess.Popen([TORCHRUN, *args, f"--nproc_per_node={nproc}", *extra, *command],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                              env=dict(torch_env(tmp_path), **(env or {})), start_new_session=True)
             for args in launch]
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out))
    finally:
        for proc in procs:  # a test that timed out still ends what it started
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return results


def stager_run(job, *args):
    return ["-m", "stager", "run", job, "--quiet", *args]


def assert_follows_plan(reads, tmp_path, size):
    """Every rank read its share of the plan, and each epoch every sample once."""
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    assert sorted(reads) == list(range(size))
    for epoch in (0, 1):
        union = Counter(p for lines in reads.values() for line in lines if line["epoch"] == epoch
                        for p in line["samples"])
        assert sorted(union) == sorted(catalog.paths()) and set(union.values()) == {1}
    cfg = PlanConfig(batch_size=8, epochs=2, seed=7)
    for r, lines in reads.items():
        expected = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=size)]
        assert [line["samples"] for line in lines] == expected, f"rank {r} did not follow the plan"


def distinct_reads(lines):
    return {p for line in lines for p in line["samples"]}


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec to compare with (install .[mpich])")
def test_one_service_per_node_reads_each_file_once_and_matches_mpiexec(tmp_path):
    job = write_job(tmp_path)
    [(code, out)] = agents(tmp_path, stager_run(job, "--record", "rec", "--report", "rec/r.json"))
    assert code == 0, out
    reads, staged = read_records(tmp_path / "rec")
    assert_follows_plan(reads, tmp_path, 2)
    [files] = staged.values()
    paths = [f["path"] for f in files]
    # One node, one service: over two epochs the shared file system gives
    # each file once, however the two ranks' shares overlap between epochs.
    assert len(paths) == len(set(paths)) == SAMPLES
    report = json.loads((tmp_path / "rec" / "r.json").read_text())
    assert (report["world_size"], report["nodes"], report["files_staged"]) == (2, 1, SAMPLES)
    assert_nothing_left(tmp_path, job)

    proc = mpirun([("a", 2)], ["run", job, "--quiet", "--record", str(tmp_path / "mpi")], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_records(tmp_path / "mpi")[0] == reads, "torchrun and mpiexec runs read differently"

    # Without the backend each rank stages for itself: every file it reads in
    # either epoch, about 1.5 times the dataset for two ranks.
    apart = agents(tmp_path, ["--no-python", "sh", "-c", f'exec "$0" "$@" --report "own-$RANK.json"',
                              sys.executable, *stager_run(job, "--set", "world.backend=none")])
    assert [code for code, _ in apart] == [0], apart[0][1]
    own = [json.loads((tmp_path / f"own-{r}.json").read_text())["files_staged"] for r in (0, 1)]
    assert own == [len(distinct_reads(reads[r])) for r in (0, 1)]
    assert sum(own) > 1.3 * SAMPLES
    assert_nothing_left(tmp_path, job)


def test_two_agents_are_two_nodes_each_staging_only_what_its_ranks_read(tmp_path):
    job = write_job(tmp_path)
    results = agents(tmp_path, stager_run(job, "--record", "rec", "--report", "rec/r.json"), nodes=2)
    assert [code for code, _ in results] == [0, 0], "\n".join(out for _, out in results)
    reads, staged = read_records(tmp_path / "rec")
    assert_follows_plan(reads, tmp_path, 4)
    host = socket.gethostname()
    assert sorted(staged) == [f"{host}-0", f"{host}-1"]
    for node, ranks in ((f"{host}-0", (0, 1)), (f"{host}-1", (2, 3))):
        paths = [f["path"] for f in staged[node]]
        read_here = set().union(*(distinct_reads(reads[r]) for r in ranks))
        assert len(paths) == len(set(paths)), f"node {node} staged a file twice"
        assert set(paths) == read_here, f"node {node} staged other than what its ranks read"
    report = json.loads((tmp_path / "rec" / "r.json").read_text())
    assert (report["world_size"], report["nodes"]) == (4, 2)
    assert [r["node"] for r in report["ranks"]] == [f"{host}-0"] * 2 + [f"{host}-1"] * 2
    assert_nothing_left(tmp_path, job)


WORLD_PROBE = """
import json, numpy
from stager.world import detect
w = detect()
a = numpy.arange(5) * (w.rank + 1)
w.comm.Bcast(a, root=1)
print(json.dumps([w.source, w.rank, w.size, w.node, w.nodes, w.local_rank, w.local_size,
                  w.comm.bcast(w.rank, root=1), w.comm.allgather(w.rank * 10), w.comm.gather(w.rank, root=0),
                  w.node_comm.bcast(w.rank), a.tolist()]))
"""


def test_launcher_variables_alone_give_a_torch_world_grouped_by_host(tmp_path):
    # No torchrun, no process group: MASTER_ADDR/PORT, RANK, WORLD_SIZE as a
    # launcher of one's own would set them; stager initialises the group.
    env = dict(torch_env(tmp_path), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, "-c", WORLD_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(env, RANK=str(r))) for r in (0, 1)]
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        outs.append(json.loads(out.splitlines()[-1]))
    host = socket.gethostname()
    assert outs[0] == ["torch", 0, 2, host, 1, 0, 2, 1, [0, 10], [0, 1], 0, [0, 2, 4, 6, 8]]
    assert outs[1] == ["torch", 1, 2, host, 1, 1, 2, 1, [0, 10], None, 0, [0, 2, 4, 6, 8]]


def test_one_rank_failing_mid_epoch_ends_the_job(tmp_path):
    job = write_job(tmp_path)
    # Endless epochs: only the failure can end this job.
    [(code, out)] = agents(tmp_path, stager_run(job, "--set", "dataset.loader=faults:fail_on_rank_1", "--set",
                                                "run.compute_ms=5", "--set", "plan.epochs=0"), timeout=240)
    assert code != 0
    assert "injected failure on rank 1" in out and "stager: rank 1 of 2" in out
    # The agent stopped rank 0 with SIGTERM and it unwound (exit 128 + 15);
    # nobody needed SIGKILL.
    assert "exitcode  : 143" in out, out
    assert "forcefully" not in out, out
    assert_nothing_left(tmp_path, job)


def test_a_restarted_worker_group_resumes_stager_run_from_its_state_file(tmp_path):
    job = write_job(tmp_path)
    state = tmp_path / "state.json"
    # One minibatch decoded ahead: the failure comes after a few were consumed.
    [(code, out)] = agents(tmp_path, stager_run(job, "--record", "rec", "--set", f"run.state_file={state}",
                                                "--set", "dataset.loader=faults:fail_once_on_rank_1",
                                                "--set", "reader.ahead=1"),
                           extra=["--max-restarts=1"], env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    assert code == 0, out
    assert "injected failure on rank 1" in out
    reads, _ = read_records(tmp_path / "rec")  # the restarted group's
    cfg = PlanConfig(batch_size=8, epochs=2, seed=7)
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    lengths = set()
    for r, lines in reads.items():
        full = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=2)]
        done = [line["samples"] for line in lines]
        assert 0 < len(done) < len(full) and done == full[len(full) - len(done):], f"rank {r} did not resume"
        lengths.add(len(done))
    assert len(lengths) == 1, "the ranks resumed at different positions"
    assert not list(tmp_path.glob("state.json*")), "a completed run leaves no state"
    assert_nothing_left(tmp_path, job)


def test_torch_example_trains_with_ddp_under_torchrun(tmp_path):
    data = jpeg_folder(tmp_path)
    (tmp_path / "local").mkdir()
    [(code, out)] = agents(tmp_path, torch_example(data, tmp_path))
    assert code == 0, out
    assert "epoch 1: loss" in out and "48 samples on rank 0" in out
    assert "2 replicas in sync after 2 epoch(s)" in out
    assert_nothing_left(tmp_path, data)


def test_a_restarted_worker_group_resumes_the_example_from_its_checkpoint(tmp_path):
    # Rank 1 fails in the first worker group only; the agent restarts both
    # workers, which resume from rank 0's last checkpoint and finish in sync.
    # torch 2.13's agent otherwise hands the restarted group its predecessor's
    # store, whose stale addresses make init_process_group fail.
    data = jpeg_folder(tmp_path)
    (tmp_path / "local").mkdir()
    [(code, out)] = agents(tmp_path, torch_example(data, tmp_path, "--batch-size", "4", "--set", "reader.ahead=1",
                                                   "--image-loader", "faults:fail_once_on_rank_1_image",
                                                   "--checkpoint", str(tmp_path / "ck.pt")),
                           extra=["--max-restarts=1"], env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    assert code == 0, out
    assert "injected failure on rank 1" in out
    resumed = [line for line in out.splitlines() if line.startswith("resumed from epoch")]
    assert len(resumed) == 1 and resumed[0] != "resumed from epoch 0, sample 0", out
    assert "2 replicas in sync after 2 epoch(s)" in out
    assert_nothing_left(tmp_path, data)
