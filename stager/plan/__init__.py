"""Stage 1: what order samples are read in, as pure functions.

Every function here depends only on its arguments: the sequence of minibatches
is a function of (seed, epoch, catalog size, batch settings, ranks) and never
of the number of prefetchers or readers, nor of timing. Any process can
therefore compute any part of the plan ahead of time, without talking to the
others. ``order`` makes each epoch's global order and splits it across ranks,
``batching`` cuts it into minibatches, ``spec`` describes a rank's reading for
the node's service, ``resume`` is the one position model that resume uses.
"""

from .batching import Minibatch, iterate, stream
from .order import epoch_minibatches, epoch_order, fit_to_ranks, permutation, rank_share, steps_per_epoch
from .resume import STATE_VERSION, Position, ResumeMismatch, check_count, resume_position, resume_state
from .spec import PlanSpec, StreamSpec

__all__ = ["Minibatch", "PlanSpec", "Position", "ResumeMismatch", "STATE_VERSION", "StreamSpec", "check_count", "epoch_minibatches",
           "epoch_order", "fit_to_ranks", "iterate", "permutation", "rank_share", "resume_position", "resume_state",
           "steps_per_epoch", "stream"]
