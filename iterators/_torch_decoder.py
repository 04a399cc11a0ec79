"""How stager's readers build a PyTorch dataset's sample from its staged file, as the dataset itself would.

``TorchDecoder`` runs in each reader: for a ``DatasetFolder`` it calls the
dataset's own ``__getitem__`` on a shallow copy whose sample names the staged
file; for a protocol dataset, its ``stager_load``. Every sample's random
transforms are seeded from (seed, epoch, index), and a pure loader's result
goes through the node's decoded tier (``staging.decoded``).
"""

import collections.abc
import copy
import random

import numpy as np
import torch
from torch.utils.data._utils import worker as torch_worker  # where get_worker_info() looks

from stager.formats import SampleDecoder

from ._torch_datasets import FOLDER, PROTOCOL, torchvision


class _Swapped(collections.abc.Sequence):
    """A dataset's ``samples`` with one entry replaced (by the staged file), the rest as they are."""

    def __init__(self, base, at, item):
        self.base, self.at, self.item = base, at, item

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        if isinstance(i, int) and (i == self.at or i + len(self.base) == self.at):
            return self.item
        return self.base[i]


def sample_seed(seed, epoch, index):
    """The seed of one sample's random transforms: a pure function of (seed, epoch, index).

    So a sample draws the same crop and flip in a run with any number of
    readers or prefetchers, and another one in the next epoch.
    """
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0])


def _seed_all(value):
    random.seed(value)
    np.random.seed(value % 2**32)
    # The CPU generator only: ``torch.manual_seed`` also queues a lazy seed of each accelerator's generators,
    # recording a formatted stack for each, about 1 ms a sample; a forked reader never uses an accelerator.
    torch.default_generator.manual_seed(value)


class TorchDecoder(SampleDecoder):
    """Decodes one staged file as the user's dataset decodes that sample.

    Before each sample, Python's, numpy's and torch's random generators are
    seeded from (seed, epoch, index) (``sample_seed``): random transforms
    are reproducible from the seed and independent of which reader decodes
    what. In each reader, ``start`` first does what a DataLoader worker
    does: one torch thread, ``torch.utils.data.get_worker_info()`` set
    (``id`` the reader's index, ``num_workers`` the readers at its start,
    ``seed`` the plan's seed plus ``id``, ``dataset`` the user's dataset),
    then ``worker_init_fn(id)``.

    Outside a reader (``auto`` counts probe a few files in the training
    process) the generators' states are restored after each sample, so the
    training process's random streams are left as they were.
    """

    def __init__(self, leaves, leaf_of, index_in, seed, worker_init_fn=None, dataset=None, collate=None,
                 pure_loader=False):
        self.leaves = leaves
        self.leaf_of = leaf_of
        self.index_in = index_in
        self.seed = seed
        self.worker_init_fn = worker_init_fn
        self.dataset = dataset
        self.collate = collate
        self._in_reader = False
        self._tier = None
        self.pure_loader = pure_loader

    def keeps_decoded(self):
        """Whether a dataset inside reads with a loader known to be pure (or a protocol dataset that can keep)."""
        return any(self._keeps(kind, dataset) for kind, dataset in self.leaves)

    def decoded_kind(self):
        """The kept records' kind: what each dataset inside keeps (its loader's, or a protocol dataset's class)."""
        kinds = set()
        for kind, dataset in self.leaves:
            if self._keeps(kind, dataset):
                what = dataset.loader if kind == FOLDER else type(dataset)
                kinds.add(f"{getattr(what, '__module__', '?')}.{getattr(what, '__qualname__', repr(what))}")
        return f"{type(self).__module__}.{type(self).__qualname__}({', '.join(sorted(kinds))})"

    def _keeps(self, kind, dataset):
        """Whether a dataset's samples go through the decoded tier: a pure loader, or a protocol dataset that can."""
        if kind == FOLDER:
            return self._pure(dataset.loader)
        return bool(getattr(dataset, "stager_keeps_decoded", False))

    def _pure(self, loader):
        """Whether ``loader``'s result depends on the file's bytes alone: torchvision's own, or declared so."""
        folder = torchvision.datasets.folder
        return self.pure_loader or loader is folder.default_loader or loader is folder.pil_loader

    def start(self, worker, workers):
        self._in_reader = True
        torch.set_num_threads(1)  # as DataLoader's workers: the readers are the parallelism
        seed = self.seed + worker
        _seed_all(seed)
        torch_worker._worker_info = torch_worker.WorkerInfo(id=worker, num_workers=workers, seed=seed,
                                                            dataset=self.dataset)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker)

    def decode(self, path, index, epoch):
        if not self._in_reader:
            states = random.getstate(), np.random.get_state(), torch.get_rng_state()
            try:
                return self._decode(path, index, epoch)
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
                torch.set_rng_state(states[2])
        return self._decode(path, index, epoch)

    def _decode(self, path, index, epoch):
        kind, dataset = self.leaves[self.leaf_of[index]]
        inner = int(self.index_in[index])
        _seed_all(sample_seed(self.seed, epoch, index))
        if kind == PROTOCOL:
            if self._tier is not None and self._keeps(kind, dataset):
                return dataset.stager_load(path, inner, tier=(self._tier, index))
            return dataset.stager_load(path, inner)
        one = copy.copy(dataset)  # its loader and transforms; its sample ``inner`` is the staged file
        one.samples = _Swapped(dataset.samples, inner, (path, dataset.samples[inner][1]))
        if hasattr(one, "imgs"):
            one.imgs = one.samples  # ImageFolder's alias
        if self._tier is not None and self._pure(dataset.loader):
            one.loader = _Kept(self._tier, index, dataset.loader)
        return one[inner]




class _Kept:
    """A pure loader, through the decoded tier: sample ``index``'s image from its kept copy, else decoded and kept."""

    def __init__(self, tier, index, load):
        self.tier, self.index, self.load = tier, index, load

    def __call__(self, path):
        return self.tier.load(self.index, path, self.load)
