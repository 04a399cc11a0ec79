"""A loader that waits for the test to open a gate, to stall a minibatch on purpose.

The gate is created when the test imports this module, before the pipeline
forks its readers, so the readers share it with the test.
"""

import multiprocessing

import numpy as np

GATE = multiprocessing.Event()


def npy_after_gate(path):
    """Decodes ``.npy`` once ``GATE`` is set."""
    GATE.wait()
    return np.load(path)
