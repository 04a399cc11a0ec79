"""Tar shards under the mpich wheel's mpiexec: 4 ranks as 2 emulated nodes sharing containers over peers."""

import json
import os
import shutil
from collections import Counter

import pytest

from conftest import make_job_data
from stager import plan
from stager.catalog import load_catalog
from stager.config import load_config
from test_mpi_run import MPIEXEC, assert_nothing_left, mpirun, read_records
from test_peers_run import helper_env

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")

SAMPLES, PER_SHARD, EPOCHS = 240, 20, 3


COUNTS = {"counts set": "staging: {local_dir: local, lookahead: 4, peers: partition, prefetchers: 4}\n"
                        "reader: {workers: 2}\n",
          # auto: each leader's probe reads the first containers its node reads from the source, no other's
          "defaults": "staging: {local_dir: local, peers: partition}\n"}


@pytest.mark.parametrize("counts", list(COUNTS))
def test_peers_read_each_container_from_the_source_once_per_job(tmp_path, counts):
    from helpers.opens import Opens
    from stager.formats.tar import index_name

    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv, format: tar, loader: "shardchecks:same_as_webdataset"}}
synthetic: {{samples: {SAMPLES}, bytes: 3000, per_shard: {PER_SHARD}}}
slowfs: {{enabled: true, open_ms: 2}}
plan: {{batch_size: 5, epochs: {EPOCHS}, seed: 3, shuffle_algorithm: shards, shard_window: 3}}
""" + COUNTS[counts])
    job = make_job_data(tmp_path / "job.yaml")
    rec = tmp_path / "rec"
    # The readers check each sample against a copy, so that the opens counted are stager's alone.
    shutil.copytree(tmp_path / "data", tmp_path / "reference")
    env = dict(helper_env(tmp_path), STAGER_TEST_SOURCE=str(tmp_path / "reference"))
    with Opens(tmp_path / "data") as opens:
        proc = mpirun([("a", 2), ("b", 2)], ["run", job, "--quiet", "--record", str(rec), "--report",
                                             str(rec / "r.json")], tmp_path, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        counts = opens.count()
    reads, staged = read_records(rec)
    cfg = load_config(job)
    catalog = load_catalog(cfg.replace(dataset={"source": str(tmp_path / "data")}).dataset)
    assert len(catalog.files) == SAMPLES // PER_SHARD
    spec = plan.PlanSpec.from_config(SAMPLES, cfg.plan, 4, containers=catalog.containers)
    for r, lines in reads.items():  # the loader checked every sample's parts against webdataset's reading
        assert [line["samples"] for line in lines] == [[catalog.name(i) for i in m.indices]
                                                       for m in spec.minibatches(r)], f"rank {r} left the plan"
    for epoch in range(EPOCHS):
        names = [s for lines in reads.values() for line in lines if line["epoch"] == epoch for s in line["samples"]]
        assert sorted(names) == sorted(catalog.name(i) for i in range(SAMPLES)), "each sample once an epoch"
    from_source = Counter(f["path"] for files in staged.values() for f in files)
    assert dict(from_source) == {p: 1 for p in catalog.files.paths()}, \
        "each container must be read from the shared file system once in the job:\n" + proc.stderr[-3000:]
    counts.pop("manifest.tsv", None)
    # Each container opened once in all, to be staged: the catalog reads the index written beside it.
    assert dict(counts) == {**{p: 1 for p in catalog.files.paths()}, **{index_name(p): 1 for p in catalog.files.paths()}}
    report = json.loads((rec / "r.json").read_text())
    assert report["reads"]["source"]["files"] == len(catalog.files)
    assert report["reads"]["peers"]["files"] > 0
    assert_nothing_left(tmp_path, job)
