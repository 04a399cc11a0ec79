"""One rank's share of an epoch as positions, without the rest of the epoch.

An epoch's *fitted order* is its permutation from a start position on, made
divisible by the number of ranks (``order.fit_to_ranks``); it is cut into
global minibatches of ``batch_size * size`` samples, and rank ``r`` reads its
share of each by the split rule (``splits``: the ``r``-th contiguous run, or
every ``size``-th position from ``r``). Everything here is arithmetic on
positions of that order, so a rank lists what it reads in time and memory
proportional to its share; the shuffle algorithm then turns positions into
catalog indices.
"""

import numpy as np

from .shuffles import algorithm
from .splits import DEFAULT as DEFAULT_SPLIT
from .splits import split as split_rule

BLOCK = 1 << 16  # positions turned into indices at once: bounds memory when one rank reads a huge epoch


def fitted_length(n, size, remainder, start=0):
    """Length of the fitted order: ``n - start`` samples padded or cut to a multiple of ``size``."""
    left = n - start
    extra = left % size
    if extra == 0:
        return left
    if remainder == "pad":
        return left + size - extra
    if remainder == "drop":
        return left - extra
    raise ValueError(f"remainder must be 'pad' or 'drop', not {remainder!r}")


def permutation_positions(fitted, n, start=0):
    """Positions of the permutation read at positions ``fitted`` of the fitted order.

    The fitted order is ``perm[start:]`` followed, with ``pad``, by the
    permutation's first samples again (cyclically).
    """
    q = np.asarray(fitted, dtype=np.int64)
    left = n - start
    return np.where(q < left, q + start, (q - left) % n)


def step_count(length, batch_size, drop_last, size):
    """Minibatches per rank in a fitted order of ``length`` samples."""
    span = batch_size * size
    return length // span if drop_last else -(-length // span)


def step_shares(steps, length, batch_size, size):
    """First fitted position and each rank's share of each of ``steps``.

    Every global minibatch holds ``batch_size * size`` samples except perhaps
    the last, which is shared equally (``length`` is divisible by ``size``).
    """
    span = batch_size * size
    steps = np.asarray(steps, dtype=np.int64)
    return steps * span, np.minimum(span, length - steps * span) // size


def share_positions(steps, length, batch_size, rank, size, split=DEFAULT_SPLIT):
    """Fitted positions of rank ``rank``'s share of each of ``steps``, concatenated, and each share's length."""
    first, share = step_shares(steps, length, batch_size, size)
    j = ranges(np.zeros_like(share), share)  # 0 .. share - 1 for each step, back to back
    offset = split_rule(split).offset(rank, size, np.repeat(share, share), j)
    return np.repeat(first, share) + offset, share


def ranges(first, counts):
    """The concatenation of ``arange(f, f + c)`` for each pair, as one array."""
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    return np.repeat(np.asarray(first, dtype=np.int64) - starts, counts) + np.arange(counts.sum(), dtype=np.int64)


def epoch_share(n, plan, epoch, rank, size, start=0):
    """Yields one rank's minibatches of one epoch as ``(step, indices, end)``.

    Args:
        n: Number of samples.
        plan: Anything with ``batch_size``, ``seed``, ``shuffle``,
            ``shuffle_algorithm``, ``drop_last``, ``remainder`` and
            ``split`` (a ``PlanConfig`` or ``PlanSpec``).
        epoch: Epoch number.
        rank: This rank.
        size: Number of ranks.
        start: Samples of the epoch's permutation already consumed by all
            ranks together; steps are counted from the epoch's start.

    Yields:
        ``(step, indices, end, last)``: the step within the epoch, the
        catalog indices of this rank's share, the epoch position once the
        step is done by every rank, and whether it is the epoch's last.
    """
    span = plan.batch_size * size
    length = fitted_length(n, size, plan.remainder, start)
    count = step_count(length, plan.batch_size, plan.drop_last, size)
    forward = algorithm(plan.shuffle_algorithm, plan.shuffle).forward(n, plan.seed, epoch)
    per_block = max(1, BLOCK // plan.batch_size)
    for block in range(0, count, per_block):
        steps = np.arange(block, min(count, block + per_block))
        indices, share = share_indices(forward, n, start, length, steps, plan.batch_size, rank, size, plan.split)
        for k, part in zip(steps.tolist(), np.split(indices, np.cumsum(share)[:-1])):
            yield start // span + k, part, start + min((k + 1) * span, length), k == count - 1


def share_indices(forward, n, start, length, steps, batch_size, rank, size, split=DEFAULT_SPLIT):
    """Catalog indices of rank ``rank``'s share of ``steps`` (counted from ``start``), concatenated.

    Args:
        forward: The epoch's shuffle, positions to indices.
        n: Number of samples.
        start: Where the fitted order starts in the permutation.
        length: The fitted order's length (``fitted_length``).
        steps: Steps of the fitted order, int array.
        batch_size: Samples per minibatch on one rank.
        rank: The rank.
        size: Number of ranks.
        split: How a global minibatch is shared (``splits``).

    Returns:
        ``(indices, share)``: the indices and each step's share length.
    """
    positions, share = share_positions(steps, length, batch_size, rank, size, split)
    return forward(permutation_positions(positions, n, start)), share
