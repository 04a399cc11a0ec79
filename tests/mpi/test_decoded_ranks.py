"""The decoded tier under MPI ranks (``mpiexec -n N python -m pytest tests/mpi``, any N, emulated nodes or
not): the ranks of a node share one tier, so a sample one rank decoded in epoch 1 is built from its copy by
whichever rank of the node reads it in epoch 2; a sample the node did not read in epoch 1 is decoded. Every
test makes all its collective calls before it asserts."""

import os
import shutil
import tempfile

import numpy as np
import pytest

from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.formats.images import load_image
from stager.job.synth import make_dataset
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")


@pytest.fixture(scope="module")
def world():
    return detect("on")


@pytest.fixture(scope="module")
def jpegs(world):
    path = world.comm.bcast(tempfile.mkdtemp(prefix="stager-mpi-decoded-") if world.rank == 0 else None, root=0)
    if world.rank == 0:
        make_dataset(os.path.join(path, "data"), 48, nbytes=4000, classes=3, seed=4, progress=False, fmt="jpeg")
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(path)


def test_the_ranks_of_a_node_build_from_each_others_decoded_copies(world, jpegs):
    data = os.path.join(jpegs, "data")
    cfg = config_from_dict({
        "dataset": {"source": data, "manifest": "manifest.tsv", "loader": "image"},
        "plan": {"batch_size": 4, "epochs": 2, "seed": 6},
        "staging": {"local_dir": os.path.join(jpegs, "local"), "prefetchers": 2, "decoded": "on"},
        "reader": {"workers": 2},
    })
    with Pipeline(cfg, world=world) as pipe:
        mine = [(b.epoch, b.indices.tolist(), [s[0] for s in b.samples]) for b in pipe]
        catalog = pipe.catalog
        decoded = dict(pipe.stats.decoded)
    reads = world.comm.allgather((world.node, [(e, idx) for e, idx, _ in mine], decoded))
    world.comm.Barrier()

    for _, idx, samples in mine:
        for i, sample in zip(idx, samples):
            assert np.array_equal(sample, load_image(os.path.join(data, catalog.path(i)), {})), catalog.path(i)
    node = [r for r in reads if r[0] == world.node]
    first = {i for _, seq, _ in node for e, idx in seq if e == 0 for i in idx}
    second = {i for _, seq, _ in node for e, idx in seq if e == 1 for i in idx}
    built = sum(d["samples_from_decoded"] for _, _, d in node)
    kept = sum(d["samples_kept"] for _, _, d in node)
    assert built + kept == len(first) + len(second), "every sample is built from a copy or decoded and kept"
    # A sample of epoch 1's last minibatches may be read for epoch 2 by another rank before its copy is written.
    assert 0 < built <= len(first & second) if first & second else built == 0
