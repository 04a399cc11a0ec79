"""How deep the look-ahead may be: ``staging.lookahead: auto``, and what a fixed depth costs.

A look-ahead pins its minibatches' files on the node from the moment they
are asked for until they are read. Beyond hiding the source's latency that
depth buys nothing, and on a node whose cache is tight it takes the room of
files the job will read again: with peers, the files this node holds for
the others; without, the ones its own ranks read next epoch. ``auto`` is
the deepest look-ahead that leaves room for the node's share of the
dataset beside it, between ``MIN_DEPTH`` and ``AUTO_DEPTH`` minibatches;
with room to spare (or no capacity), ``AUTO_DEPTH``. Where the share does
not fit the capacity at all, part of it is read from the source again
every epoch whatever the depth: a minibatch more of look-ahead then costs
at most a minibatch more of those reads, where a look-ahead too shallow
for the source's latency stalls steps, so the look-ahead may take half the
capacity and the other half keeps files for the next epoch.

While running, ``auto`` may go deeper, up to ``MAX_DEPTH`` where the room
allows it (``fitting_depth(..., most=MAX_DEPTH)``): as deep as Little's law
says a minibatch must be asked for ahead so that it is staged when its turn
comes (``needed_depth``: the time its files take to fetch over the time the
training takes a step; ``engine.tuning.deepening`` measures both).
"""

import math

from .capacity import human

AUTO_DEPTH = 16  # minibatches: the depth where room is no concern (the former default)
MIN_DEPTH = 2    # one minibatch being read and the next being staged
MAX_DEPTH = 64   # the deepest ``auto`` grows to while running, where the source's latency needs it


def lookahead_depth(configured):
    """``staging.lookahead`` as minibatches, before the node's capacity is known (``auto``: ``AUTO_DEPTH``)."""
    return AUTO_DEPTH if configured == "auto" else int(configured)


def fitting_depth(capacity, total_bytes, files, batch_size, ranks, share, most=AUTO_DEPTH):
    """The deepest look-ahead that leaves the node room for its share of the dataset (half the capacity where it cannot fit).

    Args:
        capacity: The node cache's bytes, or None (unbounded).
        total_bytes, files: The dataset's bytes and files.
        batch_size: Samples per minibatch on one rank (one file each).
        ranks: Ranks of the node.
        share: The part of the dataset the node holds for the job (its ranks over all ranks).
        most: The deepest it may be (``AUTO_DEPTH`` at start, ``MAX_DEPTH`` while running).

    Returns:
        ``(depth, keep)``: minibatches (at least ``MIN_DEPTH``, at most
        ``most``), and the bytes the node keeps for the job.
    """
    keep = int(total_bytes * share)
    if capacity is None or not files:
        return most, keep
    step = ranks * batch_size * total_bytes / files  # one minibatch of each of the node's ranks, files of mean size
    fits = int(_room(capacity, keep) // step) if step else most
    return max(MIN_DEPTH, min(most, fits)), keep


def _room(capacity, keep):
    """Bytes of ``capacity`` the look-ahead may pin beside the ``keep`` bytes of the node's share.

    Where the share cannot fit, half the capacity: the module's docstring says why.
    """
    return capacity - keep if keep <= capacity else capacity / 2


def needed_depth(span_s, step_s):
    """Minibatches to ask for ahead so that one asked now is staged by its turn (Little's law).

    Args:
        span_s: Seconds the node takes to stage a minibatch's files once
            they are handed out (its prefetchers' longest task).
        step_s: Seconds the training takes per minibatch, its waits left out.

    Returns:
        Minibatches (at least ``MIN_DEPTH``): the steps one fetch lasts,
        and the one being read; ``MAX_DEPTH`` for a training that does not
        wait on anything but its data.
    """
    if step_s <= 0:
        return MAX_DEPTH
    return max(MIN_DEPTH, math.ceil(span_s / step_s) + 1)


def depth_note(configured, depth, capacity, keep, step_bytes):
    """What the run's start says about the look-ahead, or None.

    Args:
        configured: ``staging.lookahead`` (``auto`` or minibatches).
        depth: ``fitting_depth``'s depth.
        capacity: The node cache's bytes, or None.
        keep: The bytes the node keeps for the job.
        step_bytes: Bytes one step of the look-ahead pins on the node (mean).

    Returns:
        ``(level, text)``: ``info`` for ``auto`` cut below ``AUTO_DEPTH``,
        ``warning`` for a fixed depth that takes the room of files the job
        reads again (the bytes it costs per epoch, at most), else None.
    """
    if capacity is None:
        return None
    if configured == "auto":
        if depth >= AUTO_DEPTH:
            return None
        if keep > capacity:
            return "info", (f"staging.lookahead auto: {depth} minibatches, at most half of staging.capacity "
                            f"{human(capacity)}: the {human(keep)} this node keeps for the job cannot fit it, and the "
                            f"other half keeps what it can for the next epoch")
        return "info", (f"staging.lookahead auto: {depth} minibatches, so that the {human(keep)} this node keeps "
                        f"for the job fit beside the look-ahead in staging.capacity {human(capacity)}")
    pinned = int(configured) * step_bytes
    over = min(keep, pinned - _room(capacity, keep))  # the bytes it pins past the room auto leaves it
    if int(configured) <= depth or over <= 0:
        return None
    return "warning", (f"staging.lookahead {configured} pins up to {human(pinned)} of staging.capacity "
                       f"{human(capacity)}, leaving no room for {human(over)} of the {human(keep)} this node keeps "
                       f"for the job: up to that much is read from the source again each epoch; "
                       f"staging.lookahead: auto ({depth} here) keeps it")
