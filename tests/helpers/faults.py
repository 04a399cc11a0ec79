"""Loaders that fail on purpose, importable by workers as ``faults:NAME``."""

import os

import numpy as np

_calls = [0]


def _fail_on_rank(rank, path, when=True):
    # PMI_RANK under mpiexec, RANK under torchrun; the 20th sample a reader
    # decodes lies in the middle of an epoch.
    _calls[0] += 1
    if when and os.environ.get("PMI_RANK", os.environ.get("RANK")) == rank and _calls[0] == 20:
        raise RuntimeError(f"injected failure on rank {rank} at {os.path.basename(path)}")
    return np.load(path)


def fail_on_rank_2(path):
    """Decodes ``.npy`` but raises on rank 2's 20th sample, in the middle of an epoch."""
    return _fail_on_rank("2", path)


def fail_on_rank_1(path):
    """Decodes ``.npy`` but raises on rank 1's 20th sample."""
    return _fail_on_rank("1", path)


def fail_once_on_rank_1(path):
    """As ``fail_on_rank_1``, in torchrun's first worker group only (``TORCHELASTIC_RESTART_COUNT`` 0)."""
    return _fail_on_rank("1", path, os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0")


def fail_on_class_2(path):
    """Decodes ``.npy`` but raises for every sample of class directory ``c002``."""
    if "/c002/" in path:
        raise ValueError(f"unreadable sample {os.path.basename(path)}")
    return np.load(path)
