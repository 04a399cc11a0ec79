"""How one global minibatch is shared among the ranks, chosen by name (``plan.split``).

A global minibatch is ``batch_size * size`` consecutive positions of the
epoch's fitted order (the last may be shorter; ``size`` divides it). Both
rules give every rank the same number of positions of each, and every
position to exactly one rank:

- ``contiguous``: rank ``r`` reads the ``r``-th contiguous run (stager's
  order since its first release);
- ``strided``: rank ``r`` reads every ``size``-th position from ``r``, which
  is what ``DistributedSampler`` followed by a ``DataLoader`` gives rank
  ``r`` (it takes ``indices[r::size]``, then cuts minibatches).

Each rule is two pure, vectorised functions of positions within one global
minibatch whose ranks read ``share`` positions each: ``offset(rank, size,
share, j)`` (where the rank's ``j``-th position lies) and ``owner(within,
size, share)`` (which rank reads a position).
"""

DEFAULT = "contiguous"


class Contiguous:
    """Rank ``r`` reads positions ``r * share`` to ``(r + 1) * share - 1``."""

    @staticmethod
    def offset(rank, size, share, j):
        return rank * share + j

    @staticmethod
    def owner(within, size, share):
        return within // share


class Strided:
    """Rank ``r`` reads positions ``r``, ``r + size``, ``r + 2 * size``, ..."""

    @staticmethod
    def offset(rank, size, share, j):
        return rank + size * j

    @staticmethod
    def owner(within, size, share):
        return within % size


SPLITS = {"contiguous": Contiguous, "strided": Strided}


def split(name):
    """The rule called ``name``.

    Raises:
        ValueError: For a name not in ``SPLITS``.
    """
    try:
        return SPLITS[name]
    except KeyError:
        raise ValueError(f"no split {name!r}; known: {sorted(SPLITS)}") from None
