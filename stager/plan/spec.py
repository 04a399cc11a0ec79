"""Plans as descriptions: what a rank will read, evaluable by any process."""

from dataclasses import dataclass

from ..errors import ConfigError
from .batching import iterate
from .order import steps_per_epoch
from .shares import fitted_length
from .resume import Position
from .shuffles import DEFAULT, ShardShuffle, shards
from .splits import DEFAULT as DEFAULT_SPLIT


def bound_shuffle(plan, containers=None):
    """``plan.shuffle_algorithm``, bound to the catalog's containers when it is ``shards``.

    Args:
        plan: A ``PlanConfig``.
        containers: Per sample, its container's index, or None.

    Raises:
        ConfigError: ``shards`` without containers.
    """
    if plan.shuffle_algorithm != "shards":
        return plan.shuffle_algorithm
    if containers is None:
        shards.forward()  # raises the error that says what the shuffle needs
    return ShardShuffle.of(containers, plan.shard_window)


@dataclass(frozen=True)
class PlanSpec:
    """What one rank reads, as a description any process can evaluate.

    The node's service receives one per rank, so a cache policy can compute
    when each file is needed next without being handed iterators.

    Attributes:
        samples: Catalog size.
        batch_size: Samples per minibatch on one rank.
        epochs: Epochs to read; 0 reads without end.
        seed: Run seed.
        shuffle: Permute each epoch.
        drop_last: Drop each epoch's short last global minibatch.
        remainder: ``pad`` or ``drop`` (see ``epoch_order``).
        size: Number of ranks.
        start: Where reading starts.
        shuffle_algorithm: Name in ``shuffles.SHUFFLES``, or a bound shuffle
            (``shuffles.ShardShuffle``).
        split: Name in ``splits.SPLITS``.
    """

    samples: int
    batch_size: int
    epochs: int
    seed: int
    shuffle: bool
    drop_last: bool
    remainder: str
    size: int
    start: Position = Position()
    shuffle_algorithm: str = DEFAULT
    split: str = DEFAULT_SPLIT

    def __post_init__(self):
        # Checked when the plan is made, before any worker starts: an epoch
        # without a minibatch would otherwise only fail once reading begins.
        if steps_per_epoch(self.samples, self.batch_size, self.drop_last, self.size, self.remainder):
            return
        fitted = fitted_length(self.samples, self.size, self.remainder)
        if self.drop_last and fitted:
            raise ConfigError(f"plan.drop_last is true and a minibatch of plan.batch_size {self.batch_size} on each "
                              f"of {self.size} rank(s) takes {self.batch_size * self.size} samples, more than the "
                              f"{fitted} of an epoch ({self.samples} in the catalog): every minibatch would be "
                              "dropped; lower plan.batch_size or set plan.drop_last: false")
        raise ConfigError(f"an epoch of {self.samples} samples leaves none for each of {self.size} ranks with "
                          f"plan.remainder {self.remainder!r}; use remainder 'pad' or fewer ranks")

    @classmethod
    def from_config(cls, samples, plan, size=1, start=Position(), containers=None):
        """The description of reading ``plan`` (a ``PlanConfig``) over ``samples`` on ``size`` ranks.

        Args:
            containers: Per sample, the index of the container holding it
                (a sharded catalog's ``layout.file_of``), which the
                ``shards`` shuffle needs; None for one sample per file.
        """
        return cls(samples, plan.batch_size, plan.epochs, plan.seed, plan.shuffle, plan.drop_last,
                   plan.remainder, size, start, bound_shuffle(plan, containers), plan.split)

    def most_files(self):
        """``minibatches ahead -> the most containers one rank's look-ahead touches`` (the ``shards`` shuffle), else None.

        A look-ahead of ``a`` minibatches covers ``a * batch_size * size``
        consecutive samples of the global order (every rank takes its share
        of each global minibatch).
        """
        most = getattr(self.shuffle_algorithm, "most_containers", None)
        if most is None:
            return None
        return lambda ahead: most(ahead * self.batch_size * self.size)

    def minibatches(self, rank):
        """Rank ``rank``'s minibatches (see ``iterate``)."""
        return iterate(self.samples, self, self.start.epoch, self.start.consumed, rank, self.size)
