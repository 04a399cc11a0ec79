"""Epoch permutations chosen by name (``plan.shuffle_algorithm``).

Each algorithm is a module with two pure functions of ``(n, seed, epoch)``:

- ``forward(n, seed, epoch)`` returns a function mapping positions of the
  epoch's order (int64 array) to the catalog indices read there;
- ``inverse(n, seed, epoch)`` returns a function mapping catalog indices to
  their positions: when in the epoch each sample is read.

and a flag ``MATERIALISES``: whether those functions hold the whole epoch
(cost linear in ``n``) or evaluate each position on its own (cost linear in
the positions asked for). ``identity`` is the unshuffled order; ``torch``
is ``DistributedSampler``'s (``torch.randperm`` seeded with seed + epoch);
``torch_sampler``, ``torch_loader`` and ``torch_loader_persistent`` are
``RandomSampler``'s and ``DataLoader(shuffle=True)``'s over a generator
seeded once (objects with the same two functions, ``torch_generator.py``);
``shards`` shuffles containers, then samples within a window of them: it
needs the catalog's containers, so a plan carries it bound to them
(``ShardShuffle``), an object with the same two functions, in place of the name.
"""

import numpy as np

from . import feistel, identity, pcg64, shards, torch_generator, torch_randperm
from .shards import ShardShuffle

SHUFFLES = {"pcg64": pcg64, "feistel": feistel, "identity": identity, "torch": torch_randperm,
            "torch_sampler": torch_generator.SAMPLER, "torch_loader": torch_generator.LOADER,
            "torch_loader_persistent": torch_generator.PERSISTENT, "shards": shards}
DEFAULT = "pcg64"


def algorithm(name, shuffle=True):
    """The module of shuffle ``name``; ``identity`` when ``shuffle`` is False.

    Args:
        name: A name in ``SHUFFLES``, or a bound shuffle (``ShardShuffle``).
        shuffle: False: the catalog order, whatever ``name`` says.

    Raises:
        ValueError: For a name not in ``SHUFFLES``.
    """
    if not shuffle:
        return identity
    if not isinstance(name, str):
        return name
    try:
        return SHUFFLES[name]
    except KeyError:
        raise ValueError(f"no shuffle algorithm {name!r}; known: {sorted(SHUFFLES)}") from None


def at(n, seed, epoch, positions, name=DEFAULT, shuffle=True):
    """The catalog indices read at ``positions`` of epoch ``epoch``'s permutation."""
    return algorithm(name, shuffle).forward(n, seed, epoch)(np.asarray(positions, dtype=np.int64))


def position_of(n, seed, epoch, indices, name=DEFAULT, shuffle=True):
    """The positions of epoch ``epoch``'s permutation at which ``indices`` are read."""
    return algorithm(name, shuffle).inverse(n, seed, epoch)(np.asarray(indices, dtype=np.int64))


__all__ = ["DEFAULT", "SHUFFLES", "ShardShuffle", "algorithm", "at", "position_of"]
