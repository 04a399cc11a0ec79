"""DataLoader's argument rules, rule by rule, against StagedLoader: the same outcome for the same arguments.

Each row is given to ``torch.utils.data.DataLoader`` and to ``StagedLoader``
over the same ImageFolder. Where DataLoader refuses, StagedLoader must refuse
with the same error type and message; where it accepts, StagedLoader must
accept and show DataLoader's values for the attributes both have. The rows
that stager must refuse although DataLoader accepts them (an order only the
sampler knows, samples with no file) are a table of their own, each refused
at construction with a message naming the argument and what to use.
"""

import multiprocessing
import os
import warnings

import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler,
                              SequentialSampler, SubsetRandomSampler, TensorDataset, WeightedRandomSampler)

from iterators.pytorch import StagedLoader
from test_torch_dropin import write_jpegs

torchvision = pytest.importorskip("torchvision")
from torchvision.datasets import ImageFolder  # noqa: E402

N = 12  # samples in the dataset below


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return ImageFolder(write_jpegs(str(tmp_path_factory.mktemp("rules") / "train"), classes=2, per_class=6))


def collate(batch):
    return batch


def init(worker):
    pass


# (name, keyword arguments as a function of the dataset): DataLoader decides the outcome.
ROWS = [
    ("defaults", lambda ds: {}),
    ("num_workers negative", lambda ds: dict(num_workers=-1)),
    ("timeout negative", lambda ds: dict(timeout=-1)),
    ("timeout positive", lambda ds: dict(timeout=5.0)),
    ("prefetch_factor without workers", lambda ds: dict(prefetch_factor=2)),
    ("prefetch_factor negative", lambda ds: dict(num_workers=2, prefetch_factor=-1)),
    ("prefetch_factor zero", lambda ds: dict(num_workers=2, prefetch_factor=0)),
    ("prefetch_factor default with workers", lambda ds: dict(num_workers=2)),
    ("prefetch_factor given", lambda ds: dict(num_workers=2, prefetch_factor=3)),
    ("persistent_workers without workers", lambda ds: dict(persistent_workers=True)),
    ("persistent_workers with workers", lambda ds: dict(num_workers=1, persistent_workers=True)),
    ("shuffle true", lambda ds: dict(shuffle=True)),
    ("shuffle false", lambda ds: dict(shuffle=False)),
    ("sampler with shuffle true", lambda ds: dict(sampler=SequentialSampler(ds), shuffle=True)),
    ("sampler with shuffle false", lambda ds: dict(sampler=SequentialSampler(ds), shuffle=False)),
    ("sampler with shuffle none", lambda ds: dict(sampler=SequentialSampler(ds))),
    ("random sampler", lambda ds: dict(sampler=RandomSampler(ds))),
    ("distributed sampler with shuffle false", lambda ds: dict(
        sampler=DistributedSampler(ds, num_replicas=1, rank=0), shuffle=False)),
    ("distributed sampler with shuffle true", lambda ds: dict(
        sampler=DistributedSampler(ds, num_replicas=1, rank=0), shuffle=True)),
    ("sampler with drop_last", lambda ds: dict(sampler=SequentialSampler(ds), drop_last=True, batch_size=5)),
    ("batch_sampler with batch_size", lambda ds: dict(batch_sampler=BatchSampler(SequentialSampler(ds), 2, False),
                                                      batch_size=4)),
    ("batch_sampler with shuffle", lambda ds: dict(batch_sampler=BatchSampler(SequentialSampler(ds), 2, False),
                                                   shuffle=True)),
    ("batch_sampler with sampler", lambda ds: dict(batch_sampler=BatchSampler(SequentialSampler(ds), 2, False),
                                                   sampler=SequentialSampler(ds))),
    ("batch_sampler with drop_last", lambda ds: dict(batch_sampler=BatchSampler(SequentialSampler(ds), 2, False),
                                                     drop_last=True)),
    ("batch_size none", lambda ds: dict(batch_size=None)),
    ("batch_size none shuffled", lambda ds: dict(batch_size=None, shuffle=True)),
    ("batch_size none with drop_last", lambda ds: dict(batch_size=None, drop_last=True)),
    ("batch_size zero", lambda ds: dict(batch_size=0)),
    ("batch_size negative", lambda ds: dict(batch_size=-3)),
    ("batch_size bool", lambda ds: dict(batch_size=True)),
    ("batch_size float", lambda ds: dict(batch_size=2.5)),
    ("drop_last not a bool", lambda ds: dict(batch_size=5, drop_last="yes")),
    ("drop_last", lambda ds: dict(batch_size=5, drop_last=True)),
    ("collate_fn", lambda ds: dict(collate_fn=collate)),
    ("collate_fn default unbatched", lambda ds: dict(batch_size=None)),
    ("worker_init_fn", lambda ds: dict(num_workers=1, worker_init_fn=init)),
    ("context name without workers", lambda ds: dict(multiprocessing_context="fork")),
    ("context name unknown", lambda ds: dict(num_workers=2, multiprocessing_context="threads")),
    ("context name", lambda ds: dict(num_workers=2, multiprocessing_context="fork")),
    ("context object", lambda ds: dict(num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"))),
    ("context of another type", lambda ds: dict(num_workers=2, multiprocessing_context=3)),
    ("generator", lambda ds: dict(shuffle=True, generator=torch.Generator().manual_seed(4))),
    ("pin_memory_device", lambda ds: dict(pin_memory_device="cpu")),
    ("in_order false", lambda ds: dict(num_workers=1, in_order=False)),
]

# What DataLoader and StagedLoader both expose with DataLoader's meaning.
ATTRIBUTES = ("batch_size", "drop_last", "num_workers", "prefetch_factor", "persistent_workers", "timeout",
              "collate_fn", "worker_init_fn", "generator", "multiprocessing_context", "pin_memory_device",
              "in_order", "dataset")


def outcome(make):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the worker-count advice, the pin_memory note
            return make(), None
    except Exception as exc:  # noqa: BLE001: the row compares whatever each raises
        return None, exc


@pytest.mark.parametrize("name,arguments", ROWS, ids=[r[0] for r in ROWS])
def test_each_rule_has_dataloaders_outcome(ds, tmp_path, name, arguments):
    staging = {"staging": {"local_dir": str(tmp_path / "local")}}
    given = arguments(ds)  # one set of objects (samplers, generators) for both
    theirs, their_error = outcome(lambda: DataLoader(ds, **given))
    ours, our_error = outcome(lambda: StagedLoader(ds, config=staging, **given))
    if their_error is not None:
        assert type(our_error) is type(their_error), f"{name}: DataLoader raised {their_error!r}, ours {our_error!r}"
        assert str(our_error) == str(their_error)
        return
    assert our_error is None, f"{name}: DataLoader accepts it, StagedLoader raised {our_error!r}"
    with ours:
        for attribute in ATTRIBUTES:
            assert getattr(ours, attribute) == getattr(theirs, attribute), f"{name}: {attribute}"
        assert len(ours) == len(theirs)


def test_the_table_covers_dataloaders_refusals_and_acceptances(ds):
    refused = [name for name, arguments in ROWS if outcome(lambda: DataLoader(ds, **arguments(ds)))[1]]
    assert 10 <= len(refused) <= len(ROWS) - 10, refused


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


class OtherRank(DistributedSampler):
    """A DistributedSampler built for another world than the loader's."""

    def __init__(self, ds):
        super().__init__(ds, num_replicas=2, rank=1)


# (name, dataset maker, arguments, error type, words the message must hold): DataLoader accepts each.
STAGER_REFUSES = [
    ("batch_sampler", None, lambda ds: dict(batch_sampler=BatchSampler(SequentialSampler(ds), 2, False)),
     TypeError, ["batch_sampler", "use batch_size, shuffle and drop_last"]),
    ("weighted sampler", None, lambda ds: dict(sampler=WeightedRandomSampler([1.0] * N, N)),
     TypeError, ["WeightedRandomSampler", "use DataLoader"]),
    ("random sampler with replacement", None, lambda ds: dict(sampler=RandomSampler(ds, replacement=True)),
     TypeError, ["RandomSampler", "Subset"]),
    ("random sampler of a part", None, lambda ds: dict(sampler=RandomSampler(ds, num_samples=5)),
     TypeError, ["RandomSampler", "Subset"]),
    ("subset random sampler", None, lambda ds: dict(sampler=SubsetRandomSampler(range(4))),
     TypeError, ["SubsetRandomSampler", "Subset"]),
    ("a sampler of another world", None, lambda ds: dict(sampler=OtherRank(ds)),
     ValueError, ["rank 1 of 2", "leave it out"]),
    ("an IterableDataset", Stream, lambda ds: {}, TypeError, ["IterableDataset", "use torch.utils.data.DataLoader"]),
    ("samples held in memory", lambda: TensorDataset(torch.zeros(N, 2)), lambda ds: {},
     TypeError, ["in memory", "use torch.utils.data.DataLoader"]),
]


@pytest.mark.parametrize("name,dataset,arguments,kind,words", STAGER_REFUSES, ids=[r[0] for r in STAGER_REFUSES])
def test_what_stager_cannot_stage_is_refused_at_construction_saying_what_to_use(ds, tmp_path, name, dataset,
                                                                                arguments, kind, words):
    data = dataset() if dataset is not None else ds
    DataLoader(data, **arguments(ds))  # DataLoader takes it: the refusal is stager's own
    with pytest.raises(kind) as caught:
        StagedLoader(data, config={"staging": {"local_dir": str(tmp_path / "local")}}, **arguments(ds))
    for word in words:
        assert word in str(caught.value)
    assert not os.path.exists(tmp_path / "local"), "a refused loader stages nothing"
