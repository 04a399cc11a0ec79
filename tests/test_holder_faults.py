"""A node that holds files for the others stalls, under mpiexec (``staging.peers: partition``): its leader
stops answering (4 emulated nodes of one rank), or one of its ranks stops asking while the leader answers
that the files are to come (2 nodes, of 1 and 2 ranks). The others read those files from the source, count
them, and deliver every sample."""

import json
import os

import pytest

from conftest import make_job_data
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig
from test_mpi_run import MPIEXEC, assert_nothing_left, mpirun, read_records
from test_peers_run import helper_env

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")

NODES = [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
SAMPLES, BATCH, EPOCHS, STALL_S, MORE = 480, 8, 3, 2, 6
STEPS = SAMPLES // BATCH // len(NODES)  # a rank's minibatches in an epoch


def test_a_holder_stopped_by_sigstop_is_read_around_and_every_sample_is_delivered(tmp_path):
    """Node c's leader is stopped as it starts epoch 1; the others, behind it, will fetch what it read in
    epoch 0. Without a
    collective per step the others go on: each of them records more minibatches while c is stopped, the
    files c holds come from the source (counted as read after a peer did not answer), and once c
    goes on, every rank has had its minibatches in plan order, bytes equal to the source."""
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv, loader: "peerchecks:stop_leader_of_c"}}
synthetic: {{samples: {SAMPLES}, bytes: 3000}}
slowfs: {{enabled: true, open_ms: 2}}
plan: {{batch_size: {BATCH}, epochs: {EPOCHS}, seed: 11}}
staging: {{local_dir: local, peers: partition, prefetchers: 4, stall_timeout_s: {STALL_S}}}
reader: {{workers: 1}}
""")
    job = make_job_data(tmp_path / "job.yaml")
    rec, stopped = tmp_path / "rec", tmp_path / "stopped.json"
    env = helper_env(tmp_path, STAGER_TEST_RECORDS=str(rec), STAGER_TEST_STOPPED=str(stopped),
                     STAGER_TEST_UNTIL=str(STEPS + MORE), STAGER_TEST_AT=str(SAMPLES // len(NODES) + 1))
    proc = mpirun(NODES, ["run", job, "--record", str(rec), "--report", str(rec / "r.json")], tmp_path,
                  timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert stopped.exists(), "node c's reader never stopped its rank"
    pause = json.loads(stopped.read_text())
    others = [r for r in range(len(NODES)) if r != 2]
    # Nobody waited for c: each of the others went MORE minibatches into epoch 1 while it was stopped.
    assert all(pause["before"][r] < STEPS and pause["after"][r] >= STEPS + MORE for r in others), pause

    reads, _ = read_records(rec)
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=BATCH, epochs=EPOCHS, seed=11)
    for r, lines in reads.items():  # the loader checked every sample's bytes against the source
        expected = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=4)]
        assert [line["samples"] for line in lines] == expected, f"rank {r} did not follow the plan"

    report = json.loads((rec / "r.json").read_text())
    assert report["reads"]["source_after_peer"] > 0, report["reads"]
    assert "node leader 2 does not answer" in proc.stderr
    assert_nothing_left(tmp_path, job)


HELD_NODES = [("a", 1), ("b", 2)]
HELD_STEPS = SAMPLES // BATCH // 3   # a rank's minibatches in an epoch
HOLD_S = 52                          # rank 2 is held at most this long: the 30 s, and less than 60


def test_a_holder_whose_rank_stalls_is_read_around_once_its_position_stops_moving(tmp_path):
    """Node b's second rank (global rank 2) stalls in its sixth minibatch of epoch 0; node b's leader goes
    on and answers node a that the files rank 2 will read are to come, from a position that no longer
    moves. Node a, in epoch 1, waits about ``PENDING_STILL_S`` (30 s) for them, not ``staging.stall_timeout_s``
    (300 s, the default) nor the 60 s a moving holder gets: it reads them from the source, counted, and goes
    far into epoch 1 while rank 2 is still held; then every rank has had its minibatches in plan order,
    bytes equal to the source."""
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv, loader: "peerchecks:hold_rank_2"}}
synthetic: {{samples: {SAMPLES}, bytes: 3000}}
slowfs: {{enabled: true, open_ms: 2}}
plan: {{batch_size: {BATCH}, epochs: 2, seed: 11}}
staging: {{local_dir: local, peers: partition, prefetchers: 4, lookahead: 2}}
reader: {{workers: 1, ahead: 1}}
""")
    job = make_job_data(tmp_path / "job.yaml")
    rec, stopped = tmp_path / "rec", tmp_path / "held.json"
    until = HELD_STEPS + HELD_STEPS * 3 // 4
    env = helper_env(tmp_path, STAGER_TEST_RECORDS=str(rec), STAGER_TEST_STOPPED=str(stopped),
                     STAGER_TEST_UNTIL=str(until), STAGER_TEST_AT=str(5 * BATCH + 1), STAGER_TEST_HOLD_S=str(HOLD_S))
    proc = mpirun(HELD_NODES, ["run", job, "--record", str(rec), "--report", str(rec / "r.json")], tmp_path,
                  timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    held = json.loads(stopped.read_text())
    assert held["before"][2] < 6 and held["after"][2] == held["before"][2], held
    assert held["after"][0] >= until, f"node a did not go on while rank 2 was held: {held}\n{proc.stderr}"
    assert "its ranks have asked for nothing new" in proc.stderr, proc.stderr

    reads, _ = read_records(rec)
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=BATCH, epochs=2, seed=11)
    for r, lines in reads.items():  # the loader checked every sample's bytes against the source
        expected = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=3)]
        assert [line["samples"] for line in lines] == expected, f"rank {r} did not follow the plan"
    assert json.loads((rec / "r.json").read_text())["reads"]["source_after_peer"] > 0
    assert_nothing_left(tmp_path, job)
