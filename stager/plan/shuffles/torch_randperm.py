"""``torch.randperm`` from a generator seeded with ``seed + epoch``: ``DistributedSampler``'s order.

With ``plan.split: strided`` a rank reads exactly what ``DistributedSampler(
dataset, num_replicas, rank, shuffle=True, seed=seed)`` after
``set_epoch(epoch)`` gives it, so a PyTorch job keeps its sample order when
it moves to stager. Materialises the epoch (torch draws it whole); torch is
imported only when this order is used.
"""

import numpy as np

from . import whole

MATERIALISES = True


def permutation(n, seed, epoch):
    """The whole permutation of epoch ``epoch``, as ``DistributedSampler`` draws it."""
    import torch  # deferred: only runs that ask for torch's order pay for the import

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(n, generator=generator).numpy().astype(np.int64, copy=False)


def forward(n, seed, epoch):
    """Positions to samples, through the materialised permutation."""
    return whole.forward(permutation(n, seed, epoch))


def inverse(n, seed, epoch):
    """Samples to positions, through the materialised inverse permutation."""
    return whole.inverse(permutation(n, seed, epoch))
