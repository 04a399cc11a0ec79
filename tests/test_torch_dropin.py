"""StagedLoader as a drop-in for DataLoader: real torchvision datasets and transforms over real JPEG files.

Every comparison is against PyTorch's own DataLoader over the same dataset
object: the samples must be the dataset's, tensor for tensor.
"""

import gc
import json
import os
import random
import tempfile
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import (ConcatDataset, DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler,
                              Subset, TensorDataset)

from iterators.pytorch import StagedLoader  # first: it makes torchvision importable beside a CPU-only torch
from stager import plan
from stager.errors import StageError
from stager.slowfs import SlowFS
from stager.world import World

torchvision = pytest.importorskip("torchvision")
from torchvision import transforms as T  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

CLASSES, PER_CLASS = 3, 14
FIXED = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
RANDOM = T.Compose([T.RandomResizedCrop(16, scale=(0.3, 1.0)), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4),
                    T.ToTensor()])


def write_jpegs(root, classes=CLASSES, per_class=PER_CLASS, seed=0):
    """An ImageFolder tree of real JPEG files of varying sizes (written by PIL, read back by PIL)."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c}"), exist_ok=True)
        for i in range(per_class):
            h, w = int(rng.integers(24, 40)), int(rng.integers(24, 40))
            pixels = (rng.random((h, w, 3)) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(root, f"class{c}", f"{i:03d}.jpg"), quality=85)
    return root


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return write_jpegs(str(tmp_path_factory.mktemp("jpegs") / "train"))


@pytest.fixture
def staging(tmp_path):
    return {"staging": {"local_dir": str(tmp_path / "local"), "prefetchers": 2},
            "processes": {"shutdown_timeout_s": 10.0}}


def batches(loader):
    return [[t.clone() if isinstance(t, torch.Tensor) else t for t in b] for b in loader]


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert torch.equal(a, b)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_unshuffled_batches_equal_dataloaders_tensor_for_tensor(jpegs, staging, workers):
    ds = ImageFolder(jpegs, transform=FIXED)
    want = batches(DataLoader(ds, batch_size=5, shuffle=False))
    with StagedLoader(ds, batch_size=5, shuffle=False, num_workers=workers, config=staging) as loader:
        assert len(loader) == len(want) == 9
        assert_same_batches(batches(loader), want)
        assert loader.dataset is ds and loader.batch_size == 5


def tagged_collate(samples):
    """``default_collate``, with where it ran: the process, and the worker it was told it is."""
    info = torch.utils.data.get_worker_info()
    return (torch.utils.data.default_collate(samples), os.getpid(),
            None if info is None else (info.id, info.num_workers))


def failing_collate(samples):
    """Fails on the one minibatch that starts at sample 15: the fourth, five samples each, unshuffled."""
    if samples[0][2] == 15:
        raise ValueError("no sample 15 here")
    return torch.utils.data.default_collate(samples)


def test_collate_fn_runs_in_the_readers_as_in_dataloaders_workers(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    theirs = list(DataLoader(ds, batch_size=5, num_workers=2, collate_fn=tagged_collate))
    with StagedLoader(ds, batch_size=5, num_workers=2, collate_fn=tagged_collate, config=staging) as loader:
        ours = [([t.clone() for t in b], pid, info) for b, pid, info in loader]
        readers = {proc.pid for proc in loader._pipe._ch.readers.procs}
    assert_same_batches([b for b, _, _ in ours], [b for b, _, _ in theirs])
    for got in (ours, theirs):
        assert all(pid != os.getpid() and info[1] == 2 and info[0] in (0, 1) for _, pid, info in got)
    assert {pid for _, pid, _ in ours} <= readers


def test_a_failing_collate_fn_names_the_minibatch_after_delivering_those_before(jpegs, staging, tmp_path,
                                                                                monkeypatch):
    # One minibatch only fails: with two, a reader may report the later one first, and either is a right answer.
    ds = Files(sorted(os.path.join(dp, f) for dp, _, fs in os.walk(jpegs) for f in fs))

    def count(loader):
        got = []
        with pytest.raises(Exception) as info:
            for b in loader:
                got.append(b)
        error = info.value
        error.__traceback__ = None  # its frames hold DataLoader's iterator, whose collection ends its workers
        return len(got), error

    # DataLoader's workers, ended after the error, leave the directories of the listeners through which
    # they handed tensors over (multiprocessing's pymp-*): here they land in the test's own directory.
    with monkeypatch.context() as m:
        m.setattr(tempfile, "tempdir", str(tmp_path))
        theirs, their_error = count(DataLoader(ds, batch_size=5, num_workers=2, collate_fn=failing_collate))
        gc.collect()
    with StagedLoader(ds, batch_size=5, num_workers=2, collate_fn=failing_collate, config=staging) as loader:
        ours, error = count(loader)
    # DataLoader raises in the failing minibatch's turn; stager as soon as the reader reports it.
    assert theirs == 3 and isinstance(their_error, ValueError) and ours <= theirs
    assert isinstance(error, StageError) and (error.stage, error.epoch, error.step) == ("read", 0, 3)
    assert "collating minibatch 3 of epoch 0 (5 samples) with collate_fn failing_collate: ValueError: no sample 15 " \
           "here" in str(error)


def test_each_shuffled_epoch_holds_the_datasets_samples_once(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    every = sorted((ds[i][0].numpy().tobytes(), ds[i][1]) for i in range(len(ds)))
    with StagedLoader(ds, batch_size=4, shuffle=True, num_workers=2, config=staging) as loader:
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = [(x.numpy().tobytes(), int(y)) for images, labels in loader for x, y in zip(images, labels)]
            assert sorted(seen) == every
            epochs.append(seen)
        assert epochs[0] != epochs[1], "each epoch must have its own order"
        assert loader.stats.files_staged == len(ds), "the second epoch reads the files staged in the first"


def test_the_order_is_distributed_samplers_for_the_seed(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    torch.manual_seed(1234)  # no generator of its own: the seed is torch's, the order DistributedSampler's
    with StagedLoader(ds, batch_size=4, shuffle=True, config=staging) as loader:
        loader.set_epoch(3)
        got = batches(loader)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=1234)
    sampler.set_epoch(3)
    assert_same_batches(got, batches(DataLoader(ds, batch_size=4, sampler=sampler)))


def test_random_transforms_differ_by_epoch_and_repeat_for_the_seed_whatever_the_readers(jpegs, staging):
    ds = ImageFolder(jpegs, transform=RANDOM)
    runs = []
    for workers in (1, 3):
        torch.manual_seed(77)  # the default generator's seed: the loader's seed when no generator is given
        with StagedLoader(ds, batch_size=6, shuffle=False, num_workers=workers, config=staging) as loader:
            runs.append([batches(loader) for _ in range(2)])  # epochs 0 and 1
    assert_same_batches(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1])
    first, second = runs[0]
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, second)), "epoch 1 drew the same augmentations"
    plain = ImageFolder(jpegs, transform=T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))
    assert first[0][0].shape == torch.stack([plain[i][0] for i in range(6)]).shape
    assert torch.equal(first[0][1], torch.tensor([plain[i][1] for i in range(6)]))


class Files(Dataset):
    """A dataset of our own through the protocol: raw bytes and the file's length as its label."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def stager_path(self, index):
        return self.paths[index]

    def stager_load(self, path, index):
        with open(path, "rb") as fh:
            data = fh.read()
        info = torch.utils.data.get_worker_info()
        return torch.frombuffer(bytearray(data[:64]), dtype=torch.uint8), len(data), index, \
            -1 if info is None else info.id, -1 if info is None else info.num_workers, \
            int(os.environ.get("STAGER_TEST_INIT", "-1"))

    def __getitem__(self, index):
        return self.stager_load(self.stager_path(index), index)


def _init(worker):
    os.environ["STAGER_TEST_INIT"] = str(100 + worker)


def test_subset_concat_and_the_protocol_equal_dataloaders(jpegs, staging):
    folder = ImageFolder(jpegs, transform=FIXED)
    mine = Files(sorted(os.path.join(dp, f) for dp, _, fs in os.walk(jpegs) for f in fs))
    for ds in (Subset(folder, [5, 3, 40, 3, 11]), ConcatDataset([Subset(folder, range(10, 20)), folder])):
        with StagedLoader(ds, batch_size=4, config=staging) as loader:
            assert_same_batches(batches(loader), batches(DataLoader(ds, batch_size=4)))
    with StagedLoader(mine, batch_size=4, num_workers=2, worker_init_fn=_init, config=staging) as loader:
        got = list(loader)
    want = list(DataLoader(mine, batch_size=4))
    for g, w in zip(got, want):
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) and torch.equal(g[2], w[2])
        # Inside stager's readers: DataLoader's worker info (2 readers) and worker_init_fn ran before the sample.
        assert set(g[3].tolist()) <= {0, 1} and set(g[4].tolist()) == {2}
        assert torch.equal(g[5], g[3] + 100)


def test_a_distributed_sampler_is_honoured_and_set_epoch_reaches_the_plan(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    for rank in range(2):
        world = World(rank=rank, size=2, node=f"n{rank}", node_index=rank, nodes=2)
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=9)
        with StagedLoader(ds, batch_size=4, sampler=sampler, config=staging, world=world) as loader:
            for epoch in (0, 1, 1):
                sampler.set_epoch(epoch)
                reference = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=9)
                reference.set_epoch(epoch)
                assert_same_batches(batches(loader), batches(DataLoader(ds, batch_size=4, sampler=reference)))


@pytest.mark.parametrize("remainder", [False, True])
def test_elastic_resume_of_the_dataset_form_from_4_ranks_to_2(jpegs, staging, remainder):
    ds = ImageFolder(jpegs, transform=FIXED)
    key = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}

    def world(rank, size):
        return World(rank=rank, size=size, node=f"n{rank}", node_index=rank, nodes=size)

    def loader(rank, size):
        sampler = DistributedSampler(ds, num_replicas=size, rank=rank, seed=4, drop_last=remainder)
        return StagedLoader(ds, batch_size=2, sampler=sampler, config=staging, world=world(rank, size))

    done, states = [], []
    for rank in range(4):
        with loader(rank, 4) as each:
            it = iter(each)
            done.append([[key[x.numpy().tobytes()] for x in next(it)[0]] for _ in range(3)])
            states.append(each.state_dict())
    assert len({(s["epoch"], s["position"]) for s in states}) == 1 and states[0]["position"] == 3 * 2 * 4
    rest = []
    for rank in range(2):
        with loader(rank, 2) as each:
            each.load_state_dict(states[0])
            rest.append([[key[x.numpy().tobytes()] for x in b[0]] for b in each])
    before = [i for s in range(3) for r in range(4) for i in done[r][s]]
    after = [i for s in range(len(rest[0])) for r in range(2) for i in rest[r][s]]
    order = plan.permutation(len(ds), 4, 0, algorithm="torch").tolist()
    # The strided split reads the same global positions in another arrangement; position by position the
    # global order continues where it stood.
    assert sorted(before) == sorted(order[:len(before)])
    left = order[len(before):]
    assert sorted(after[:len(left)]) == sorted(left[:len(after)])
    assert len(set(before + after)) == (len(ds) if not remainder else len(before) + len(after))


def test_a_killed_reader_ends_the_epoch_with_an_error_naming_it(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    with StagedLoader(ds, batch_size=2, num_workers=2, config=staging) as loader:
        it = iter(loader)
        next(it)
        reader = loader._pipe._ch.readers.procs[0]
        reader.kill()
        with pytest.raises(StageError, match=r"stager-read-0 \(pid \d+\) died"):
            for _ in it:
                pass


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


@pytest.mark.parametrize("dataset,match", [
    (TensorDataset(torch.zeros(4, 2)), "TensorDataset holds its samples in memory"),
    ([1, 2, 3], "list is not a torch Dataset"),
    (Stream(), "Stream is an IterableDataset"),
])
def test_datasets_without_files_are_refused_pointing_to_dataloader(dataset, match):
    with pytest.raises(TypeError, match=match) as caught:
        StagedLoader(dataset, batch_size=2)
    assert "use torch.utils.data.DataLoader" in str(caught.value)


def test_accepted_arguments_mean_what_the_readme_says(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = StagedLoader(ds, batch_size=None, shuffle=False, sampler=None, num_workers=2, pin_memory=True,
                              prefetch_factor=3, persistent_workers=True, in_order=False,
                              multiprocessing_context="fork", config=staging)
    assert any("no accelerator is found" in str(w.message) for w in caught)  # as DataLoader says on a CPU
    with loader:
        assert loader.config.reader.workers == 2 and loader.config.reader.ahead == 6
        singles = list(loader)
    assert len(singles) == len(ds)
    assert torch.equal(singles[7][0], ds[7][0]) and singles[7][1] == ds[7][1]


def test_a_state_without_a_chosen_seed_resumes_with_the_saved_one(jpegs, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    torch.manual_seed(5)
    with StagedLoader(ds, batch_size=4, shuffle=True, config=staging) as loader:
        it = iter(loader)
        first = [next(it) for _ in range(3)]
        state = loader.state_dict()
        rest = list(it)
    torch.manual_seed(6)  # a script that did not fix the seed: another one at each start
    with StagedLoader(ds, batch_size=4, shuffle=True, config=staging) as loader:
        loader.load_state_dict(state)
        resumed = list(loader)
    assert state["seed"] == 5 and len(first) == 3
    assert_same_batches(resumed, rest)


def test_a_batch_that_does_not_come_in_time_is_a_timeout_as_in_dataloader(jpegs, tmp_path, staging):
    ds = ImageFolder(jpegs, transform=FIXED)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with SlowFS(jpegs, str(mnt), open_ms=4000.0, mbps=0) as slow:
        behind = ImageFolder(slow, transform=FIXED)
        with StagedLoader(behind, batch_size=2, timeout=0.5, config=staging) as loader:
            with pytest.raises(RuntimeError, match=r"StagedLoader timed out after 0.5 seconds"):
                next(iter(loader))
    assert len(behind) == len(ds)


def test_the_config_form_still_works_and_takes_dataloader_arguments(dataset, tmp_path):
    root, _ = dataset
    config = {"dataset": {"source": root, "manifest": "manifest.tsv"}, "plan": {"batch_size": 8},
              "staging": {"local_dir": str(tmp_path / "local")}}
    with StagedLoader(config, 5, shuffle=False, num_workers=3) as loader:
        assert loader.config.plan.batch_size == 5 and loader.config.reader.workers == 3
        data, labels = next(iter(loader))
        assert data.shape[0] == 5
    with pytest.raises(TypeError, match="pass the collate function as collate_fn="):
        StagedLoader(config, lambda b: b)


def test_random_python_and_numpy_draws_are_seeded_per_sample_too(jpegs, staging):
    class Draws(Files):
        def stager_load(self, path, index):
            return torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(1))])

    draws = Draws(sorted(os.path.join(dp, f) for dp, _, fs in os.walk(jpegs) for f in fs)[:8])
    runs = []
    for workers in (1, 2):
        with StagedLoader(draws, batch_size=4, num_workers=workers, generator=torch.Generator().manual_seed(3),
                          config=staging) as loader:
            runs.append(torch.cat([b for b in loader]))
    assert torch.equal(runs[0], runs[1])
    assert len({tuple(row.tolist()) for row in runs[0]}) == 8  # every sample its own stream


def test_torchrun_ranks_read_their_distributed_sampler_shares_and_the_node_reads_each_file_once(tmp_path):
    from helpers.opens import Opens
    from test_torchrun import agents

    root = write_jpegs(str(tmp_path / "train"), per_class=11)  # 33 samples: 2 ranks pad one
    out = tmp_path / "out"
    out.mkdir()
    script = os.path.join(os.path.dirname(__file__), "helpers", "ddp_dropin.py")
    with Opens(root) as opens:
        [(rc, output)] = agents(tmp_path, [script, root, str(tmp_path / "local"), str(out)], nproc=2)
        assert rc == 0, output
        counts = opens.count()
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    for epoch in ("0", "1"):
        for r in range(2):  # what DistributedSampler and DataLoader give that rank, batch for batch
            assert ranks[r]["got"][epoch] == ranks[r]["want"][epoch]
        read = [i for r in range(2) for b in ranks[r]["got"][epoch] for i in b]
        assert sorted(set(read)) == list(range(33)) and len(read) == 34  # the epoch, one sample padded
    assert ranks[0]["got"]["0"] != ranks[0]["got"]["1"], "set_epoch must reach the plan"
    files = sorted(os.path.relpath(os.path.join(dp, f), root) for dp, _, fs in os.walk(root) for f in fs)
    assert dict(counts) == {f: 1 for f in files}, "each file is read from the source once for the node"
    assert ranks[0]["files_staged"] == 33
    assert os.listdir(tmp_path / "local") == []


class Indices(Files):
    """Each sample is its index (the file is still staged and read): orders compare without decoding images."""

    def stager_load(self, path, index):
        with open(path, "rb") as fh:
            fh.read()
        return index

    def __getitem__(self, index):
        return index


@pytest.mark.parametrize("arguments", [
    dict(shuffle=True, generator="g"),
    dict(shuffle=True, generator="g", num_workers=2, persistent_workers=True, drop_last=True),
    dict(shuffle=True, generator="g", num_workers=2),
    dict(sampler="random sampler"),
    dict(sampler="random sampler", num_workers=1, persistent_workers=True),
], ids=["loader generator", "persistent workers", "workers", "sampler generator", "sampler, persistent"])
def test_one_process_with_a_seeded_generator_reads_dataloaders_own_order_epoch_by_epoch(jpegs, staging, arguments):
    paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(jpegs) for f in fs)
    ds = Indices(paths)

    def make(cls, **extra):
        given = dict(arguments)
        if given.get("generator") == "g":
            given["generator"] = torch.Generator().manual_seed(11)
        if given.get("sampler") == "random sampler":
            given["sampler"] = RandomSampler(ds, generator=torch.Generator().manual_seed(11))
        return cls(ds, batch_size=4, **given, **extra)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the worker-count advice on 2 cores
        theirs = make(DataLoader)
        want = [[b.tolist() for b in theirs] for _ in range(3)]
        with make(StagedLoader, config=staging) as ours:
            got = [[b.tolist() for b in ours] for _ in range(3)]
    assert got == want
    assert len({tuple(i for b in epoch for i in b) for epoch in got}) == 3
