"""Loaders that fail on purpose, importable by workers as ``faults:NAME``."""

import os

import numpy as np

_calls = [0]


def fail_on_rank_2(path):
    """Decodes ``.npy`` but raises on rank 2's 20th sample, in the middle of an epoch."""
    _calls[0] += 1
    if os.environ.get("PMI_RANK") == "2" and _calls[0] == 20:
        raise RuntimeError(f"injected failure on rank 2 at {os.path.basename(path)}")
    return np.load(path)


def fail_on_class_2(path):
    """Decodes ``.npy`` but raises for every sample of class directory ``c002``."""
    if "/c002/" in path:
        raise ValueError(f"unreadable sample {os.path.basename(path)}")
    return np.load(path)
