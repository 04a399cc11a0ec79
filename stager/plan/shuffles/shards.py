"""Two-level shuffle of samples packed in containers: the containers, then samples within a window of them.

Each epoch permutes the containers (keyed with seed, epoch), cuts that order
into windows of ``plan.shard_window`` containers, and permutes the samples
of each window among themselves. A run of minibatches therefore draws from
a few containers at a time: the node stages and keeps a window's containers
instead of every container a full permutation would touch at once, at the
cost of samples that sit close in the dataset also sitting close in the
order (``plan.quality`` measures how close). Like every shuffle it is a pure
function of its arguments, so resuming, elastic or not, continues the same
global order.

The shuffle needs the containers' boundaries, which only the catalog knows:
``ShardShuffle`` holds them and is what a plan description carries; the
name ``shards`` alone (this module's functions) cannot be evaluated.
"""

import numpy as np

from . import whole
from ...errors import ConfigError

MATERIALISES = True
_SALT = 0x5A4D5  # keeps this shuffle's draws apart from pcg64's for the same (seed, epoch)


def _unbound(*args):
    raise ConfigError("plan.shuffle_algorithm shards needs samples packed in containers (dataset.format tar or "
                      "hdf5): only such a catalog says where each container's samples lie")


forward = inverse = _unbound


class ShardShuffle:
    """The ``shards`` shuffle bound to a catalog's containers.

    Args:
        starts: Where each container's samples start in ``members``, then
            the sample count.
        window: Containers whose samples are shuffled together.
        members: The samples grouped by container (int64), or None when
            samples are numbered container by container (``0..n-1``).
    """

    MATERIALISES = True
    name = "shards"

    def __init__(self, starts, window, members=None):
        self.starts = np.asarray(starts, dtype=np.int64)
        self.window = int(window)
        self.members = None if members is None else np.asarray(members, dtype=np.int64)
        if self.window < 1:
            raise ConfigError("plan.shard_window must be at least 1")

    @classmethod
    def of(cls, file_of, window):
        """The shuffle for samples whose containers are ``file_of`` (a container's samples in any order)."""
        file_of = np.asarray(file_of, dtype=np.int64)
        members = None
        if len(file_of) > 1 and (np.diff(file_of) < 0).any():
            members = np.argsort(file_of, kind="stable")
            file_of = file_of[members]
        edges = np.flatnonzero(np.diff(file_of)) + 1
        return cls(np.concatenate([[0], edges, [len(file_of)]]), window, members)

    def permutation(self, n, seed, epoch):
        """Epoch ``epoch``'s whole order."""
        if n != self.starts[-1]:
            raise ValueError(f"the shards shuffle was bound to {int(self.starts[-1])} samples, not {n}")
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, _SALT])))
        counts = np.diff(self.starts)
        order = rng.permutation(len(counts))
        counts_in_order = counts[order]
        first = np.cumsum(counts_in_order) - counts_in_order
        samples = np.repeat(self.starts[:-1][order] - first, counts_in_order) + np.arange(n, dtype=np.int64)
        window_of = np.repeat(np.arange(len(counts), dtype=np.int64) // self.window, counts_in_order)
        order = samples[np.lexsort((rng.random(n), window_of))]
        return order if self.members is None else self.members[order]

    def forward(self, n, seed, epoch):
        return whole.forward(self.permutation(n, seed, epoch))

    def inverse(self, n, seed, epoch):
        return whole.inverse(self.permutation(n, seed, epoch))

    def most_containers(self, span):
        """The most containers ``span`` consecutive samples of an order can touch.

        A span lies across at most ``ceil(span / smallest window) + 1``
        windows, each of at most ``window`` containers.
        """
        counts = np.diff(self.starts)
        c = len(counts)
        if c <= self.window:
            return c
        smallest = int(np.sort(counts)[:self.window].sum())  # no window holds fewer samples than this
        return int(min(c, (-(-span // max(smallest, 1)) + 1) * self.window))

    def __eq__(self, other):
        return (isinstance(other, ShardShuffle) and self.window == other.window
                and np.array_equal(self.starts, other.starts)
                and (self.members is None) == (other.members is None)
                and (self.members is None or np.array_equal(self.members, other.members)))

    def __hash__(self):
        return hash((self.window, len(self.starts), int(self.starts[-1])))

    def __repr__(self):
        return f"ShardShuffle({len(self.starts) - 1} containers, window {self.window})"
