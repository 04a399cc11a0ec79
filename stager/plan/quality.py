"""How well an epoch's order mixes the dataset: figures to compare shuffles by, as pure functions.

A full permutation is the reference: its neighbours lie a third of the
dataset apart on average, and its minibatches hold as many distinct groups
(classes, containers) as random draws do. A two-level shuffle of containers
(``shuffles.shards``) keeps samples of one window together, so both figures
fall as the window narrows.
"""

import numpy as np


def neighbour_spread(order, n=None):
    """Mean distance between consecutive samples' catalog indices, over its expectation in a full permutation.

    1.0 for a uniform random permutation (two random positions in ``n`` lie
    ``(n + 1) / 3`` apart on average); near 0 for the catalog order.

    Args:
        order: Catalog indices in reading order (an epoch, or one rank's share of it).
        n: Samples in the catalog; default: the largest index plus one.
    """
    order = np.asarray(order, dtype=np.int64)
    if len(order) < 2:
        return 1.0
    n = int(order.max()) + 1 if n is None else n
    return float(np.abs(np.diff(order)).mean() / ((n + 1) / 3))


def distinct_per_batch(order, group_of, batch_size):
    """Mean number of distinct groups (``group_of[sample]``: a class, a container) in each minibatch of ``order``."""
    groups = np.asarray(group_of, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    full = len(groups) // batch_size * batch_size
    if not full:
        return float(len(np.unique(groups)))
    blocks = np.sort(groups[:full].reshape(-1, batch_size), axis=1)
    return float((1 + (np.diff(blocks, axis=1) != 0).sum(axis=1)).mean())
