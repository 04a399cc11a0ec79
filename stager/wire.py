"""How a reader's replies cross its pipe: arrays travel as raw bytes, once.

``Connection.send`` pickles a minibatch's arrays into one bytes object, the
kernel copies it through a 64 KiB pipe in dozens of wake-ups, and the
receiver reads it into a buffer and unpickles a copy of every array: five
copies of each sample. Here the arrays are pickled out of band (pickle
protocol 5): a small header goes first, then each array's memory is written
as it is and read straight into the buffer the received array will use. The
pipe is widened to 1 MiB so a minibatch crosses in a few wake-ups, which
matters on virtual machines, where every wake-up costs.

A message is a ``Connection.send_bytes`` frame holding ``(pickle, [sizes])``
followed by one raw block per size. A sender that dies mid-message leaves
end-of-file, which ``recv`` reports as ``EOFError``, never a hang.
"""

import fcntl
import os
import pickle

import numpy as np

PIPE_BYTES = 1 << 20


def widen(conn):
    """Asks for a 1 MiB pipe buffer; keeps the default where the system caps it lower."""
    try:
        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):
        pass  # /proc/sys/fs/pipe-max-size is lower, or not Linux: only slower


def send(conn, obj):
    """Sends ``obj``; its contiguous arrays are written without being copied.

    Plain pickle, not ``ForkingPickler``: a torch tensor from a custom loader
    travels by value rather than as a shared-memory descriptor, which would
    need the reader to outlive the message and costs a descriptor per tensor.
    """
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    conn.send_bytes(pickle.dumps((head, [r.nbytes for r in raws]), protocol=5))
    fd = conn.fileno()
    for raw in raws:
        while raw:
            raw = raw[os.write(fd, raw):]


def recv(conn):
    """Receives what ``send`` sent; arrays come back backed by their own new buffers.

    Raises:
        EOFError: If the sender closed or died before the whole message came.
    """
    head, sizes = pickle.loads(conn.recv_bytes())
    fd = conn.fileno()
    buffers = []
    for size in sizes:
        buf = np.empty(size, dtype=np.uint8)
        view, got = memoryview(buf), 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise EOFError(f"the sender stopped {size - got} bytes short of a message")
            got += n
        buffers.append(buf)
    return pickle.loads(head, buffers=buffers)
