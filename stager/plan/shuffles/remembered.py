"""A shuffle that keeps the epochs it evaluated, for one process that reads many ranks' shares.

Each rank evaluates its epoch's order on its own: with a materialising
shuffle (``pcg64``) that is the whole permutation, once per rank and epoch.
A process that lists many ranks' reads (``stager simulate`` replays every
rank of its tracked nodes, each through several listings) would draw the
same permutation again for each: 192 times for 64 ranks over 3 epochs of
14 million samples, minutes of the run. ``Remembered`` draws each epoch
once and keeps the latest ones, up to a memory bound.
"""

import collections

# Bytes of evaluated epochs kept: eight epochs of 14 million samples.
BUDGET = 1 << 30


class Remembered:
    """``algorithm``'s ``forward`` and ``inverse``, each epoch's evaluated once while it stays in the bound.

    A bound shuffle in the place of a name (``PlanSpec.shuffle_algorithm``),
    as ``ShardShuffle`` is; what it returns is exactly what ``algorithm``
    returns.

    Args:
        algorithm: A shuffle module or bound shuffle (``shuffles.algorithm``).
        budget: Bytes of evaluated epochs kept at most (8 bytes a sample
            each way); at least the latest epoch is kept.
    """

    def __init__(self, algorithm, budget=BUDGET):
        self.algorithm = algorithm
        self.MATERIALISES = getattr(algorithm, "MATERIALISES", True)
        self.budget = budget
        self._kept = collections.OrderedDict()  # (way, n, seed, epoch) -> the function, latest used last

    def __getattr__(self, name):
        # A bound shuffle's other attributes (``most_containers``) are its own.
        if "algorithm" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["algorithm"], name)

    def forward(self, n, seed, epoch):
        return self._get("forward", n, seed, epoch)

    def inverse(self, n, seed, epoch):
        return self._get("inverse", n, seed, epoch)

    def _get(self, way, n, seed, epoch):
        key = (way, n, seed, epoch)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        if not self.MATERIALISES:  # evaluated position by position: nothing to keep
            return getattr(self.algorithm, way)(n, seed, epoch)
        fn = getattr(self.algorithm, way)(n, seed, epoch)
        self._kept[key] = fn
        while len(self._kept) > max(1, self.budget // (8 * max(1, n))):
            self._kept.popitem(last=False)
        return fn
