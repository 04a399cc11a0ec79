"""A loader whose readers outlive their parent on purpose, importable by workers as ``orphans:NAME``.

``npy_once_orphaned`` marks that it started decoding (a file named after the
reader's pid in ``$STAGER_TEST_MARKS``), waits until the reader's parent is
gone (killed by the test), then decodes and returns: the reader then
replies to a parent that no longer exists.
"""

import os
import time

import numpy as np

_parent = []  # the reader's first parent, kept across calls: the next call must not wait for its successor


def npy_once_orphaned(path):
    """Decodes ``.npy`` once the calling reader's parent has died."""
    if not _parent:
        _parent.append(os.getppid())
    marks = os.environ["STAGER_TEST_MARKS"]
    with open(os.path.join(marks, str(os.getpid())), "w"):
        pass
    while os.getppid() == _parent[0]:  # no event announces a parent's death to a child that is not a subreaper
        time.sleep(0.01)
    return np.load(path)
