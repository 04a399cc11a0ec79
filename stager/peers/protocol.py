"""One file from a node leader's local copy to another leader, over MPI.

The requester sends an ``Ask`` (tag ``ASK``) to the holder's leader and waits
on a tag of its own for an ``Offer``: the file's size and its first
``CHUNK`` bytes; ``PENDING`` when the holder owns the file and has not
staged it yet (its own ranks will: ask again later); or ``MISSING`` when it
has no complete copy (evicted, another size). A file larger than ``CHUNK`` goes on
in chunks of at most ``CHUNK`` bytes, each a plain buffer message on the
same tag; a small file (most samples) costs one round trip. A holder that cannot finish (a read error) sends an
empty chunk, and the requester stops; since the requester writes through
``sources.publish``, an unfinished transfer leaves nothing behind.

A published file is never rewritten in place, only removed, and a removed
file stays readable through a descriptor already open, so a holder that
opens the file before answering can always finish what it offers, even if
its cache evicts the file meanwhile.

Every wait polls its request with short sleeps rather than blocking in MPI:
a blocking call in MPICH spins a core, and peers' threads share cores with
training and the workers.
"""

import os
import time
from dataclasses import dataclass

ASK = 1                  # the tag every leader's server listens on
FIRST_REPLY_TAG = 16     # requesters draw their reply tags from here on
REPLY_TAGS = 30000       # MPI guarantees tags up to 32767
CHUNK = 1 << 20          # bytes per message: bounded, whatever the file's size
MISSING = -1
PENDING = -2


class PeerTimeout(OSError):
    """A peer leader did not answer in time."""


@dataclass(frozen=True, slots=True)
class Ask:
    """A request for one file.

    Attributes:
        index: Catalog index.
        rel: Relative path in the job directory.
        size: The catalog's size: the holder offers only a copy of this size.
        epoch: The requester's epoch (the holder's counters).
        tag: The tag the holder answers on.
    """

    index: int
    rel: str
    size: int
    epoch: int
    tag: int


@dataclass(frozen=True, slots=True)
class Offer:
    """The holder's answer: the file's ``size`` (or ``MISSING``) and its first bytes."""

    size: int
    first: bytes = b""


def wait(request, deadline, what, status=None):
    """Polls an MPI request until it completes; returns its (pickled) result.

    Args:
        status: An ``MPI.Status`` to fill (buffer receives), or None.

    Raises:
        PeerTimeout: At ``deadline`` (``time.monotonic``), naming ``what``.
    """
    pause = 20e-6
    while True:
        if status is not None:
            done, result = request.Test(status), None
        else:
            done, result = request.test()
        if done:
            return result
        if time.monotonic() > deadline:
            request.Cancel()
            raise PeerTimeout(f"no answer for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class _Incoming:
    """A pickled message still to arrive, polled like a request (a matched probe, then a receive).

    mpi4py's ``irecv`` receives into a fixed-size buffer; probing first takes
    a message of any size.
    """

    def __init__(self, comm, source, tag):
        self.comm, self.source, self.tag = comm, source, tag

    def test(self):
        message = self.comm.improbe(source=self.source, tag=self.tag)
        return (False, None) if message is None else (True, message.recv())

    def Cancel(self):
        pass


def serve(comm, peer, ask, root, timeout_s, pending=False):
    """Answers one ``Ask`` from ``peer`` with the local copy under ``root``.

    Args:
        pending: Whether to answer ``PENDING`` rather than ``MISSING`` when
            there is no copy (the file is still to come).

    Returns:
        Bytes sent (0 when the file was missing or the transfer was cut).

    Raises:
        PeerTimeout: When ``peer`` takes none of it within ``timeout_s``.
    """
    from mpi4py import MPI  # deferred: only rank processes import MPI

    deadline = time.monotonic() + timeout_s
    try:
        fd = os.open(os.path.join(root, ask.rel), os.O_RDONLY)
    except OSError:
        fd = None
    try:
        size = os.fstat(fd).st_size if fd is not None else MISSING
        if size != ask.size:
            answer = Offer(PENDING if pending and fd is None else MISSING)
            wait(comm.isend(answer, dest=peer, tag=ask.tag), deadline, f"file {ask.rel}")
            return 0
        first = os.pread(fd, min(CHUNK, size), 0)
        wait(comm.isend(Offer(size, first), dest=peer, tag=ask.tag), deadline, f"file {ask.rel}")
        sent = len(first)
        if sent < size:
            buf = bytearray(CHUNK)
        while sent < size:
            n = os.preadv(fd, [memoryview(buf)[:min(CHUNK, size - sent)]], sent)
            wait(comm.Isend([buf, n, MPI.BYTE], dest=peer, tag=ask.tag), deadline, f"file {ask.rel}")
            if n == 0:
                return 0  # the empty chunk told the requester to give up
            sent += n
        return sent
    finally:
        if fd is not None:
            os.close(fd)


def receive(comm, owner, ask, fd, timeout_s):
    """Asks ``owner`` for ``ask``'s file and writes what it sends to ``fd``.

    Returns:
        Bytes written, or ``MISSING`` when the owner has no copy, or
        ``PENDING`` when it has none yet.

    Raises:
        PeerTimeout: When the owner does not answer within ``timeout_s``.
        OSError: From writing, or ``EIO`` when the owner cut the transfer.
    """
    from mpi4py import MPI

    deadline = time.monotonic() + timeout_s
    what = f"file {ask.rel} from node leader {owner}"
    wait(comm.isend(ask, dest=owner, tag=ASK), deadline, what)
    offer = wait(_Incoming(comm, owner, ask.tag), deadline, what)
    if offer.size < 0:
        return offer.size
    got = _write_all(fd, offer.first)
    if got < offer.size:
        buf = bytearray(CHUNK)
        status = MPI.Status()
    while got < offer.size:
        want = min(CHUNK, offer.size - got)
        wait(comm.Irecv([buf, want, MPI.BYTE], source=owner, tag=ask.tag), deadline, what, status)
        n = status.Get_count(MPI.BYTE)
        if n == 0:
            raise OSError(5, f"node leader {owner} could not finish sending {ask.rel}")
        got += _write_all(fd, memoryview(buf)[:n])
    return got


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return len(data)
