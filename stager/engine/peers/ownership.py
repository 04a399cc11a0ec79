"""Who owns each file: the node that reads it first, computed from the plan by every node alike.

Every rank's reading follows from (seed, epochs, batch size, ranks, start),
so each node leader can evaluate every rank's first epoch and know which
node reads each file then. That node is the file's owner: the only one that
reads it from the shared file system in that epoch, and the one the others
ask for it later. No directory is kept and nothing is exchanged.
"""

import numpy as np

NO_OWNER = -1


def first_epoch_owners(spec, samples, size, owner_of_rank, to_files=None):
    """The owner of every file: ``owner_of_rank`` of the first rank to read it in the plan's first epoch.

    Args:
        spec: A plan description with ``minibatches(rank)`` (``PlanSpec``), or None (an order only a front end knows).
        samples: Files in the catalog (its samples, unless packed in containers).
        size: Number of ranks.
        owner_of_rank: Per rank, its node leader's rank among the leaders.
        to_files: Maps sample indices to the files holding them, or None.

    Returns:
        An int32 array; ``NO_OWNER`` for a file nobody reads in that epoch
        (``plan.remainder: drop``) or when there is no description.
    """
    owners = np.full(samples, NO_OWNER, dtype=np.int32)
    if spec is None or not hasattr(spec, "minibatches"):
        return owners
    for rank in range(size):
        first = None
        for mb in spec.minibatches(rank):
            first = mb.epoch if first is None else first
            if mb.epoch != first:
                break
            files = mb.indices if to_files is None else to_files(mb.indices)
            indices = files[owners[files] == NO_OWNER]
            owners[indices] = owner_of_rank[rank]
    return owners


def leader_of_rank(node_of_rank):
    """Per rank, the rank of its node's leader among the leaders (ordered by their global ranks).

    A node's leader is its lowest global rank, so leaders rank among
    themselves in the order of their nodes' first appearance.
    """
    order = {}
    for node in node_of_rank:
        order.setdefault(node, len(order))
    return np.array([order[node] for node in node_of_rank], dtype=np.int32)
