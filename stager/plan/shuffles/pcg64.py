"""numpy's PCG64 shuffle of the whole epoch: the order of every stager run so far.

Evaluating any position draws the whole permutation (linear time and
memory in ``n``); kept so that existing runs and saved positions keep their
order.
"""

import numpy as np

from . import whole

MATERIALISES = True


def permutation(n, seed, epoch):
    """The whole permutation of epoch ``epoch``, seeded with (seed, epoch)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(n).astype(np.int64, copy=False)


def forward(n, seed, epoch):
    """Positions to samples, through the materialised permutation."""
    return whole.forward(permutation(n, seed, epoch))


def inverse(n, seed, epoch):
    """Samples to positions, through the materialised inverse permutation."""
    return whole.inverse(permutation(n, seed, epoch))
