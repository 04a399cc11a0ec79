"""What the shuffles that draw an epoch's whole permutation share: positions to samples and back through it."""

import numpy as np


def forward(perm):
    """Positions to samples, through the materialised permutation."""
    return perm.take


def inverse(perm):
    """Samples to positions, through the materialised inverse permutation."""
    where = np.empty(len(perm), dtype=np.int64)
    where[perm] = np.arange(len(perm), dtype=np.int64)
    return where.take
