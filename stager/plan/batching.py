"""Cutting the orders into one rank's minibatches: per epoch, or as Chainer's stream."""

from dataclasses import dataclass

import numpy as np

from .shares import epoch_share


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


def iterate(n, plan, start_epoch=0, start_sample=0, rank=0, size=1):
    """Yields one rank's minibatches from a position onwards.

    Args:
        n: Number of samples.
        plan: A ``PlanConfig`` (batch_size, epochs, seed, shuffle,
            shuffle_algorithm, drop_last, remainder); ``epochs == 0`` repeats
            without end. Only this rank's positions are evaluated, so with
            a shuffle that does not materialise (``feistel``) an epoch costs
            time and memory in proportion to the rank's share.
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
    epoch, start = start_epoch, start_sample
    while plan.epochs == 0 or epoch < plan.epochs:
        empty = True
        for step, indices, end, last in epoch_share(n, plan, epoch, rank, size, start):
            empty = False
            yield Minibatch(epoch, step, indices, end, last)
        if empty and start == 0:
            raise ValueError(f"epoch {epoch} has no minibatch: {n} samples, {size} rank(s), "
                             f"batch_size {plan.batch_size}, drop_last {plan.drop_last}, "
                             f"remainder {plan.remainder!r}")
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
            if len(cache[epoch]) != length:  # the cut below would never advance
                raise ValueError(f"the order of epoch {epoch} has {len(cache[epoch])} samples, epoch 0's had "
                                 f"{length}: every epoch's order must have the same length")
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
