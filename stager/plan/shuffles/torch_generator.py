"""PyTorch's own shuffled order over a seeded generator, epoch after epoch.

``RandomSampler(dataset, generator=torch.Generator().manual_seed(s))`` draws
each epoch's order from its one generator: a ``torch.randperm(n)`` that it
yields, then a second one (the empty tail of ``num_samples % n``) once the
epoch is read to its end. ``DataLoader(dataset, shuffle=True,
generator=...)`` also draws its workers' base seed from that generator
(one int64) as each epoch's iterator starts, before the sampler's first
draw; with ``persistent_workers`` only the first epoch's iterator is new,
and only it draws. From a fresh generator seeded with ``seed``, both are pure functions
of (n, seed, epoch), so a single-process job keeps its exact order when it
moves to stager, as long as every epoch is read to its end (a loop that
breaks out of an epoch leaves PyTorch's generator elsewhere).

``SAMPLER`` is the first order (``plan.shuffle_algorithm: torch_sampler``),
``LOADER`` the second (``torch_loader``), ``PERSISTENT`` the third
(``torch_loader_persistent``). The generator's state before each
epoch is kept, so epoch e costs e + 1 epochs of draws once, and one after.
Materialises the epoch; torch is imported only when these orders are used.
"""

import functools

import numpy as np

from . import whole


EVERY, FIRST, NEVER = "every", "first", "never"  # which epochs begin with the loader's base-seed draw


@functools.lru_cache(maxsize=None)
def _state_before(n, seed, epoch, base_seed):
    """The generator's state before epoch ``epoch`` draws (from the previous epoch's, cached)."""
    import torch  # deferred: only runs that ask for torch's order pay for the import

    generator = torch.Generator()
    if epoch == 0:
        generator.manual_seed(seed)
    else:
        generator.set_state(_state_before(n, seed, epoch - 1, base_seed))
        _draw_epoch(n, generator, base_seed, epoch - 1)
        torch.randperm(n, generator=generator)  # the sampler's empty tail, drawn at the epoch's end
    return generator.get_state()


def _draw_epoch(n, generator, base_seed, epoch):
    import torch

    if base_seed == EVERY or (base_seed == FIRST and epoch == 0):
        torch.empty((), dtype=torch.int64).random_(generator=generator)
    return torch.randperm(n, generator=generator)


class GeneratorOrder:
    """The shuffle protocol (``forward``, ``inverse``, ``MATERIALISES``) for one of the two orders.

    Args:
        base_seed: Which epochs the loader's base-seed draw begins: ``EVERY``,
            ``FIRST`` (persistent workers) or ``NEVER`` (the sampler alone).
    """

    MATERIALISES = True

    def __init__(self, base_seed):
        self.base_seed = base_seed

    def permutation(self, n, seed, epoch):
        """The whole permutation of epoch ``epoch``, as PyTorch draws it."""
        import torch

        for earlier in range(epoch):  # in order, so that each state is one epoch from a cached one
            _state_before(n, seed, earlier, self.base_seed)
        generator = torch.Generator()
        generator.set_state(_state_before(n, seed, epoch, self.base_seed))
        return _draw_epoch(n, generator, self.base_seed, epoch).numpy().astype(np.int64, copy=False)

    def forward(self, n, seed, epoch):
        """Positions to samples, through the materialised permutation."""
        return whole.forward(self.permutation(n, seed, epoch))

    def inverse(self, n, seed, epoch):
        """Samples to positions, through the materialised inverse permutation."""
        return whole.inverse(self.permutation(n, seed, epoch))


SAMPLER = GeneratorOrder(NEVER)
LOADER = GeneratorOrder(EVERY)
PERSISTENT = GeneratorOrder(FIRST)
