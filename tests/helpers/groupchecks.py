"""Loaders for the shared-group tests, importable by readers as ``groupchecks:NAME``."""

import os

import numpy as np


def counted(path):
    """Decodes ``.npy`` after checking the staged bytes against a copy of the source
    (``STAGER_TEST_COPY``), and appends the sample's name to this reader's line in
    ``STAGER_TEST_DECODES`` (one file per process: every decode call is counted).

    Where ``STAGER_TEST_HOLD_AT`` names the sample (``<class>/<file>``), its
    decoding first waits for the test to hold the FIFO ``STAGER_TEST_HOLD``
    open for writing: opening a FIFO to read blocks until a writer has it,
    so the job stays inside that minibatch until the test lets it go."""
    rel = os.path.join(*path.split(os.sep)[-2:])  # <class>/<file> in the synthetic layout
    with open(path, "rb") as staged, open(os.path.join(os.environ["STAGER_TEST_COPY"], rel), "rb") as source:
        if staged.read() != source.read():
            raise ValueError(f"staged {rel} differs from the source")
    if rel == os.environ.get("STAGER_TEST_HOLD_AT"):
        os.close(os.open(os.environ["STAGER_TEST_HOLD"], os.O_RDONLY))
    with open(os.path.join(os.environ["STAGER_TEST_DECODES"], str(os.getpid())), "a") as log:
        log.write(rel + "\n")
    return np.load(path)
