"""Stage 1: what order samples are read in, as pure functions.

Every function here depends only on its arguments: the sequence of minibatches
is a function of (seed, epoch, catalog size, batch settings, ranks) and never
of the number of prefetchers or readers, nor of timing. Any process can
therefore compute any part of the plan ahead of time, without talking to the
others. ``order`` makes each epoch's global order and splits it across ranks,
``shares`` gives one rank its share of an epoch from positions alone,
``shuffles`` are the permutations by name, ``lookup`` answers when a sample
is read, ``batching`` cuts orders into minibatches, ``spec`` describes a rank's reading for
the node's service, ``resume`` is the one position model that resume uses.
"""

from .batching import Minibatch, iterate, stream
from .lookup import Reads, job_reads, next_uses, read_at
from .order import epoch_minibatches, epoch_order, fit_to_ranks, permutation, rank_share, steps_per_epoch
from .resume import STATE_VERSION, Position, ResumeMismatch, check_count, resume_position, resume_state
from .shares import epoch_share, fitted_length, step_count
from .shuffles import SHUFFLES
from .spec import PlanSpec, bound_shuffle

__all__ = ["Minibatch", "PlanSpec", "Position", "Reads", "ResumeMismatch", "SHUFFLES", "STATE_VERSION", "bound_shuffle",
           "check_count", "epoch_minibatches", "epoch_order", "epoch_share", "fit_to_ranks", "fitted_length", "iterate", "job_reads",
           "next_uses", "permutation", "read_at", "rank_share", "resume_position", "resume_state", "step_count",
           "steps_per_epoch", "stream"]
