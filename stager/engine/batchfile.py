"""A decoded minibatch in a file of shared memory, for the other jobs of a group (``staging.share``).

The file holds a small header, the pickled minibatch with a reference in
place of each array (``wire.pack``), and the arrays, page-aligned. Both
ways go through the kernel, never through a mapping: the publishing reader
writes the arrays with ``pwritev`` and a taking rank reads them with
``preadv`` straight into a slot of its own ``wire.Ring``. Writing 25 MB into
a fresh file through a mapping costs a page fault per 4 KiB on top of the
new pages (24 ms here), the kernel's copy into a file written before the
copy alone (6 ms; ``benchmarks/studies/shelf_copy.py``). And since no process maps a
file, the group's service may give it to the next publisher as soon as the
ranks taking it have read it (``group/shelf.py``).
"""

import os
import pickle
import struct

import numpy as np

from . import wire

_HEADER = struct.Struct("=QQQ")  # bytes of the pickled (head, table), offset of the arrays, their bytes
_ALIGN = 4096


def put(path, samples):
    """Writes a decoded minibatch into the file ``path`` (new, or one nobody reads any more)."""
    head, table, arrays, nbytes = wire.pack(samples)
    meta = pickle.dumps((head, table), protocol=5)
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


def read(path, ring):
    """The decoded minibatch at ``path``, its arrays in a slot of ``ring`` (``wire.Ring.read_file``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        first = os.pread(fd, _ALIGN, 0)
        length, offset, nbytes = _HEADER.unpack_from(first, 0)
        meta = first[_HEADER.size:_HEADER.size + length]
        if len(meta) < length:
            meta += os.pread(fd, length - len(meta), _HEADER.size + len(meta))
        head, table = pickle.loads(meta)
        return ring.read_file(fd, offset, nbytes, head, table)
    finally:
        os.close(fd)
