"""Hugging Face Accelerate runs StagedLoader through ``accelerator.prepare``: real ``accelerate launch``, 2 CPU ranks.

``accelerate launch --cpu --num_processes 2`` alone runs one process;
Accelerate's multi-CPU launch is ``--mpirun_hostfile``, which starts the
ranks with mpirun.
"""

import os
import sys

import pytest
from torch.utils.data import DistributedSampler

from conftest import REPO
from helpers.opens import Opens
from helpers.stacks import free_port, run_job
from test_torch_dropin import write_jpegs

pytest.importorskip("accelerate", reason="Accelerate is not installed (extra 'stacks')")

SCRIPT = os.path.join(REPO, "tests", "helpers", "accelerate_train.py")
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
SAMPLES, BATCH, SEED = 33, 4, 5


def run(tmp_path, tag, *args, expect_kill=False):
    """``accelerate launch`` as a job of its own; returns each rank's records."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    # Accelerate starts several CPU processes with mpirun from a host file (its multi-CPU launch);
    # the venv's MPICH provides mpirun.
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    # Its own rendezvous port: Accelerate's default, 29500, may be taken by another job on the host.
    command = [ACCELERATE, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
               "no", "--dynamo_backend", "no", "--mpirun_hostfile", str(hosts), "--main_process_port", str(free_port()),
               SCRIPT,
               str(tmp_path / "train"), str(out), tag, "--local", str(tmp_path / "local"), *args]
    return run_job(command, tmp_path, env, out, tag, expect_kill=expect_kill)


def distributed_sampler_batches(rank, epoch):
    """What ``DataLoader(ds, BATCH, sampler=DistributedSampler(ds, seed=SEED))`` gives ``rank`` in ``epoch``."""
    sampler = DistributedSampler(range(SAMPLES), num_replicas=2, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[i:i + BATCH] for i in range(0, len(order), BATCH)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("accelerate")
    root = write_jpegs(str(tmp_path / "train"), per_class=11)
    theirs = run(tmp_path, "dataloader", "--loader", "dataloader")
    with Opens(root) as opens:
        ours = run(tmp_path, "staged")
        counts = opens.count()
    return tmp_path, theirs, ours, counts


def test_prepare_keeps_the_loader_each_rank_its_distributed_sampler_share_each_file_once(runs):
    tmp_path, theirs, ours, counts = runs
    root = tmp_path / "train"
    for r in range(2):
        assert {s["type"] for s in ours[r]} == {"StagedLoader"}, "prepare() must not re-wrap (and re-shard) it"
        for epoch in (0, 1):
            got = [s["indices"] for s in ours[r] if s["epoch"] == epoch]
            assert got == distributed_sampler_batches(r, epoch)
        # As many minibatches as Accelerate's own sharding of a DataLoader (which fills the last one up).
        assert {s["len"] for s in ours[r]} == {s["len"] for s in theirs[r]} == {5}
        assert len(ours[r]) == len(theirs[r]) == 10
    for epoch in (0, 1):
        per_rank = [sum(len(s["indices"]) for s in ours[r] if s["epoch"] == epoch) for r in range(2)]
        assert per_rank == [17, 17], "equal samples per rank"
    files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    assert dict(counts) == {f: 1 for f in files}, "each JPEG is read from the source once for the node"
    assert os.listdir(tmp_path / "local") == []


@pytest.mark.parametrize("stop_after", [2, 7])
def test_save_state_and_load_state_resume_the_exact_order_after_a_kill(runs, tmp_path, stop_after):
    whole = runs[2]
    os.symlink(runs[0] / "train", tmp_path / "train")
    first = run(tmp_path, "first", "--stop-after", str(stop_after), expect_kill=True)
    rest = run(tmp_path, "rest", "--resume", str(tmp_path / "out" / "state"))
    for r in range(2):
        assert len(first[r]) == stop_after
        keys = [(s["epoch"], s["indices"], s["labels"]) for s in whole[r]]
        assert [(s["epoch"], s["indices"], s["labels"]) for s in first[r] + rest[r]] == keys, f"rank {r}"
    assert os.listdir(tmp_path / "local") == []
