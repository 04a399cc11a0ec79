"""StagingIterator snapshots under MPI, run inside every rank (``mpiexec -n N
python -m pytest tests/mpi``; plain pytest runs them as one rank): the saved
``order`` is the global order, the ranks' snapshots are identical, and each
rank resumes its own exactly on the same number of ranks."""

import os
import shutil
import tempfile

import numpy as np
import pytest

from stager.config import config_from_dict
from stager.job.synth import make_dataset
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")
chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
chainer = chainer_front._chainer
StagingIterator = chainer_front.StagingIterator
SAMPLES = 61  # not a multiple of the ranks: the pad rule applies


@pytest.fixture(scope="module")
def world():
    return detect("on")


@pytest.fixture(scope="module")
def shared_dir(world):
    path = world.comm.bcast(tempfile.mkdtemp(prefix="stager-mpi-chainer-") if world.rank == 0 else None, root=0)
    if world.rank == 0:
        make_dataset(os.path.join(path, "data"), SAMPLES, nbytes=1024, classes=3, seed=5, progress=False)
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(path)


def config(shared_dir):
    return config_from_dict({
        "dataset": {"source": os.path.join(shared_dir, "data"), "manifest": "manifest.tsv", "loader": "raw"},
        "plan": {"seed": 6},
        "staging": {"local_dir": os.path.join(shared_dir, "local"), "prefetchers": 1},
        "reader": {"workers": 1},
    })


def fresh(with_sampler):
    """Iterator arguments; a sampler seeded alike on every rank, as MPI needs."""
    return {"order_sampler": chainer.iterators.ShuffleOrderSampler(np.random.RandomState(9))} if with_sampler else {}


@pytest.mark.parametrize("with_sampler", [False, True], ids=["shuffle", "sampler"])
def test_each_rank_resumes_its_snapshot_and_the_order_is_global(world, shared_dir, with_sampler):
    cfg = config(shared_dir)
    args = fresh(with_sampler)
    snap = os.path.join(shared_dir, f"snap-{with_sampler}-{world.rank}.npz")
    with StagingIterator(cfg, 4, world=world, **args) as it:
        full = [raw for _ in range(30) for raw, _ in it.next()]
    with StagingIterator(cfg, 4, world=world, **fresh(with_sampler)) as it:
        head = [raw for _ in range(11) for raw, _ in it.next()]
        chainer.serializers.save_npz(snap, it)
        position = (it.epoch, it.current_position, it.is_new_epoch, it.previous_epoch_detail)
    with StagingIterator(cfg, 4, world=world, **fresh(with_sampler)) as it:
        chainer.serializers.load_npz(snap, it)
        resumed = (it.epoch, it.current_position, it.is_new_epoch, it.previous_epoch_detail)
        tail = [raw for _ in range(19) for raw, _ in it.next()]
    with np.load(snap) as f:
        saved = {key: f[key].tolist() for key in f.files}
    everyone = world.comm.allgather(saved)
    order = np.array(saved["order"])
    assert resumed == position
    if with_sampler:
        # A sampler's state is not part of a snapshot (nor of Chainer's): the
        # orders of later epochs are drawn afresh, so only the global
        # minibatches that lie wholly in this epoch compare.
        length = -(-SAMPLES // world.size) * world.size
        at = position[0] * length + position[1] * world.size
        keep = (((position[0] + 1) * length - at) // (4 * world.size)) * 4
        full, tail = full[:len(head) + keep], tail[:keep]
    assert head + tail == full
    assert all(snapshot == everyone[0] for snapshot in everyone), "every rank saves the same snapshot"
    assert sorted(order.tolist()) == list(range(SAMPLES))
