"""How a reader's replies reach the rank: array data through shared memory, the rest in a small pickle.

Pickling a decoded minibatch through a pipe costs far more than its bytes:
an array that is not contiguous (a channel-first image made by a transpose)
is serialised in band, copied by the kernel in dozens of wake-ups and
unpickled into a copy, about 7 ms for a 786 KB sample; even a copy into
fresh memory costs a page fault per 4 KiB, about 1 ms per such sample on a
virtual machine. Here each reader owns a ``Ring``: a ``memfd`` of slots, each
a minibatch's worth (grown to fit the largest seen), mapped once by the
reader and once by the rank and then reused, so no page is faulted twice.
The reader writes every array (numpy, or a CPU torch tensor from a custom
loader), whatever its strides, straight into a free slot (one copy, which
also makes it contiguous), and pickles only the rest, with a reference to
each array, into a small message on its pipe. The rank's arrays are views of
the slot.

**Lifetime rule.** The arrays and tensors of a ``Batch`` are ordinary,
writable objects backed by their slot, which is handed back to the reader
only when every one of them has been garbage-collected. So a sample may be
kept (or changed in place) as long as the caller likes and no later
minibatch ever overwrites it; what is kept stays in shared memory, and a
reader whose slots are all held makes a new one. One sample kept holds its
whole minibatch's slot: ``numpy.array(sample)`` keeps only its own bytes. Copies (``torch.stack``,
``default_collate``, ``concat_examples``) free the slot as soon as the batch
itself is dropped.

A message is a ``Connection.send_bytes`` frame holding ``(pickle, slot,
table)``: ``slot`` is ``(offset, size)`` in the memfd (None when no array
went through it) and ``table`` lists ``(kind, start, dtype, shape, order)``
per array. The rank returns a slot by writing its offset into the ring's
``freed`` pipe, which the reader empties before choosing a slot. A sender
that dies mid-message leaves end-of-file, which ``recv`` reports as
``EOFError`` or ``OSError``, never a hang. A sender never waits for a slot,
and one told to stop abandons its copy, so a reader told to stop ends within
one array's copy.
"""

import fcntl
import io
import mmap
import os
import pickle
import struct
import sys
import threading
import weakref
from multiprocessing import reduction

import numpy as np

PIPE_BYTES = 1 << 20
_ALIGN = 64          # each array starts on a cache line
_IN_BAND = 1024      # smaller arrays and bytes travel in the pickle: a table entry costs more


def widen(conn):
    """Asks for a 1 MiB pipe buffer; keeps the default where the system caps it lower."""
    try:
        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):
        pass  # /proc/sys/fs/pipe-max-size is lower, or not Linux: only slower


def _torch_array(obj):
    # A CPU tensor as a numpy view of the same memory, or None where numpy
    # has no equal dtype (bfloat16) or the tensor is not plain (sparse, on a GPU).
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    try:
        return obj.detach().numpy()
    except (RuntimeError, TypeError):
        return None


class _Collector(pickle.Pickler):
    """Pickles a message, setting aside the arrays that go into the ring."""

    def __init__(self, file):
        super().__init__(file, protocol=5)
        self.found = []

    def persistent_id(self, obj):
        if type(obj) is np.ndarray:
            kind, array = "array", obj
        elif type(obj) is bytes:
            kind, array = "bytes", (np.frombuffer(obj, np.uint8) if len(obj) >= _IN_BAND else None)
        else:
            kind, array = "torch", _torch_array(obj)
        if array is None or array.dtype.hasobject or array.nbytes < _IN_BAND:
            return None
        self.found.append((kind, array))
        return len(self.found) - 1


class Ring:
    """One reader's shared memory, and the pipe that hands its slots back.

    Made by the rank before its reader starts; the reader sends through it,
    the rank receives. Picklable while a process is being started (its
    descriptors reach the child as ``multiprocessing`` hands pipes over);
    with ``fork`` the child keeps ``fds`` (list them in ``keep_fds``).
    """

    def __init__(self):
        self.fd = os.memfd_create("stager-ring", os.MFD_CLOEXEC)
        # Non-blocking both ways: the reader empties it without waiting, and
        # a slot freed after its reader is gone must not block the rank.
        self._freed_r, self._freed_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._setup()

    def _setup(self):
        self._maps = {}       # slot offset -> mmap of that slot (both sides)
        self._sizes = {}      # sender: slot offset -> bytes
        self._idle = set()    # sender: slots the rank has handed back
        self._end = 0         # sender: the memfd's size
        # Receiver: finalisers against close(). Reentrant: a collection that
        # frees a slot's last array may run inside either, on the same thread.
        self._lock = threading.RLock()

    @property
    def fds(self):
        """The descriptors a forked reader must keep."""
        return [self.fd, self._freed_r]

    def __getstate__(self):
        return {"fd": reduction.DupFd(self.fd), "freed": reduction.DupFd(self._freed_r)}

    def __setstate__(self, state):
        self.fd, self._freed_r, self._freed_w = state["fd"].detach(), state["freed"].detach(), -1
        self._setup()

    def close(self):
        """Closes this process's descriptors; arrays still held keep their memory. Safe twice."""
        with self._lock:
            for name in ("fd", "_freed_r", "_freed_w"):
                if getattr(self, name) >= 0:
                    os.close(getattr(self, name))
                    setattr(self, name, -1)
            self._maps = {}  # each mapping goes with the last array that uses it

    def _map(self, offset, size):
        got = self._maps.get(offset)
        if got is None or len(got) < size:
            got = self._maps[offset] = mmap.mmap(self.fd, size, offset=offset)
        return got

    def _slot(self, nbytes):
        """Offset of an idle slot of at least ``nbytes``, made if there is none."""
        try:
            while True:
                freed = os.read(self._freed_r, 1 << 16)
                if not freed:
                    break
                self._idle.update(x for (x,) in struct.iter_unpack("=Q", freed))
        except BlockingIOError:
            pass  # emptied
        fits = [off for off in self._idle if self._sizes[off] >= nbytes]
        if fits:
            offset = min(fits, key=self._sizes.get)
            self._idle.discard(offset)
            return offset
        # New slots are at least as big as the biggest so far, with room to
        # spare, so a dataset of varying sizes settles on a few slots.
        size = max([int(nbytes * 1.25)] + list(self._sizes.values()))
        size = -(-size // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY
        offset, self._end = self._end, self._end + size
        os.ftruncate(self.fd, self._end)
        self._sizes[offset] = size
        return offset

    def send(self, conn, obj, stop=None):
        """Sends ``obj``; each of its arrays is copied once, into a slot.

        Args:
            conn: The reader's reply pipe.
            obj: What to send (a ``Decoded`` or a ``Failure``).
            stop: An event; once it is set the copy is abandoned (a
                minibatch's first copy into a new slot faults in every page
                of it, tens of milliseconds nobody will use).

        Returns:
            False if ``stop`` ended the copy (nothing was sent).
        """
        head, table, arrays, end = pack(obj)
        slot = None
        if table:
            offset = self._slot(end)
            slot = (offset, self._sizes[offset])
            if not copy_arrays(self._map(*slot), table, arrays, stop):
                self._idle.add(offset)
                return False
        conn.send_bytes(pickle.dumps((head, slot, table), protocol=5))
        return True

    def recv(self, conn):
        """Receives what ``send`` sent; arrays are views of their slot (see the lifetime rule).

        Raises:
            EOFError: If the sender closed before sending a message.
            OSError: If it died in the middle of one ("got end of file during message").
        """
        head, slot, table = pickle.loads(conn.recv_bytes())
        if slot is None:
            return pickle.loads(head)
        root = np.frombuffer(self._map(*slot), np.uint8)
        # Every view below keeps ``root`` alive, so its end is the last one's.
        weakref.finalize(root, self._release, slot[0]).atexit = False
        return unpack(head, root, table)

    def _release(self, offset):
        with self._lock:
            if self._freed_w < 0:
                return  # the pool has stopped: nobody reuses slots any more
            try:
                os.write(self._freed_w, struct.pack("=Q", offset))
            except OSError:
                pass  # the reader is gone or its pipe full (it stopped reading): the slot is moot


def pack(obj):
    """Pickles ``obj`` apart from its arrays: ``(head, table, arrays, bytes the arrays need)``.

    ``table`` lists ``(kind, start, dtype, shape, order)`` per array, each
    start aligned; ``copy_arrays`` puts them in a buffer, ``unpack`` rebuilds
    ``obj`` with views of it.
    """
    head = io.BytesIO()
    collector = _Collector(head)
    collector.dump(obj)
    table, end = [], 0
    for kind, array in collector.found:
        order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
        table.append((kind, end, array.dtype, array.shape, order))
        end += -(-array.nbytes // _ALIGN) * _ALIGN
    return head.getvalue(), table, [array for _, array in collector.found], end


def copy_arrays(buffer, table, arrays, stop=None):
    """Copies ``pack``'s arrays into ``buffer``; False if ``stop`` was set on the way."""
    for (kind, start, dtype, shape, order), array in zip(table, arrays):
        if stop is not None and stop.is_set():
            return False
        dst = np.frombuffer(buffer, np.uint8, array.nbytes, start).view(dtype)
        np.copyto(dst.reshape(shape, order=order), array, casting="no")
    return True


def unpack(head, root, table):
    """``obj`` again from ``pack``'s head and table, its arrays views of ``root`` (a uint8 array)."""
    objects = [_rebuild(kind, root[start:start + _nbytes(dtype, shape)].view(dtype).reshape(shape, order=order))
               for kind, start, dtype, shape, order in table]
    return _Loader(io.BytesIO(head), objects).load()


def _nbytes(dtype, shape):
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def _rebuild(kind, array):
    if kind == "bytes":
        return array.tobytes()
    if kind == "torch":
        import torch  # the sender had it, so the receiver's loader does too

        return torch.from_numpy(array)
    return array


class _Loader(pickle.Unpickler):
    def __init__(self, file, objects):
        super().__init__(file)
        self.objects = objects

    def persistent_load(self, pid):
        return self.objects[pid]
