"""The node's residency: per file, where it is, its bytes and its pins.

Lives in the node service's thread (one writer, no lock). A file is
``ABSENT``, ``IN_FLIGHT`` (a prefetcher is fetching it) or ``STAGED``
(published in the job directory). A minibatch pins its files from the
moment a rank asks for it until the rank has read it; a pinned file is never
removed. When a file's last pin goes, the policy decides whether it stays.
"""

import numpy as np

from .policies import make_policy

ABSENT, IN_FLIGHT, STAGED = 0, 1, 2


class Cache:
    """Residency of the node's files and the policy that keeps or removes them.

    Args:
        sizes: Catalog sizes in bytes (int64 array).
        policy: A policy name (``cache.policies``).

    Attributes:
        state: Per file: ``ABSENT``, ``IN_FLIGHT`` or ``STAGED``.
        pins: Per file: minibatches in flight or being read that need it.
        staged_bytes: Bytes of the files published here.
        in_flight_bytes: Bytes of the files being fetched.
        plans: Per rank of the node, what it will read (``plan.PlanSpec``),
            or None when only the rank knows (a custom order sampler).
    """

    def __init__(self, sizes, policy="unbounded"):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.state = np.zeros(len(self.sizes), dtype=np.uint8)
        self.pins = np.zeros(len(self.sizes), dtype=np.int32)
        self.staged_bytes = 0
        self.in_flight_bytes = 0
        self.policy = make_policy(policy)
        self.plans = {}

    def add_plan(self, rank, spec):
        """Records what ``rank`` will read, so a policy can know each file's next use."""
        self.plans[rank] = spec

    def request(self, indices):
        """A minibatch needs ``indices``: pins each distinct file once.

        Returns:
            ``(missing, waiting)``: files to fetch now (marked in flight), and
            every distinct file not yet staged (the minibatch waits for them).
        """
        unique = np.unique(indices)
        self.pins[unique] += 1
        missing = unique[self.state[unique] == ABSENT]
        self.state[missing] = IN_FLIGHT
        self.in_flight_bytes += int(self.sizes[missing].sum())
        return missing, unique[self.state[unique] != STAGED]

    def staged(self, index):
        """A prefetcher published file ``index``."""
        if self.state[index] == IN_FLIGHT:
            size = int(self.sizes[index])
            self.in_flight_bytes -= size
            self.staged_bytes += size
        self.state[index] = STAGED

    def release(self, indices):
        """A minibatch that pinned ``indices`` (distinct files) was read.

        Returns:
            Files the policy removes now: the caller deletes them, then calls
            ``removed``.
        """
        self.pins[indices] -= 1
        free = indices[self.pins[indices] == 0]
        return self.policy.released(self, free) if len(free) else []

    def removed(self, index):
        """File ``index`` was deleted from the job directory."""
        if self.state[index] == STAGED:
            self.staged_bytes -= int(self.sizes[index])
        self.state[index] = ABSENT
