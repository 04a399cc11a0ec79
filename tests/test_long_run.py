"""A node service that lives for days: 200 epochs of a small dataset under mpiexec, 4 ranks as 2 emulated
nodes, peers and a bounded cache, every process watched from outside. Nothing may grow with the epochs:
memory, open files, the staging directory."""

import json
import os
import subprocess
import sys

import pytest

from conftest import make_job_data
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig
from test_mpi_run import MPIEXEC, assert_nothing_left, read_records

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")

SAMPLES, BYTES, BATCH, EPOCHS, RANKS = 256, 3000, 8, 200, 4
STEPS = SAMPLES // BATCH // RANKS  # rank 0's minibatches in an epoch
CAPACITY = 240_000                 # per node: less than its ranks read, so the cache evicts every epoch
# What epochs 100-200 may add to a process's memory (the median over 10 epochs at each end). Measured here:
# readers and prefetchers under 0.3 MiB, ranks 0.4 MiB, node leaders 2-5 MiB (15-25 KiB an epoch: not
# Python objects, not memory malloc could give back, not the event log (bounded), not the peer protocol
# alone; not explained yet, see docs/benchmarks.md). It fails on 400 bytes more a file read, or 3 KiB more
# a minibatch.
GROWTH_KIB = 5 * 1024


def test_200_epochs_with_peers_and_a_bounded_cache_stay_flat(tmp_path):
    from helpers.procwatch import ProcWatch

    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv, loader: npy}}
synthetic: {{samples: {SAMPLES}, bytes: {BYTES}}}
slowfs: {{enabled: true, open_ms: 1}}
plan: {{batch_size: {BATCH}, epochs: {EPOCHS}, seed: 5}}
staging: {{local_dir: local, peers: partition, prefetchers: 2, capacity: {CAPACITY}}}
reader: {{workers: 1}}
""")
    job = make_job_data(tmp_path / "job.yaml")
    rec = tmp_path / "rec"
    args = [sys.executable, "-m", "stager", "run", job, "--quiet", "--record", str(rec), "--report",
            str(rec / "r.json")]
    cmd = [MPIEXEC, "-n", "2", "-env", "STAGER_NODE_ID", "a", *args, ":", "-n", "2", "-env", "STAGER_NODE_ID", "b",
           *args]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with ProcWatch(proc.pid, rec / "rank-0.jsonl", STEPS, tmp_path / "local") as watch:
        try:
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, out + err

    reads, _ = read_records(rec)
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=BATCH, epochs=EPOCHS, seed=5)
    for r, lines in reads.items():
        expected = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=RANKS)]
        assert [line["samples"] for line in lines] == expected, f"rank {r} did not follow the plan"

    middle, late = watch.per_process(90, 100), watch.per_process(EPOCHS - 10, EPOCHS)
    assert len(late) >= 2 * RANKS, "the watch saw the ranks and their workers in the last epochs"
    for pid in set(middle) & set(late):
        name, rss_mid, fds_mid = middle[pid]
        _, rss_late, fds_late = late[pid]
        assert rss_late - rss_mid <= GROWTH_KIB, f"{name} (pid {pid}) grew {rss_late - rss_mid} KiB in 100 epochs"
        assert fds_late <= fds_mid + 2, f"{name} (pid {pid}) holds {fds_late} descriptors, {fds_mid} at epoch 100"
    # Staged files stay within both nodes' capacities all along (a file being published counts).
    most = max(s["local_bytes"] for s in watch.samples)
    assert 0 < most <= 2 * CAPACITY, most

    report = json.loads((rec / "r.json").read_text())
    assert len(report["cache"]) == EPOCHS and report["reads"]["source"]["files"] >= SAMPLES
    assert_nothing_left(tmp_path, job)
