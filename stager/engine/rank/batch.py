"""What the consumer gets: a decoded minibatch with where its time went."""

from dataclasses import dataclass

import numpy as np

from ...telemetry import BatchTimes


@dataclass
class Batch:
    """A decoded minibatch, as delivered to the consumer.

    Attributes:
        epoch: Epoch number.
        step: Index within the epoch.
        indices: Catalog indices of the samples, in order.
        samples: Decoded samples, ``(data, label)`` tuples for labelled data;
            where ``collated``, the minibatch the decoder's ``collate`` made
            of them in the reader (a front end's ``collate_fn``).
        times: Where the time went for this minibatch.
        end: Position in the epoch's global order after this minibatch
            (see ``plan.Minibatch.end``).
        last: Whether it is the last minibatch of its epoch.
        collated: Whether ``samples`` is already collated.
    """

    epoch: int
    step: int
    indices: np.ndarray
    samples: object
    times: BatchTimes
    end: int = 0
    last: bool = False
    collated: bool = False
