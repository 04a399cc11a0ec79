"""A node service that lives for days, every process watched from outside: 200 epochs of a small dataset
under mpiexec, 4 ranks as 2 emulated nodes, peers and a bounded cache; and 300 epochs of two jobs sharing
a node's service and its shelf of decoded minibatches. Nothing may grow with the epochs: memory, open
files, the staging directory, the shelf."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, make_job_data
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig
from test_mpi_run import MPIEXEC, assert_nothing_left, read_records
from test_share import group  # noqa: F401 (the fixture: a dataset behind the emulator, a group name, cleanup)

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")

SAMPLES, BYTES, BATCH, EPOCHS, RANKS = 256, 3000, 8, 200, 4
STEPS = SAMPLES // BATCH // RANKS  # rank 0's minibatches in an epoch
CAPACITY = 240_000                 # per node: less than its ranks read, so the cache evicts every epoch
# What epochs 100-200 may add to a process's memory (the median over 10 epochs at each end). Measured here:
# readers and prefetchers under 0.3 MiB, ranks 0.6 MiB (the event log filling its bounded window), node
# leaders about 1 MiB, with steps of 1-3 MiB at no fixed epoch (see docs/benchmarks.md; they grew 15-25 KiB
# an epoch while a thread was started for every file read around a peer). It fails on 400 bytes more a
# file read, or 3 KiB more a minibatch.
GROWTH_KIB = 5 * 1024
# Descriptors a process may hold throughout (the fewest over the window) beyond those at epoch 100: the event
# log's temporary file, opened once when a thread's log first spills, and new slots of a reader's ring (each
# slot's mapping holds a descriptor on both sides; a slot is made when all are in use, bounded by the
# read-ahead; seen: one in 190 epochs). A leak of one a file or a minibatch would be hundreds.
FDS_MORE = 4


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
        name, rss_mid, _, fds_mid = middle[pid]
        _, rss_late, _, fds_late = late[pid]
        assert rss_late - rss_mid <= GROWTH_KIB, f"{name} (pid {pid}) grew {rss_late - rss_mid} KiB in 100 epochs"
        assert fds_late <= fds_mid + FDS_MORE, f"{name} (pid {pid}) holds {fds_late} descriptors, {fds_mid} at 100"
    # Staged files stay within both nodes' capacities all along (a file being published counts).
    most = max(s["local_bytes"] for s in watch.samples)
    assert 0 < most <= 2 * CAPACITY, most

    report = json.loads((rec / "r.json").read_text())
    assert len(report["cache"]) == EPOCHS and report["reads"]["source"]["files"] >= SAMPLES
    assert_nothing_left(tmp_path, job)


SHARED_EPOCHS, SHARE_WINDOW = 300, 64  # a window the jobs' start-up lag fits in: they share from the start


def test_two_jobs_sharing_a_node_for_300_epochs_keep_memory_files_and_the_shelf_bounded(group):
    """Two ``stager run`` jobs of one group (``staging.share``, the same order: one stream of decoded
    minibatches) for 300 epochs: every process of both jobs and of the service they share keeps its memory
    and descriptors over epochs 100-300, the shelf never holds more than the window of published minibatches
    and as many free files, and both jobs get every minibatch in plan order (bytes checked by the loader)."""
    import glob

    from helpers.procwatch import ProcWatch
    from test_share import SAMPLES as SHARED_SAMPLES, assert_service_gone, service_pids

    g = group
    staging = {"local_dir": str(g["tmp"] / "local"), "prefetchers": 2, "lookahead": 4, "share": g["name"],
               "share_window": SHARE_WINDOW}
    job = g["tmp"] / "shared.yaml"
    job.write_text(f"""
dataset: {{source: {g['source']}, manifest: manifest.tsv, loader: "groupchecks:counted"}}
plan: {{batch_size: {BATCH}, epochs: {SHARED_EPOCHS}, seed: 3}}
staging: {json.dumps(staging)}
reader: {{workers: 1}}
run: {{compute_ms: 5}}
""")
    env = dict(os.environ, TMPDIR=str(g["tmp"]), STAGER_TEST_COPY=str(g["tmp"] / "copy"),
               STAGER_TEST_DECODES=str(g["tmp"] / "decodes"),
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "helpers"), os.environ.get("PYTHONPATH", REPO)]))
    procs = []
    for label in ("a", "b"):  # at once, so that they stay in step: the first to start founds the service
        rec = g["tmp"] / f"rec-{label}"
        rec.mkdir()
        proc = subprocess.Popen([sys.executable, "-m", "stager", "run", str(job), "--quiet", "--record", str(rec),
                                 "--report", str(rec / "r.json")], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        proc.rec = rec
        procs.append(proc)
        g["procs"].append(proc)
    shelf = f"/dev/shm/stager-share-{os.getuid()}-{g['name']}-*"
    steps = SHARED_SAMPLES // BATCH
    with ProcWatch(lambda: [p.pid for p in procs if p.poll() is None] + service_pids(g), procs[0].rec / "rank-0.jsonl",
                   steps, lambda: glob.glob(shelf), interval_s=0.2) as watch:
        outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs

    catalog = Catalog.from_manifest(str(g["tmp"] / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=BATCH, epochs=SHARED_EPOCHS, seed=3)
    order = [[catalog.name(i) for i in m.indices] for m in plan.iterate(SHARED_SAMPLES, cfg)]
    for p in procs:
        lines = [json.loads(line) for line in open(p.rec / "rank-0.jsonl")]
        assert [line["samples"] for line in lines] == order
        group_counts = json.loads((p.rec / "r.json").read_text())["group"]
        assert group_counts["batches_from_group"] + group_counts["batches_published"] == len(order)
    shared = sum(json.loads((p.rec / "r.json").read_text())["group"]["batches_from_group"] for p in procs)
    assert shared > 0, "the jobs never took a minibatch from the shelf"

    middle, late = watch.per_process(100, 120), watch.per_process(SHARED_EPOCHS - 20, SHARED_EPOCHS)
    assert len(set(middle) & set(late)) >= 5, "the watch saw both jobs, the service and their workers"
    for pid in set(middle) & set(late):
        name, rss_mid, _, fds_mid = middle[pid]
        _, rss_late, _, fds_late = late[pid]
        assert rss_late - rss_mid <= GROWTH_KIB, f"{name} (pid {pid}) grew {rss_late - rss_mid} KiB in 180 epochs"
        assert fds_late <= fds_mid + FDS_MORE, f"{name} (pid {pid}) holds {fds_late} descriptors, {fds_mid} at 100"
    on_shelf = [s["local_files"] for s in watch.samples if s["epoch"] >= 0]
    assert 0 < max(on_shelf) <= 2 * SHARE_WINDOW + 2, f"the shelf held up to {max(on_shelf)} files"
    assert_service_gone(g)
