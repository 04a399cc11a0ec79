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


def epoch_order(n, seed, epoch, shuffle=True, size=1, remainder="pad"):
    """The epoch's permutation, made divisible by the number of ranks.

    Args:
        n: Number of samples.
        seed: Run seed.
        epoch: Epoch number.
        shuffle: Permute the epoch.
        size: Number of ranks sharing the epoch.
        remainder: When ``n`` is not a multiple of ``size``: ``"pad"``
            repeats the first samples of the permutation so that every rank
            reads as many samples (a few samples are read twice that epoch);
            ``"drop"`` leaves out the last ``n % size`` samples of the
            permutation (a few samples are not read that epoch; which ones
            changes with the epoch).
    """
    order = permutation(n, seed, epoch, shuffle)
    extra = n % size
    if extra == 0:
        return order
    if remainder == "pad":
        return np.resize(order, n + size - extra)  # repeats cyclically from the start
    if remainder == "drop":
        return order[:n - extra]
    raise ValueError(f"remainder must be 'pad' or 'drop', not {remainder!r}")


def steps_per_epoch(n, batch_size, drop_last, size=1, remainder="pad"):
    """Number of minibatches in one epoch, the same on every rank."""
    per_rank = (n + (-n) % size) // size if remainder == "pad" else n // size
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def epoch_minibatches(n, batch_size, seed, epoch, shuffle=True, drop_last=False, rank=0, size=1,
                      remainder="pad"):
    """Cuts one epoch's permutation into one rank's minibatch index arrays.

    The permutation is cut into global minibatches of ``batch_size * size``
    samples; rank ``r`` takes the ``r``-th contiguous share of each. The last
    global minibatch may be shorter; it is then shared equally (the order is
    divisible by ``size``), so every rank has the same number of steps.

    Args:
        n: Number of samples.
        batch_size: Samples per minibatch on one rank.
        seed: Run seed.
        epoch: Epoch number.
        shuffle: Permute the epoch.
        drop_last: Drop a last global minibatch shorter than
            ``batch_size * size``; otherwise it is delivered short.
        rank: This rank, ``0 <= rank < size``.
        size: Number of ranks.
        remainder: ``"pad"`` or ``"drop"``; see ``epoch_order``.

    Returns:
        A list of int64 arrays.
    """
    order = epoch_order(n, seed, epoch, shuffle, size, remainder)
    return rank_share(order, batch_size, drop_last, rank, size)


def rank_share(order, batch_size, drop_last, rank, size):
    """One rank's minibatches of an epoch order that ``size`` divides.

    Args:
        order: The epoch's order, from ``epoch_order``.
        batch_size: Samples per minibatch on one rank.
        drop_last: Drop a short last global minibatch.
        rank: This rank.
        size: Number of ranks.
    """
    span = batch_size * size
    count = len(order) // span if drop_last else -(-len(order) // span)
    out = []
    for s in range(count):
        chunk = order[s * span:(s + 1) * span]
        share = len(chunk) // size
        out.append(chunk[rank * share:(rank + 1) * share])
    return out


def iterate(n, plan, start_epoch=0, start_step=0, rank=0, size=1):
    """Yields one rank's minibatches from a position onwards.

    Args:
        n: Number of samples.
        plan: A ``PlanConfig`` (batch_size, epochs, seed, shuffle, drop_last,
            remainder); ``epochs == 0`` repeats without end.
        start_epoch: First epoch to yield.
        start_step: First minibatch within ``start_epoch``.
        rank: This rank.
        size: Number of ranks.

    Yields:
        Minibatch objects in delivery order.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside a world of size {size}")
    epoch, step = start_epoch, start_step
    while plan.epochs == 0 or epoch < plan.epochs:
        batches = epoch_minibatches(n, plan.batch_size, plan.seed, epoch, plan.shuffle, plan.drop_last,
                                    rank, size, plan.remainder)
        if not batches:
            raise ValueError(f"epoch {epoch} has no minibatch: {n} samples, {size} rank(s), "
                             f"batch_size {plan.batch_size}, drop_last {plan.drop_last}, "
                             f"remainder {plan.remainder!r}")
        for s in range(step, len(batches)):
            yield Minibatch(epoch, s, batches[s])
        epoch, step = epoch + 1, 0
