"""When samples are read: the plan inverted, for a cache's next-use decisions.

Pure functions of a ``PlanSpec``: ``read_at`` answers "at which step, and by
which rank, is sample ``i`` first read in epoch ``e``" for a batch of
indices, through the shuffle's inverse (no epoch is materialised with a
shuffle that evaluates positions on their own); ``next_uses`` lists what a
node's ranks read over a horizon of steps, each sample with its first step.
"""

from typing import NamedTuple

import numpy as np

from .shares import fitted_length, share_indices, step_count
from .shuffles import algorithm
from .splits import split as split_rule


class Reads(NamedTuple):
    """Where samples are first read in an epoch; -1 where a sample is not read.

    Attributes:
        step: Step within the epoch (as ``Minibatch.step`` numbers it).
        rank: The rank that reads it.
    """

    step: np.ndarray
    rank: np.ndarray


def _epoch_start(spec, epoch):
    """Samples of ``epoch`` consumed before ``spec`` starts reading it; None if it reads none of it."""
    if epoch < spec.start.epoch or (spec.epochs and epoch >= spec.epochs):
        return None
    return spec.start.consumed if epoch == spec.start.epoch else 0


def read_at(spec, epoch, indices):
    """The step and rank at which each of ``indices`` is first read in epoch ``epoch``.

    Args:
        spec: A ``PlanSpec``.
        epoch: Epoch number.
        indices: Catalog indices, int array.

    Returns:
        ``Reads``; a sample is not read when the epoch is outside the
        reading, it was consumed before ``spec.start``, or ``remainder:
        drop`` or ``drop_last`` leave it out.
    """
    indices = np.asarray(indices, dtype=np.int64)
    step, rank = np.full(indices.shape, -1, np.int64), np.full(indices.shape, -1, np.int64)
    start = _epoch_start(spec, epoch)
    if start is None:
        return Reads(step, rank)
    n, size, span = spec.samples, spec.size, spec.batch_size * spec.size
    length = fitted_length(n, size, spec.remainder, start)
    count = step_count(length, spec.batch_size, spec.drop_last, size)
    p = algorithm(spec.shuffle_algorithm, spec.shuffle).inverse(n, spec.seed, epoch)(indices)
    # A sample before ``start`` is read again only as padding, which repeats the permutation from its start.
    q = np.where(p >= start, p - start, n - start + p)
    read = q < min(length, count * span)
    q = q[read]
    k = q // span
    share = np.minimum(span, length - k * span) // size
    step[read] = start // span + k
    rank[read] = split_rule(spec.split).owner(q - k * span, size, share)
    return Reads(step, rank)


def next_uses(spec, ranks, position, horizon):
    """What ``ranks`` (a node's) read in the next ``horizon`` steps from ``position``.

    Args:
        spec: A ``PlanSpec``.
        ranks: The node's ranks.
        position: A ``Position`` every rank has reached.
        horizon: Steps to look ahead, across epoch ends.

    Returns:
        ``(indices, distance)``: each sample read once or more, sorted, with
        the number of steps from ``position`` to its first read (0: the next
        step).
    """
    found, distance = [], []
    epoch, start, ahead = position.epoch, position.consumed, 0
    while ahead < horizon and not (spec.epochs and epoch >= spec.epochs):
        length = fitted_length(spec.samples, spec.size, spec.remainder, start)
        steps = np.arange(min(horizon - ahead, step_count(length, spec.batch_size, spec.drop_last, spec.size)))
        forward = algorithm(spec.shuffle_algorithm, spec.shuffle).forward(spec.samples, spec.seed, epoch)
        for rank in ranks:
            indices, share = share_indices(forward, spec.samples, start, length, steps, spec.batch_size, rank,
                                           spec.size, spec.split)
            found.append(indices)
            distance.append(np.repeat(ahead + steps, share))
        if not len(steps) and start == 0:  # an epoch with no minibatch: nothing is ever read
            break
        ahead, epoch, start = ahead + len(steps), epoch + 1, 0
    if not found:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    indices, distance = np.concatenate(found), np.concatenate(distance)
    order = np.argsort(distance, kind="stable")
    unique, first = np.unique(indices[order], return_index=True)
    return unique, distance[order][first]


def job_reads(spec, node_of_rank, to_files=None, files=None):
    """Every read of the whole job, by node: what each node reads at each of its steps.

    Args:
        spec: The job's ``PlanSpec`` (finite epochs).
        node_of_rank: Per rank, its node's index.
        to_files: Maps samples to the files holding them, or None.
        files: Number of files (default: one past the largest file read).

    Returns:
        ``(steps, nodes, files, epoch_of_step)``: one entry per distinct
        (step, node, file), sorted by step, then node, then file; steps are
        the ranks' minibatch sequence numbers (0 at ``spec.start``, counted
        across epochs, as every rank's coordinator numbers them), and
        ``epoch_of_step`` gives each step's epoch.

    Raises:
        ValueError: For a plan without end (``epochs: 0``).
    """
    if not spec.epochs:
        raise ValueError("the job's reads can be listed only for a plan with a finite number of epochs")
    node_of_rank = np.asarray(node_of_rank, dtype=np.int64)
    samples = np.arange(spec.samples, dtype=np.int64)
    target = samples if to_files is None else np.asarray(to_files(samples), dtype=np.int64)
    parts = []
    for epoch in range(spec.start.epoch, spec.epochs):
        reads = read_at(spec, epoch, samples)
        read = reads.step >= 0
        parts.append(np.stack([np.full(int(read.sum()), epoch), reads.step[read], node_of_rank[reads.rank[read]],
                               target[read]]))
    table = np.concatenate(parts, axis=1) if parts else np.zeros((4, 0), dtype=np.int64)
    nfiles = int(files if files is not None else (table[3].max() + 1 if table.shape[1] else 1))
    nnodes = int(node_of_rank.max()) + 1 if len(node_of_rank) else 1
    per_epoch = int(table[1].max()) + 1 if table.shape[1] else 1
    key = np.unique(((table[0] * per_epoch + table[1]) * nnodes + table[2]) * nfiles + table[3])
    step_key, rest = np.divmod(key, nnodes * nfiles)
    node, file = np.divmod(rest, nfiles)
    distinct, steps = np.unique(step_key, return_inverse=True)
    return steps.astype(np.int64), node, file, distinct // per_epoch
