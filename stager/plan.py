"""Stage 1: what order samples are read in, as pure functions.

Every function here depends only on its arguments: the sequence of minibatches
is a function of (seed, epoch, catalog size, batch settings) and never of the
number of prefetchers or readers, nor of timing. Any process can therefore
compute any part of the plan ahead of time, without talking to the others.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Minibatch:
    """One minibatch of the plan.

    Attributes:
        epoch: Epoch number, from 0.
        step: Index of the minibatch within its epoch, from 0.
        indices: Catalog indices of its samples, in delivery order.
    """

    epoch: int
    step: int
    indices: np.ndarray

    def __eq__(self, other):
        return (isinstance(other, Minibatch) and (self.epoch, self.step) == (other.epoch, other.step)
                and np.array_equal(self.indices, other.indices))

    def __hash__(self):
        return hash((self.epoch, self.step))


def permutation(n, seed, epoch, shuffle=True):
    """Returns the order of the ``n`` catalog indices for one epoch.

    The generator is seeded with (seed, epoch), so each epoch has its own
    permutation and every process that knows the seed computes the same one.

    Args:
        n: Number of samples.
        seed: Run seed.
        epoch: Epoch number.
        shuffle: False returns ``0..n-1``.
    """
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(n).astype(np.int64, copy=False)


def steps_per_epoch(n, batch_size, drop_last):
    """Number of minibatches in one epoch."""
    return n // batch_size if drop_last else -(-n // batch_size)


def epoch_minibatches(n, batch_size, seed, epoch, shuffle=True, drop_last=False):
    """Cuts one epoch's permutation into minibatch index arrays.

    Args:
        n: Number of samples.
        batch_size: Samples per minibatch.
        seed: Run seed.
        epoch: Epoch number.
        shuffle: Permute the epoch.
        drop_last: Drop a last minibatch shorter than ``batch_size``;
            otherwise it is delivered short.

    Returns:
        A list of int64 arrays.
    """
    order = permutation(n, seed, epoch, shuffle)
    count = steps_per_epoch(n, batch_size, drop_last)
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(count)]


def iterate(n, plan, start_epoch=0, start_step=0):
    """Yields the plan's minibatches from a position onwards.

    Args:
        n: Number of samples.
        plan: A ``PlanConfig`` (batch_size, epochs, seed, shuffle, drop_last);
            ``epochs == 0`` repeats without end.
        start_epoch: First epoch to yield.
        start_step: First minibatch within ``start_epoch``.

    Yields:
        Minibatch objects in delivery order.
    """
    epoch, step = start_epoch, start_step
    while plan.epochs == 0 or epoch < plan.epochs:
        batches = epoch_minibatches(n, plan.batch_size, plan.seed, epoch, plan.shuffle, plan.drop_last)
        if not batches:
            raise ValueError(f"epoch {epoch} has no minibatch: {n} samples, batch_size {plan.batch_size}, "
                             "drop_last true")
        for s in range(step, len(batches)):
            yield Minibatch(epoch, s, batches[s])
        epoch, step = epoch + 1, 0
