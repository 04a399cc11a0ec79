"""Run inside every rank (``mpiexec -n N python -m pytest tests/mpi``, any N): samples packed in tar
shards, each rank reading its share of the ``shards`` order; every collective call before any assert."""

import glob
import os
import shutil
import tempfile
from collections import Counter

import pytest

from stager import plan
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.job.packing import make_shards
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")
webdataset = pytest.importorskip("webdataset")


@pytest.fixture(scope="module")
def world():
    return detect("on")


@pytest.fixture(scope="module")
def shard_dir(world):
    path = world.comm.bcast(tempfile.mkdtemp(prefix="stager-mpi-shards-") if world.rank == 0 else None, root=0)
    if world.rank == 0:
        make_shards(os.path.join(path, "data"), "tar", 160, 2048, 3, 4, 20, progress=False)
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(path)


def test_ranks_share_the_shards_order_and_each_node_stages_each_container_once(world, shard_dir):
    root = os.path.join(shard_dir, "data")
    cfg = config_from_dict({
        "dataset": {"source": root, "manifest": "manifest.tsv", "format": "tar", "loader": "raw"},
        "plan": {"batch_size": 4, "epochs": 2, "seed": 9, "shuffle_algorithm": "shards", "shard_window": 2},
        "staging": {"local_dir": os.path.join(shard_dir, "local"), "prefetchers": 2, "lookahead": 3},
        "reader": {"workers": 2},
    })
    with Pipeline(cfg, world=world) as pipe:
        mine = [(b.epoch, b.indices.tolist(), [s["npy"] for s in b.samples]) for b in pipe]
        staged, catalog = pipe.stats.files_staged, pipe.catalog
    everyone = world.comm.allgather([(e, idx) for e, idx, _ in mine])
    per_node = world.comm.allgather((world.node, world.local_rank, staged))
    world.comm.Barrier()
    left = os.listdir(os.path.join(shard_dir, "local"))

    n = len(catalog)
    for epoch in (0, 1):
        counts = Counter(i for seq in everyone for e, idx in seq if e == epoch for i in idx)
        # every sample once; at a size that does not divide it, the remainder rule pads a few samples again
        assert sorted(counts) == list(range(n))
        assert sum(counts.values()) == plan.fitted_length(n, world.size, "pad")
    spec = plan.PlanSpec.from_config(n, cfg.plan, world.size, containers=catalog.containers)
    assert [(e, idx) for e, idx, _ in mine] == [(m.epoch, m.indices.tolist()) for m in spec.minibatches(world.rank)]
    reference = {s["__key__"]: s["npy"] for s in webdataset.WebDataset(sorted(glob.glob(os.path.join(root, "*.tar"))),
                                                                        shardshuffle=False)}
    for _, idx, data in mine:
        assert data == [reference[catalog.key(i)] for i in idx]
    for node in {x[0] for x in per_node}:
        node_ranks = [r for r, x in enumerate(per_node) if x[0] == node]
        read_here = {int(catalog.file_index([i])[0]) for r in node_ranks for _, idx in everyone[r] for i in idx}
        assert sum(per_node[r][2] for r in node_ranks) == len(read_here), "each container staged once a node"
    assert left == []
