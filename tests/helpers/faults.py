"""Loaders that fail on purpose, importable by workers as ``faults:NAME``."""

import os
import select
import signal
import time

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


def fail_once_on_rank_1_image(path):
    """torchvision's PIL image loader, failing as ``fail_once_on_rank_1`` (for ImageFolder's ``loader=``)."""
    from torchvision.datasets.folder import default_loader

    _calls[0] += 1
    if (os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and os.environ.get("RANK") == "1"
            and _calls[0] == 20):
        raise RuntimeError(f"injected failure on rank 1 at {os.path.basename(path)}")
    return default_loader(path)


def fail_on_class_2(path):
    """Decodes ``.npy`` but raises for every sample of class directory ``c002``."""
    if "/c002/" in path:
        raise ValueError(f"unreadable sample {os.path.basename(path)}")
    return np.load(path)


def slow_on_rank_1(path):
    """Decodes ``.npy``, 20 ms per sample on rank 1: that rank falls behind the others."""
    if os.environ.get("PMI_RANK", os.environ.get("RANK")) == "1":
        time.sleep(0.02)  # stands in for a costly decode, not a wait
    return np.load(path)


def hold_then_fail_on_rank_2(path):
    """Decodes ``.npy`` for 16 samples per reader, then: rank 2 waits until every
    rank's record file (``$STAGER_TEST_RECORDS/rank-<r>.jsonl``) holds two lines, and fails
    (``$STAGER_TEST_FAULT`` ``fail``: an error, the job ends by ``MPI_Abort``; ``kill``: SIGKILLs
    its rank); the other ranks' readers hold their 17th sample until their rank is gone.

    With one reader per rank, every rank has then delivered exactly two minibatches of 8.
    """
    _calls[0] += 1
    if _calls[0] <= 16:
        return np.load(path)
    rank = os.environ["PMI_RANK"]
    if rank != "2":
        parent = os.pidfd_open(os.getppid())
        select.select([parent], [], [])  # until the job is ended
        raise RuntimeError("the rank is gone")
    records = os.environ["STAGER_TEST_RECORDS"]
    size = int(os.environ["PMI_SIZE"])
    deadline = time.monotonic() + 30
    # Another process's file reaching two lines has no event to wait on: poll it, bounded.
    while time.monotonic() < deadline:
        counts = []
        for r in range(size):
            try:
                with open(os.path.join(records, f"rank-{r}.jsonl"), "rb") as fh:
                    counts.append(fh.read().count(b"\n"))
            except FileNotFoundError:
                counts.append(0)
        # This rank's own too: its loop records its second minibatch only after the reader handed it over.
        if all(c >= 2 for c in counts):
            break
        time.sleep(0.05)
    if os.environ.get("STAGER_TEST_FAULT") == "kill":
        os.kill(os.getppid(), signal.SIGKILL)
    raise RuntimeError(f"injected failure on rank 2 at {os.path.basename(path)}")
