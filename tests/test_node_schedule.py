"""The node's prefetchers keep its ranks in step (``staging.node_schedule``), under the mpich wheel's mpiexec.

Four ranks on one node; every file of rank 0's share is behind a slow mount
(40 ms an open), the others' behind a fast one (1 ms). With ``deadline``
each free prefetcher takes the earliest minibatch of any rank, so the fast
ranks' later minibatches wait behind the slow rank's next one: in the order
the leader staged files in (its ``--record``), a fast rank never has more
than a few minibatches staged beyond those the slow rank has. ``arrival``
serves the ranks in the order they asked, which lets one side run far ahead
of the other.
"""

import json
import os

import pytest

from stager import plan
from stager.config import PlanConfig
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS
from test_mpi_run import MPIEXEC, assert_nothing_left, mpirun, read_records

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")

RANKS = 4
PER_RANK = 96
BATCH = 8
PLAN = PlanConfig(batch_size=BATCH, epochs=1, shuffle=False)
AHEAD = 4  # minibatches a fast rank may be staged ahead of the slow one with deadline: those in flight


@pytest.fixture(scope="module")
def backing(tmp_path_factory):
    root = tmp_path_factory.mktemp("schedule")
    make_dataset(str(root / "slow"), PER_RANK, nbytes=4096, classes=4, seed=1, progress=False)
    make_dataset(str(root / "fast"), PER_RANK * (RANKS - 1), nbytes=4096, classes=4, seed=2, progress=False)
    return root


def _plans():
    n = RANKS * PER_RANK
    return {r: [m.indices.tolist() for m in plan.iterate(n, PLAN, rank=r, size=RANKS)] for r in range(RANKS)}


def _write(tmp_path, backing, schedule):
    """The source (mount points, a manifest putting rank 0's share on ``slow/``) and the job's YAML."""
    src = tmp_path / "src"
    (src / "slow").mkdir(parents=True)
    (src / "fast").mkdir()
    plans = _plans()
    slow_set = {i for m in plans[0] for i in m}
    lines = {"slow": iter(open(backing / "slow" / MANIFEST)), "fast": iter(open(backing / "fast" / MANIFEST))}
    manifest = [f"{name}/{next(lines[name])}" for name in
                ("slow" if i in slow_set else "fast" for i in range(RANKS * PER_RANK))]
    (src / MANIFEST).write_text("".join(manifest))
    job = tmp_path / "job.yaml"
    job.write_text(f"""
dataset: {{source: {src}, manifest: {MANIFEST}, loader: raw}}
plan: {{batch_size: {BATCH}, epochs: 1, shuffle: false}}
staging: {{local_dir: {tmp_path / 'local'}, prefetchers: 8, lookahead: 12, node_schedule: {schedule}}}
reader: {{workers: 1}}
run: {{compute_ms: 5}}
""")
    return src, str(job), [line.split("\t")[0] for line in manifest]


def _lead(staged_paths, paths):
    """The most minibatches a fast rank had staged in order beyond those of the slow rank staged whole.

    The slow rank's minibatches are counted whole in any order, not as a prefix: one of its opens that
    straggles (a prefetcher off its core for a while) holds back that one minibatch, not every later one,
    while each of the fast ranks' minibatches was handed out after the slow rank's earlier ones.
    """
    plans = _plans()
    owner = {}
    for r, minibatches in plans.items():
        for seq, indices in enumerate(minibatches):
            for i in indices:
                owner[paths[i]] = (r, seq)
    left = {(r, seq): len(m) for r, ms in plans.items() for seq, m in enumerate(ms)}
    complete = {r: 0 for r in plans}  # minibatches staged whole, in order, per rank
    slow_whole = 0  # the slow rank's minibatches staged whole, in any order
    lead = 0
    for path in staged_paths:
        key = owner[path]
        left[key] -= 1
        r = key[0]
        if r == 0 and left[key] == 0:
            slow_whole += 1
        while complete[r] < len(plans[r]) and left[(r, complete[r])] == 0:
            complete[r] += 1
        if complete[0] < len(plans[0]):
            lead = max(lead, max(complete[f] for f in range(1, RANKS)) - slow_whole)
    return lead


@pytest.mark.parametrize("schedule", ["deadline", "arrival"])
def test_deadline_keeps_the_slow_ranks_next_minibatch_ahead_of_the_others_later_ones(tmp_path, backing, schedule):
    src, job, paths = _write(tmp_path, backing, schedule)
    rec = tmp_path / "rec"
    with SlowFS(str(backing / "slow"), str(src / "slow"), open_ms=40.0), \
            SlowFS(str(backing / "fast"), str(src / "fast"), open_ms=1.0):
        proc = mpirun([("a", RANKS)], ["run", job, "--quiet", "--record", str(rec), "--report",
                                       str(rec / "r.json")], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reads, staged = read_records(rec)
    plans = _plans()
    for r in range(RANKS):  # every rank got its share, in plan order
        assert [line["samples"] for line in reads[r]] == [[paths[i] for i in m] for m in plans[r]]
    order = [f["path"] for f in staged["a"]]
    assert sorted(order) == sorted(paths), "each file staged once"
    report = json.loads((rec / "r.json").read_text())
    assert report["config"]["staging"]["node_schedule"] == schedule
    lead = _lead(order, paths)
    if schedule == "deadline":
        assert lead <= AHEAD, f"a fast rank was staged {lead} minibatches ahead of the slow one"
    assert_nothing_left(tmp_path, job)
