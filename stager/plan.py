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
        end: Samples of the epoch's global order consumed, by all ranks
            together, once this minibatch (and its peers on the other ranks)
            is done: the position to resume from.
        last: Whether it is the last minibatch of its epoch.
    """

    epoch: int
    step: int
    indices: np.ndarray
    end: int = 0
    last: bool = False

    def __eq__(self, other):
        return (isinstance(other, Minibatch)
                and (self.epoch, self.step, self.end, self.last) == (other.epoch, other.step, other.end, other.last)
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


def epoch_order(n, seed, epoch, shuffle=True, size=1, remainder="pad", start=0):
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
    """
    perm = permutation(n, seed, epoch, shuffle)
    rest = perm[start:]
    extra = len(rest) % size
    if extra == 0:
        return rest
    if remainder == "pad":
        return np.concatenate([rest, np.resize(perm, size - extra)])  # np.resize repeats cyclically
    if remainder == "drop":
        return rest[:len(rest) - extra]
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


def iterate(n, plan, start_epoch=0, start_sample=0, rank=0, size=1):
    """Yields one rank's minibatches from a position onwards.

    Args:
        n: Number of samples.
        plan: A ``PlanConfig`` (batch_size, epochs, seed, shuffle, drop_last,
            remainder); ``epochs == 0`` repeats without end.
        start_epoch: First epoch to yield.
        start_sample: Samples of ``start_epoch``'s global order already
            consumed by all ranks together (``Minibatch.end`` of the last one
            done). With an unchanged number of ranks this is
            ``step * batch_size * size``.
        rank: This rank.
        size: Number of ranks.

    Yields:
        Minibatch objects in delivery order.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside a world of size {size}")
    span = plan.batch_size * size
    epoch, start = start_epoch, start_sample
    while plan.epochs == 0 or epoch < plan.epochs:
        order = epoch_order(n, plan.seed, epoch, plan.shuffle, size, plan.remainder, start)
        batches = rank_share(order, plan.batch_size, plan.drop_last, rank, size)
        if not batches and start == 0:
            raise ValueError(f"epoch {epoch} has no minibatch: {n} samples, {size} rank(s), "
                             f"batch_size {plan.batch_size}, drop_last {plan.drop_last}, "
                             f"remainder {plan.remainder!r}")
        first = start // span
        for k, indices in enumerate(batches):
            end = start + min((k + 1) * span, len(order))
            yield Minibatch(epoch, first + k, indices, end, k == len(batches) - 1)
        epoch, start = epoch + 1, 0


def stream(orders, batch_size, start=0, rank=0, size=1, repeat=True):
    """Chainer's batching: epochs back to back, cut into global minibatches.

    Unlike ``iterate``, a minibatch that reaches the end of an epoch is filled
    from the next epoch's order (``repeat``), as Chainer's iterators do; with
    ``repeat=False`` only epoch 0 is read and its last minibatch is short.

    Args:
        orders: Callable ``epoch -> order`` (index array, the same length every
            epoch and divisible by ``size``, e.g. from ``epoch_order``).
        batch_size: Samples per minibatch on one rank.
        start: Samples of the stream already consumed by all ranks together.
        rank: This rank.
        size: Number of ranks.
        repeat: Read epochs without end; False stops after epoch 0.

    Yields:
        Minibatch objects; ``epoch`` is that of the minibatch's first sample,
        ``step`` counts minibatches from the start of the stream, ``end`` is
        the stream position after it and ``last`` marks the end of a
        non-repeating stream.
    """
    length = len(orders(0))
    if length == 0 or length % size:
        raise ValueError(f"an epoch of {length} samples cannot be shared by {size} ranks")
    span = batch_size * size
    cache = {}

    def order(epoch):
        if epoch not in cache:
            if len(cache) > 2:  # a minibatch spans at most two epochs
                cache.clear()
            cache[epoch] = orders(epoch)
        return cache[epoch]

    pos = start
    while repeat or pos < length:
        take = span if repeat else min(span, length - pos)
        parts, at = [], pos
        while at < pos + take:
            epoch, offset = divmod(at, length)
            part = order(epoch)[offset:offset + pos + take - at]
            parts.append(part)
            at += len(part)
        chunk = np.concatenate(parts)
        share = len(chunk) // size
        yield Minibatch(pos // length, pos // span, chunk[rank * share:(rank + 1) * share], pos + take,
                        not repeat and pos + take >= length)
        pos += take
