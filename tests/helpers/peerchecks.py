"""Loaders for the peer tests, importable by workers as ``peerchecks:NAME``."""

import os
import signal
import time

import numpy as np

_calls = [0]


def same_as_source(path):
    """Decodes ``.npy`` after checking the staged bytes against the source's (``STAGER_TEST_SOURCE``)."""
    rel = os.path.join(*path.split(os.sep)[-2:])  # <class>/<file> in the synthetic layout
    with open(path, "rb") as staged, open(os.path.join(os.environ["STAGER_TEST_SOURCE"], rel), "rb") as source:
        if staged.read() != source.read():
            raise ValueError(f"staged {rel} differs from the source")
    return np.load(path)


def kill_leader_of_b(path):
    """Decodes ``.npy``; on global rank 2 (node b's leader), SIGKILLs that rank at its 150th sample,
    after writing the moment to ``STAGER_TEST_KILLED``."""
    _calls[0] += 1
    if os.environ.get("PMI_RANK") == "2" and _calls[0] == 150:
        with open(os.environ["STAGER_TEST_KILLED"], "w") as fh:
            fh.write(repr(time.time()))
        os.kill(os.getppid(), signal.SIGKILL)
    return np.load(path)
