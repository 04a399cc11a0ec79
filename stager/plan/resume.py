"""One resume model: a global position and the state that saves it.

``stager run``'s state file and ``StagedLoader.state_dict`` both save a
``resume_state`` and read it back with ``resume_position``; a position is
global, so a run resumes on the same or another number of ranks.
"""

import numbers
from dataclasses import dataclass

STATE_VERSION = 1


@dataclass(frozen=True)
class Position:
    """Where a reading stands: the global key that resume uses.

    Attributes:
        epoch: The epoch being read.
        consumed: Samples of that epoch's global order consumed by all ranks
            together. The same key means the same place whatever the number
            of ranks, which is what makes elastic resume exact.
    """

    epoch: int = 0
    consumed: int = 0

    def after(self, minibatch):
        """The position once ``minibatch`` (and its peers on the other ranks) is done."""
        if minibatch.last:
            return Position(minibatch.epoch + 1, 0)
        return Position(minibatch.epoch, minibatch.end)


class ResumeMismatch(ValueError):
    """A saved state belongs to another dataset or order.

    Attributes:
        key: The key that differs.
        saved: Its saved value.
        current: This run's value.
    """

    def __init__(self, key, saved, current):
        super().__init__(f"{key}: saved {saved!r}, this run has {current!r}")
        self.key, self.saved, self.current = key, saved, current


def resume_state(position, samples, plan, size):
    """The serialisable state of a position: the position and what it depends on.

    Args:
        position: A ``Position``.
        samples: Catalog size.
        plan: The ``PlanConfig`` read with.
        size: Number of ranks (for information: a state resumes on any number).
    """
    return {"version": STATE_VERSION, "epoch": position.epoch, "position": position.consumed,
            "samples": samples, "seed": plan.seed, "shuffle": plan.shuffle,
            "shuffle_algorithm": plan.shuffle_algorithm, "split": plan.split, "batch_size": plan.batch_size,
            "world_size": size}


def check_count(name, value, where):
    """Refuses anything but a non-negative integer where an epoch or a position is expected.

    Checked where it is given: a negative position would silently re-read the
    end of an epoch, a negative epoch fail later inside the pipeline.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{where}: {name} is {value!r}, expected a non-negative integer")


def resume_position(state, samples, plan, where="state"):
    """The ``Position`` a ``resume_state`` holds, checked against this run.

    The order depends on the catalog size, the seed, whether epochs are
    shuffled and how (a state saved before ``shuffle_algorithm`` existed
    was read with ``pcg64``); batch size and number of ranks may change
    between runs.

    Args:
        state: What ``resume_state`` made.
        samples: This run's catalog size.
        plan: This run's ``PlanConfig``.
        where: How errors name the state, e.g. ``state_dict``.

    Raises:
        ResumeMismatch: Naming the first key that differs.
        ValueError: For an epoch or position that is not a non-negative integer.
    """
    saved = {"shuffle_algorithm": "pcg64", **state}
    checked = [("samples", samples), ("seed", plan.seed), ("shuffle", plan.shuffle)]
    if plan.shuffle:  # unshuffled reading is the catalog order whatever the algorithm
        checked.append(("shuffle_algorithm", plan.shuffle_algorithm))
    for key, mine in checked:
        if saved.get(key) != mine:
            raise ResumeMismatch(key, saved.get(key), mine)
    for key in ("epoch", "position"):
        check_count(key, state.get(key), f"{where}[{key!r}]")
    return Position(int(state["epoch"]), int(state["position"]))
