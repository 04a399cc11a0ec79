"""A decoded minibatch in a file of shared memory, for the other jobs of a group (``staging.share``).

The file holds a small header, the pickled minibatch with a reference in
place of each array (``wire.pack``), and the arrays, page-aligned. The
publishing reader writes the arrays with ``pwrite``: writing 25 MB into a
fresh file through a mapping costs a page fault per 4 KiB on top of the new
pages (24 ms here), the kernel's copy into a file written before the copy
alone (6 ms; ``benchmarks/studies/shelf_copy.py``). A taking rank maps the
file copy-on-write and its arrays are views of the mapping: no copy at all
(a copy into the rank's own memory cost each of a group's jobs 6 ms a
minibatch, more than the rest of its work), and a consumer that writes into
an array writes into its own page, never the group's. The file is the
rank's until the arrays are gone (``group/shelf.py``).
"""

import mmap
import os
import pickle
import struct
import weakref

import numpy as np

from . import wire

_HEADER = struct.Struct("=QQQ")  # bytes of the pickled (head, table), offset of the arrays, their bytes
_ALIGN = 4096


def put(path, samples, seconds=0.0):
    """Writes a decoded minibatch into the file ``path`` (new, or one nobody reads any more).

    ``seconds``, the reader's time decoding it, travels with it: what each
    job that takes it was spared (its report's ``group``).
    """
    head, table, arrays, nbytes = wire.pack(samples)
    meta = pickle.dumps((head, table, seconds), protocol=5)
    offset = -(-(_HEADER.size + len(meta)) // _ALIGN) * _ALIGN
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _write(fd, _HEADER.pack(len(meta), offset, nbytes) + meta, 0)
        for (kind, start, dtype, shape, order), array in zip(table, arrays):
            # The bytes in the table's order: a view where the array is contiguous so, else one copy.
            _write(fd, memoryview(np.ravel(array, order=order).view(np.uint8)), offset + start)
    finally:
        os.close(fd)


def _write(fd, data, at):
    data = memoryview(data)
    while data:
        done = os.pwrite(fd, data, at)
        data, at = data[done:], at + done


def read(path, gone):
    """``(minibatch, seconds)``: the decoded minibatch at ``path``, its arrays views of a private mapping of
    the file, and the publishing reader's seconds decoding it.

    Args:
        path: The shelf's file.
        gone: Called, with no arguments and from whatever thread drops them,
            once none of the minibatch's arrays is left (at once if it has none).

    Raises:
        EOFError: The file is shorter than its header says.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        first = os.pread(fd, _ALIGN, 0)
        if len(first) < _HEADER.size:
            raise EOFError(f"the file holds {len(first)} bytes, less than its header")
        length, offset, nbytes = _HEADER.unpack_from(first, 0)
        meta = first[_HEADER.size:_HEADER.size + length]
        if len(meta) < length:
            meta += os.pread(fd, length - len(meta), _HEADER.size + len(meta))
        head, table, seconds = pickle.loads(meta)
        if not nbytes:
            gone()
            return wire.unpack(head, np.empty(0, np.uint8), table), seconds
        size = os.fstat(fd).st_size
        if size < offset + nbytes:
            raise EOFError(f"the file ends {offset + nbytes - size} bytes early")
        view = mmap.mmap(fd, offset + nbytes, access=mmap.ACCESS_COPY)
        root = np.frombuffer(view, np.uint8, nbytes, offset)
        # Every array below is a view of ``root``: the mapping goes, and ``gone`` runs, with the last one.
        weakref.finalize(root, gone).atexit = False
        return wire.unpack(head, root, table), seconds
    finally:
        os.close(fd)
