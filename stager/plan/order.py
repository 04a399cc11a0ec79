"""Each epoch's global order and its split across ranks, as pure functions.

Every function here depends only on its arguments: the sequence of minibatches
is a function of (seed, epoch, catalog size, batch settings) and never of the
number of prefetchers or readers, nor of timing. Any process can therefore
compute any part of the plan ahead of time, without talking to the others.
"""

import numpy as np

from .shares import fitted_length, step_count
from .shuffles import DEFAULT, algorithm as shuffle_algorithm
from .splits import DEFAULT as DEFAULT_SPLIT
from .splits import split as split_rule


def permutation(n, seed, epoch, shuffle=True, algorithm=DEFAULT):
    """Returns the order of the ``n`` catalog indices for one epoch, whole.

    The shuffle is keyed with (seed, epoch), so each epoch has its own
    permutation and every process that knows the seed computes the same one.

    Args:
        n: Number of samples.
        seed: Run seed.
        epoch: Epoch number.
        shuffle: False returns ``0..n-1``.
        algorithm: Name in ``shuffles.SHUFFLES`` (``plan.shuffle_algorithm``).
    """
    return shuffle_algorithm(algorithm, shuffle).forward(n, seed, epoch)(np.arange(n, dtype=np.int64))


def epoch_order(n, seed, epoch, shuffle=True, size=1, remainder="pad", start=0, algorithm=DEFAULT):
    """The epoch's global order from a position on, made divisible by the number of ranks.

    Args:
        n: Number of samples.
        seed: Run seed.
        epoch: Epoch number.
        shuffle: Permute the epoch.
        size: Number of ranks sharing the epoch.
        remainder: When the samples left are not a multiple of ``size``:
            ``"pad"`` appends the epoch's first samples again so that every
            rank reads as many (a few samples are read twice that epoch);
            ``"drop"`` leaves out the last few (a few samples are not read
            that epoch; which ones changes with the epoch).
        start: Samples of the order already consumed (a resumed epoch). The
            same position gives the same rest of the epoch whatever ``size``
            was before, which is what makes resuming on another number of
            ranks exact.
        algorithm: Shuffle name (see ``permutation``).
    """
    perm = permutation(n, seed, epoch, shuffle, algorithm)
    return fit_to_ranks(perm[start:], size, remainder, fill=perm)


def fit_to_ranks(order, size, remainder, fill=None):
    """Makes an order's length a multiple of the number of ranks: the remainder rule.

    Args:
        order: Index array.
        size: Number of ranks.
        remainder: ``"pad"`` appends samples from the start of ``fill`` (taken
            cyclically); ``"drop"`` leaves out the last few.
        fill: Where padding comes from; default: ``order`` itself.
    """
    extra = len(order) % size
    if extra == 0:
        return order
    if remainder == "pad":
        source = order if fill is None else fill
        return np.concatenate([order, np.resize(source, size - extra)])  # np.resize repeats cyclically
    if remainder == "drop":
        return order[:len(order) - extra]
    raise ValueError(f"remainder must be 'pad' or 'drop', not {remainder!r}")


def steps_per_epoch(n, batch_size, drop_last, size=1, remainder="pad"):
    """Number of minibatches in one epoch, the same on every rank."""
    return step_count(fitted_length(n, size, remainder), batch_size, drop_last, size)


def epoch_minibatches(n, batch_size, seed, epoch, shuffle=True, drop_last=False, rank=0, size=1,
                      remainder="pad", algorithm=DEFAULT, split=DEFAULT_SPLIT):
    """Cuts one epoch's permutation into one rank's minibatch index arrays.

    The permutation is cut into global minibatches of ``batch_size * size``
    samples; rank ``r`` takes its share of each by ``split`` (the ``r``-th
    contiguous run, or every ``size``-th sample from ``r``). The last global
    minibatch may be shorter; it is then shared equally (the order is
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
        algorithm: Shuffle name (see ``permutation``).
        split: Split name (``splits.SPLITS``).

    Returns:
        A list of int64 arrays.
    """
    order = epoch_order(n, seed, epoch, shuffle, size, remainder, algorithm=algorithm)
    return rank_share(order, batch_size, drop_last, rank, size, split)


def rank_share(order, batch_size, drop_last, rank, size, split=DEFAULT_SPLIT):
    """One rank's minibatches of an epoch order that ``size`` divides.

    Args:
        order: The epoch's order, from ``epoch_order``.
        batch_size: Samples per minibatch on one rank.
        drop_last: Drop a short last global minibatch.
        rank: This rank.
        size: Number of ranks.
        split: Split name (``splits.SPLITS``).
    """
    span = batch_size * size
    count = len(order) // span if drop_last else -(-len(order) // span)
    rule = split_rule(split)
    out = []
    for s in range(count):
        chunk = order[s * span:(s + 1) * span]
        share = len(chunk) // size
        out.append(chunk[rule.offset(rank, size, share, np.arange(share))])
    return out
