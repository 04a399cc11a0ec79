"""Plans as descriptions: what a rank will read, evaluable by any process."""

from dataclasses import dataclass

from .batching import iterate
from .resume import Position
from .shuffles import DEFAULT


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
        shuffle_algorithm: Name in ``shuffles.SHUFFLES``.
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

    @classmethod
    def from_config(cls, samples, plan, size=1, start=Position()):
        """The description of reading ``plan`` (a ``PlanConfig``) over ``samples`` on ``size`` ranks."""
        return cls(samples, plan.batch_size, plan.epochs, plan.seed, plan.shuffle, plan.drop_last,
                   plan.remainder, size, start, plan.shuffle_algorithm)

    def minibatches(self, rank):
        """Rank ``rank``'s minibatches (see ``iterate``)."""
        return iterate(self.samples, self, self.start.epoch, self.start.consumed, rank, self.size)
