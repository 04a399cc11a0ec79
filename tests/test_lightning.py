"""PyTorch Lightning trains on StagedLoader with one line changed: real Trainer runs, 2 CPU ranks.

Every comparison is against the same script with Lightning's own DataLoader
path (Lightning injecting its DistributedSampler), run by the same Trainer.
"""

import os
import sys

import pytest

from conftest import REPO
from helpers.opens import Opens
from helpers.stacks import run_job
from test_mpi_run import MPIEXEC
from test_torch_dropin import write_jpegs

pytest.importorskip("lightning", reason="Lightning is not installed (extra 'stacks')")

SCRIPT = os.path.join(REPO, "tests", "helpers", "lightning_train.py")
SAMPLES = 33  # 2 ranks: DistributedSampler pads one


def run(tmp_path, tag, *args, launcher=(), expect_kill=False):
    """Runs the script (under ``launcher``, if any) as a job of its own; returns each rank's records."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")
    command = [*launcher, sys.executable, SCRIPT, str(tmp_path / "train"), str(out), tag, *args]
    return run_job(command, tmp_path, env, out, tag, expect_kill=expect_kill)


def by_epoch(steps):
    epochs = {}
    for step in steps:
        epochs.setdefault(step["epoch"], []).append((step["indices"], step["labels"]))
    return epochs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same two epochs with Lightning's DataLoader and with StagedLoader (source opens counted)."""
    tmp_path = tmp_path_factory.mktemp("lightning")
    root = write_jpegs(str(tmp_path / "train"), per_class=11)
    want = run(tmp_path, "dataloader", "--loader", "dataloader")
    with Opens(root) as opens:
        got = run(tmp_path, "staged", "--loader", "staged", "--local", str(tmp_path / "local"))
        counts = opens.count()
    return tmp_path, want, got, counts


def test_ddp_ranks_train_on_what_lightnings_dataloader_gives_them_and_each_file_is_read_once(runs):
    tmp_path, want, got, counts = runs
    root = tmp_path / "train"
    for r in range(2):
        assert by_epoch(got[r]) == by_epoch(want[r]), f"rank {r} trained on other samples than DataLoader's"
        assert {s["len"] for s in got[r]} == {s["len"] for s in want[r]} == {5}
    epochs = [by_epoch(got[0]), by_epoch(got[1])]
    for epoch in (0, 1):
        read = [i for r in range(2) for indices, _ in epochs[r][epoch] for i in indices]
        assert sorted(set(read)) == list(range(SAMPLES)) and len(read) == SAMPLES + 1
    assert epochs[0][0] != epochs[0][1], "each epoch its own order"
    files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    assert dict(counts) == {f: 1 for f in files}, "each JPEG is read from the source once for the node"
    assert os.listdir(tmp_path / "local") == []


@pytest.mark.parametrize("stop_after", [3, 7])
def test_a_job_killed_after_a_mid_epoch_checkpoint_resumes_the_exact_order(runs, tmp_path, stop_after):
    _, _, whole, _ = runs
    os.symlink(runs[0] / "train", tmp_path / "train")
    local = str(tmp_path / "local")
    first = run(tmp_path, "first", "--loader", "staged", "--local", local, "--stop-after", str(stop_after),
                expect_kill=True)
    rest = run(tmp_path, "rest", "--loader", "staged", "--local", local, "--resume", str(tmp_path / "out" / "mid.ckpt"))
    for r in range(2):
        assert len(first[r]) == stop_after
        keys = [(s["epoch"], s["batch"], s["indices"], s["labels"]) for s in whole[r]]
        resumed = [(s["epoch"], s["batch"], s["indices"], s["labels"]) for s in first[r] + rest[r]]
        assert resumed == keys, f"rank {r}: the resumed run differs from the uninterrupted one"
    assert os.listdir(local) == [], "the killed job's staging directory is swept when the next one starts"


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")
def test_lightning_launched_by_mpiexec_gives_each_rank_dataloaders_share(runs, tmp_path):
    _, want, _, _ = runs
    os.symlink(runs[0] / "train", tmp_path / "train")
    got = run(tmp_path, "staged", "--loader", "staged", "--local", str(tmp_path / "local"),
              launcher=(MPIEXEC, "-n", "2"))
    for r in range(2):
        assert by_epoch(got[r]) == by_epoch(want[r])
