"""A DALI CPU pipeline over iterators.dali.reader in every rank (``mpiexec -n N python -m pytest tests/mpi``,
any N, emulated nodes or not): each epoch, the ranks together get every file once, with its folder's label and
its bytes; DALI's decoder and PIL agree on them. Every test makes all its collective calls before it asserts."""

import hashlib
import os
import shutil
import tempfile

import numpy as np
import pytest

from stager.job.synth import make_dataset
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")
pytest.importorskip("nvidia.dali")
from nvidia.dali import fn, pipeline_def  # noqa: E402
from PIL import Image  # noqa: E402

from iterators import _dali_files  # noqa: E402
from iterators.dali import reader, readers  # noqa: E402

SAMPLES = 48  # a multiple of 1, 2, 3 and 4 ranks: no sample padded


@pytest.fixture(scope="module")
def world():
    return detect("on")


@pytest.fixture(scope="module")
def jpegs(world):
    path = world.comm.bcast(tempfile.mkdtemp(prefix="stager-mpi-dali-") if world.rank == 0 else None, root=0)
    if world.rank == 0:
        make_dataset(os.path.join(path, "data"), SAMPLES, nbytes=3000, classes=4, seed=2, progress=False,
                     fmt="jpeg")
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(path)


def _digest(data):
    return hashlib.sha1(np.asarray(data).tobytes()).hexdigest()


def test_the_ranks_get_every_file_once_an_epoch_with_its_label_and_bytes(world, jpegs):
    data = os.path.join(jpegs, "data")
    config = {"staging": {"local_dir": os.path.join(jpegs, "local"), "prefetchers": 2}}

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def train():
        encoded, labels = reader(file_root=data, random_shuffle=True, seed=8, config=config)
        return encoded, labels, fn.decoders.image(encoded, device="cpu")

    pipe = train()
    pipe.build()
    epochs = []
    for _ in range(2):
        got = []
        try:
            while True:
                encoded, labels, images = pipe.run()
                got += [(_digest(encoded.at(k)), int(labels.at(k)[0]), np.array(images.at(k)))
                        for k in range(len(labels))]
        except StopIteration:
            pipe.reset()
        epochs.append(got)
    for source in readers(pipe):
        source.close()
    everyone = world.comm.allgather([[(d, label) for d, label, _ in epoch] for epoch in epochs])
    world.comm.Barrier()

    rels, labels = _dali_files.tree(data)
    source = {}
    for rel, label in zip(rels, labels):
        with open(os.path.join(data, rel), "rb") as handle:
            source[_digest(np.frombuffer(handle.read(), np.uint8))] = (rel, label)
    for epoch in range(2):
        together = [sample for rank in everyone for sample in rank[epoch]]
        assert sorted(source[d][0] for d, _ in together) == sorted(rels)
        assert all(label == source[d][1] for d, label in together)
    for epoch in epochs:
        for digest, _, image in epoch:
            rel = source[digest][0]
            assert np.array_equal(image, np.asarray(Image.open(os.path.join(data, rel)).convert("RGB"))), rel
    assert everyone[world.rank][0] != everyone[world.rank][1], "each epoch is shuffled anew"
