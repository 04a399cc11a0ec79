"""Chainer's file-backed datasets as StagingIterator's dataset: real PNG and
JPEG files behind the FUSE emulator, staged and decoded by the dataset's own
get_example; in-memory datasets refused with a pointer to MultiprocessIterator."""

import os
import pickle
import zipfile

import numpy as np
import pytest

from stager.config import config_from_dict
from stager.slowfs import SlowFS

chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
PIL = pytest.importorskip("PIL.Image", reason="Pillow is needed by Chainer's image datasets")
chainer = chainer_front._chainer
StagingIterator = chainer_front.StagingIterator
datasets = chainer.datasets

IMAGES = 30


@pytest.fixture(scope="module")
def image_source(tmp_path_factory):
    """PNG (RGB) and JPEG (greyscale) files, seen through the slow file system."""
    root = tmp_path_factory.mktemp("images")
    random = np.random.RandomState(0)
    for i in range(IMAGES):
        os.makedirs(root / f"c{i % 3}", exist_ok=True)
        PIL.fromarray(random.randint(0, 256, (5, 6, 3), dtype=np.uint8)).save(root / f"c{i % 3}" / f"{i}.png")
        PIL.fromarray(random.randint(0, 256, (7, 4), dtype=np.uint8)).save(root / f"c{i % 3}" / f"{i}.jpg")
    mnt = tmp_path_factory.mktemp("mnt")
    with SlowFS(str(root), str(mnt), open_ms=1.0, mbps=0) as mounted:
        yield mounted


@pytest.fixture
def staging(tmp_path):
    return {"staging": {"local_dir": str(tmp_path / "local"), "prefetchers": 2}, "reader": {"workers": 2}}


def pngs():
    return [(f"c{i % 3}/{i}.png", i % 3) for i in range(IMAGES)]


def same_example(a, b):
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same_example(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def read_all(it):
    with it:
        return [example for batch in it for example in batch]


def test_a_labeled_image_dataset_yields_its_own_examples(image_source, staging):
    dataset = datasets.LabeledImageDataset(pngs(), root=image_source)
    got = read_all(StagingIterator(dataset, 4, repeat=False, shuffle=False, config=staging))
    assert len(got) == IMAGES
    assert all(same_example(g, dataset[i]) for i, g in enumerate(got))
    assert got[0][0].dtype == np.float32 and got[0][1].dtype == np.int32 and got[0][0].shape == (3, 5, 6)


def test_with_staging_off_the_source_files_are_decoded(image_source, staging):
    dataset = datasets.LabeledImageDataset(pngs(), root=image_source)
    staging["staging"]["enabled"] = False
    got = read_all(StagingIterator(dataset, 4, repeat=False, shuffle=False, config=staging))
    assert len(got) == IMAGES and all(same_example(g, dataset[i]) for i, g in enumerate(got))


def test_minibatches_match_multiprocess_iterator_over_the_same_dataset(image_source, staging):
    dataset = datasets.LabeledImageDataset(pngs(), root=image_source)
    sampler = chainer.iterators.ShuffleOrderSampler
    theirs = chainer.iterators.MultiprocessIterator(dataset, 4, n_processes=2,
                                                   order_sampler=sampler(np.random.RandomState(5)))
    with StagingIterator(dataset, 4, order_sampler=sampler(np.random.RandomState(5)), config=staging) as ours:
        try:
            for step in range(20):  # across two epoch boundaries
                mine, reference = ours.next(), theirs.next()
                assert len(mine) == len(reference) and all(map(same_example, mine, reference)), f"batch {step}"
                assert (ours.epoch, ours.current_position, ours.is_new_epoch) == \
                    (theirs.epoch, theirs.current_position, theirs.is_new_epoch)
        finally:
            theirs.finalize()


def test_the_files_are_staged_to_local_storage(image_source, staging, tmp_path):
    dataset = datasets.LabeledImageDataset(pngs(), root=image_source)
    staging["staging"]["keep"] = True
    read_all(StagingIterator(dataset, 8, repeat=False, config=staging))
    local = tmp_path / "local"
    staged = {os.path.relpath(os.path.join(d, f), os.path.join(local, job))
              for job in os.listdir(local) for d, _, files in os.walk(local / job) for f in files}
    assert {path for path, _ in pngs()} <= staged


def test_an_image_dataset_of_jpegs_yields_its_own_examples(image_source, staging):
    dataset = datasets.ImageDataset([f"c{i % 3}/{i}.jpg" for i in range(IMAGES)], root=image_source,
                                    dtype=np.uint8)
    got = read_all(StagingIterator(dataset, 7, repeat=False, shuffle=False, config=staging))
    assert len(got) == IMAGES and all(same_example(g, dataset[i]) for i, g in enumerate(got))
    assert got[0].shape == (1, 7, 4) and got[0].dtype == np.uint8


def test_transform_and_split_datasets_are_staged_through(image_source, staging):
    base = datasets.LabeledImageDataset(pngs(), root=image_source)
    train, _ = datasets.split_dataset_random(base, 20, seed=3)
    dataset = datasets.TransformDataset(train, lambda example: (example[0] / 255.0, example[1] + 10))
    got = read_all(StagingIterator(dataset, 6, repeat=False, shuffle=False, config=staging))
    assert len(got) == 20 and all(same_example(g, dataset[i]) for i, g in enumerate(got))


class RawFiles(chainer.dataset.DatasetMixin):
    """A dataset of the same shape as ImageDataset (``_paths`` under ``_root``) with its own decoding."""

    def __init__(self, paths, root):
        self._paths, self._root = paths, root

    def __len__(self):
        return len(self._paths)

    def get_example(self, i):
        with open(os.path.join(self._root, self._paths[i]), "rb") as fh:
            return {"name": os.path.basename(self._paths[i]), "bytes": fh.read()}


def test_any_dataset_keeping_paths_and_root_is_staged(image_source, staging):
    dataset = RawFiles([f"c{i % 3}/{i}.png" for i in range(IMAGES)], image_source)
    got = read_all(StagingIterator(dataset, 5, repeat=False, shuffle=False, config=staging))
    assert got == [dataset[i] for i in range(IMAGES)]


def test_paths_outside_the_root_are_staged_from_a_common_root(image_source, staging):
    sub = os.path.join(image_source, "c1")
    pairs = [("../c0/0.png", 0), (os.path.join(image_source, "c2", "2.png"), 2), ("1.png", 1)]
    dataset = datasets.LabeledImageDataset(pairs, root=sub)
    got = read_all(StagingIterator(dataset, 2, repeat=False, shuffle=False, config=staging))
    assert all(same_example(g, dataset[i]) for i, g in enumerate(got)) and len(got) == 3


def test_config_may_be_a_config_object_and_its_source_is_replaced(image_source, tmp_path):
    dataset = datasets.LabeledImageDataset(pngs(), root=image_source)
    config = config_from_dict({"dataset": {"source": "/nonexistent"}, "staging": {"local_dir": str(tmp_path)}})
    with StagingIterator(dataset, 4, n_processes=1, config=config) as it:
        assert it.config.dataset.source == os.path.abspath(image_source) and it.config.reader.workers == 1
        assert len(it.next()) == 4


def test_a_pickled_dataset_iterator_continues_with_the_same_minibatches(image_source, staging):
    dataset = datasets.LabeledImageDataset(pngs(), root=image_source)
    with StagingIterator(dataset, 4, config=staging) as it:
        for _ in range(3):
            it.next()
        with pickle.loads(pickle.dumps(it)) as clone:
            for _ in range(10):
                assert all(map(same_example, clone.next(), it.next()))


@pytest.mark.parametrize("make", [
    lambda root: [(np.zeros(3, np.float32), 0)] * 4,
    lambda root: datasets.TupleDataset(np.zeros((4, 3), np.float32), np.arange(4)),
    lambda root: np.zeros((4, 3), np.float32),
    lambda root: datasets.TransformDataset([1, 2, 3], lambda x: x),
], ids=["list", "TupleDataset", "ndarray", "TransformDataset-of-list"])
def test_an_in_memory_dataset_is_refused_naming_multiprocess_iterator(image_source, make):
    with pytest.raises(TypeError, match="stages files.*MultiprocessIterator"):
        StagingIterator(make(image_source), 4)


def test_a_zipped_image_dataset_is_refused(image_source, tmp_path):
    archive = tmp_path / "images.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(os.path.join(image_source, "c0", "0.png"), "0.png")
    with pytest.raises(TypeError, match="MultiprocessIterator"):
        StagingIterator(datasets.ZippedImageDataset(str(archive)), 4)


def test_a_missing_file_is_named_at_construction(image_source, staging):
    dataset = datasets.LabeledImageDataset(pngs() + [("c0/missing.png", 0)], root=image_source)
    with pytest.raises(FileNotFoundError, match=f"example {IMAGES}: .*missing.png"):
        StagingIterator(dataset, 4, config=staging)


def test_a_file_listed_with_two_labels_is_refused(image_source, staging):
    dataset = datasets.LabeledImageDataset(pngs() + [("c0/0.png", 2)], root=image_source)
    with pytest.raises(ValueError, match="c0/0.png.*labels"):
        StagingIterator(dataset, 4, config=staging)
