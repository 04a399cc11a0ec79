"""Files from a node leader's local copies to another leader, over MPI.

The requester sends an ``Ask`` (tag ``ASK``) for a few files to their
holder's leader, and receives on a tag of its own, file after file in the
order asked, an ``Offer``: the file's size and its first ``CHUNK`` bytes;
``PENDING`` when the holder owns the file and has not staged it yet (its own
ranks will: ask again later), with the holder's position (its slowest rank's
latest request), so the asker can tell a holder behind from a stuck one; or ``MISSING`` when it has no complete copy
(evicted, another size); or ``MOVED`` when it gave the file to another
node, with that node's rank, which the asker asks next. A file larger than ``CHUNK`` goes on in chunks of
at most ``CHUNK`` bytes, each a plain buffer message on the same tag, so a
minibatch's small files cost one round trip together. A holder that cannot
finish a file (a read error) sends an empty chunk and goes on with the next.
An ``Ask`` may carry files the requester dropped to make room for what it
asks (``offers``, their bytes with them: the requester's disk never holds
more than its capacity); after answering, the holder keeps those it has
room for (``engine.peers.swaps``).
The requester writes through ``sources.publish``, so an unfinished transfer
leaves nothing behind, and it takes every message of the answer even when it
cannot keep a file (a full disk), so the two sides stay in step.

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
MOVED = -3
OFFER_MAX = CHUNK  # bytes: larger files are not offered (an offer travels whole, in the request)


class PeerTimeout(OSError):
    """A peer leader did not answer in time."""


@dataclass(frozen=True, slots=True)
class Ask:
    """A request for a few files of one holder.

    Attributes:
        files: ``(index, relpath, size)`` each: the catalog's index, the path
            in the job directory, and the catalog's size (the holder offers
            only a copy of this size).
        epoch: The requester's epoch (the holder's counters).
        tag: The tag the holder answers on.
        seq: The requester's minibatch sequence number (the step the
            holder hands the files on for), or -1.
        offers: ``(index, relpath, size, mtime_ns, data)`` each: files the
            requester dropped for these, for the holder to keep if it can.
    """

    files: list
    epoch: int
    tag: int
    seq: int = -1
    offers: tuple = ()


@dataclass(frozen=True, slots=True)
class Offer:
    """The holder's answer: the file's ``size`` (``MISSING``, ``PENDING``) and its first bytes.

    Attributes:
        at: With ``PENDING``: the holder's position (its slowest rank's latest
            request); with ``MOVED``: the rank of the leader it gave the file to.
    """

    size: int
    first: bytes = b""
    at: int = -1


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


def serve(comm, peer, ask, root, timeout_s, to_come, position=lambda: -1, moved=lambda index: -1):
    """Answers one ``Ask`` from ``peer`` with the local copies under ``root``.

    Args:
        to_come: Callable ``(index) -> bool``: answer ``PENDING`` rather than
            ``MISSING`` for a file not here (it is still to come).
        position: Callable: the holder's position, sent with ``PENDING``.
        moved: Callable ``(index) -> rank``: the leader a file not here was
            given to (answered ``MOVED``), or -1.

    Yields:
        ``(index, bytes sent)`` per file (0: missing, pending or cut).

    Raises:
        PeerTimeout: When ``peer`` takes nothing within ``timeout_s``.
    """
    from mpi4py import MPI  # deferred: only rank processes import MPI

    deadline = time.monotonic() + timeout_s
    buf = None
    offers = []  # answers on their way: waited for together, so files do not wait on each other's handshakes
    for index, rel, expected in ask.files:
        fd = _open(root, rel)
        try:
            offer = None
            if fd is None:
                to = moved(index)
                if to >= 0:
                    offer = Offer(MOVED, at=to)
                elif to_come(index):
                    offer = Offer(PENDING, at=position())
                else:
                    # A copy published between the open and the cache's answer is no longer to come
                    # but here: looked for once more, or the asker would read it from the source again.
                    fd = _open(root, rel)
            size = os.fstat(fd).st_size if fd is not None else MISSING
            if offer is None and size != expected:
                offer = Offer(MISSING)
            if offer is not None:
                offers.append(comm.isend(offer, dest=peer, tag=ask.tag))
                yield index, 0
                continue
            first = os.pread(fd, min(CHUNK, size), 0)
            offers.append(comm.isend(Offer(size, first), dest=peer, tag=ask.tag))
            sent = len(first)
            while sent < size:
                buf = buf or bytearray(CHUNK)
                n = os.preadv(fd, [memoryview(buf)[:min(CHUNK, size - sent)]], sent)
                wait(comm.Isend([buf, n, MPI.BYTE], dest=peer, tag=ask.tag), deadline, f"file {rel}")
                if n == 0:
                    break  # the empty chunk told the requester to give up this file
                sent += n
            yield index, sent if sent == size else 0
        finally:
            if fd is not None:
                os.close(fd)
    for request in offers:
        wait(request, deadline, f"node leader {peer} to take its files")


def _open(root, rel):
    try:
        return os.open(os.path.join(root, rel), os.O_RDONLY)
    except OSError:
        return None


def ask_for(comm, owner, ask, timeout_s):
    """Sends ``ask`` to ``owner``; the answers are then taken with ``receive``, file by file, in order."""
    wait(comm.isend(ask, dest=owner, tag=ASK), time.monotonic() + timeout_s, f"node leader {owner}")


def receive(comm, owner, tag, rel, write, timeout_s):
    """Takes the answer for one file of an ``Ask``, passing its bytes to ``write``.

    Every message of the answer is taken even if ``write`` fails, so the next
    file's answer starts where it should.

    Returns:
        ``(outcome, at)``: bytes received, ``MISSING``, ``PENDING`` or
        ``MOVED``; and with ``PENDING``, the holder's position, with
        ``MOVED``, the leader to ask instead (else -1).

    Raises:
        PeerTimeout: When the owner does not answer within ``timeout_s``.
        OSError: From ``write``, or ``EIO`` when the owner cut the transfer.
    """
    from mpi4py import MPI

    deadline = time.monotonic() + timeout_s
    what = f"file {rel} from node leader {owner}"
    offer = wait(_Incoming(comm, owner, tag), deadline, what)
    if offer.size < 0:
        return offer.size, offer.at
    error = None

    def keep(data):
        nonlocal error
        if error is None:
            try:
                write(data)
            except OSError as exc:
                error = exc

    keep(offer.first)
    got = len(offer.first)
    if got < offer.size:
        buf = bytearray(CHUNK)
        status = MPI.Status()
    while got < offer.size:
        want = min(CHUNK, offer.size - got)
        wait(comm.Irecv([buf, want, MPI.BYTE], source=owner, tag=tag), deadline, what, status)
        n = status.Get_count(MPI.BYTE)
        if n == 0:
            error = error or OSError(5, f"node leader {owner} could not finish sending {rel}")
            break
        keep(memoryview(buf)[:n])
        got += n
    if error is not None:
        raise error
    return got, -1


def write_all(fd, data):
    """Writes all of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
