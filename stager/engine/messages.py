"""Every message that crosses a pipe, socket or queue between stager's parts.

Who sends what (the arrows of ``docs/architecture.md``):

- rank -> a shared group's service (``staging.share``): ``Join`` first,
  answered by ``Welcome`` (or a refusal naming the conflicting setting);
- rank coordinator -> node service: ``Hello`` once, then ``Need`` per
  minibatch, in a shared group ``Claim`` when about to decode it (answered
  by ``Claimed``), ``Release`` once it has been read, ``LetGo`` once the
  arrays of a minibatch it took from the group's shelf are gone, ``Bye`` at
  the end, ``Fail`` when the rank fails;
- node service -> rank coordinator: ``Ready`` when a minibatch's files are
  all local, or the ``Failure`` that stopped staging;
- node service -> prefetchers: ``StageTask``; prefetchers -> service:
  ``Staged`` or ``Failure``;
- node service -> peer fetch threads (``staging.peers``): ``PeerFetch``;
  they reply ``Staged`` (saying which way the file came) or ``Failure``;
  the peer server thread -> node service: ``Given`` (files another node
  gave this one wait in ``Peers.given``: the bytes never cross the pipe);
- coordinator -> readers: ``ReadTask``; readers -> coordinator: ``Decoded``
  or ``Failure``;
- consumer thread -> coordinator: ``Consumed`` (and a bare wake-up).

Messages are small frozen dataclasses with slots: cheap to pickle, named
fields instead of positions. A ``Failure`` knows where it happened and turns
into the caller's ``StageError`` in one place.
"""

import traceback
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ..errors import StageError


@dataclass(frozen=True, slots=True)
class Hello:
    """A rank introduces itself to its node's service.

    Attributes:
        rank: Global rank.
        plan: What the rank will read, as a description the service can
            evaluate (``plan.PlanSpec``), or None when only the rank knows
            (a custom order sampler).
        stream: In a shared group, the rank's decoded stream: ranks of jobs
            whose plan, rank and decoding agree name the same one and share
            decoded minibatches; None: this rank decodes for itself.
        ahead: Minibatches the rank asks for past the one its consumer
            holds: it asks for ``s`` only once it has read ``s - ahead``, so
            the service lets that minibatch's files go then (``readpins``).
    """

    rank: int
    plan: Any = None
    stream: Optional[str] = None
    ahead: int = 0


@dataclass(frozen=True, slots=True)
class Join:
    """A job's rank asks to attach to a shared group's service.

    Attributes:
        job: Who asks (job id and rank), for the group's messages.
        settings: ``{config key: value}`` that every job of the group must
            agree on (the dataset, the catalog's fingerprint, the staging
            settings the service runs with).
    """

    job: str
    settings: dict


@dataclass(frozen=True, slots=True)
class Welcome:
    """The group's answer to ``Join``: where its files are, or why this job may not attach.

    Attributes:
        local_dir: The group's node-local directory of staged files.
        ahead: Minibatches each rank may have pinned ahead (the cache's window).
        refused: Why the job was refused (a conflicting setting), or None.
        rates: The group's probe (``perf.Rates.to_dict()``), where its
            counts are ``auto``: a job that joins takes them rather than
            reading the source for a probe of its own. None otherwise.
        counts: ``(prefetchers, files each keeps in flight or None, jobs
            attached with this one)``, the group's now.
        capacity: The group's node cache's capacity in bytes, or None
            (unbounded): what its decoded tier's room is chosen from.
    """

    local_dir: Optional[str] = None
    ahead: int = 0
    refused: Optional[str] = None
    rates: Optional[dict] = None
    counts: Optional[tuple] = None
    capacity: Optional[int] = None


@dataclass(frozen=True, slots=True)
class Need:
    """A rank needs a minibatch's files local: ``seq`` is the rank's own sequence number."""

    seq: int
    epoch: int
    step: int
    indices: Any  # int64 array of catalog indices


@dataclass(frozen=True, slots=True)
class Release:
    """A rank has read minibatch ``seq``: its files need not stay pinned for it.

    ``published``: the rank decoded it for its group and put it on the shelf.
    ``held``: the rank took it from the shelf and its arrays are views of
    the shelf's file, which stays the rank's until ``LetGo``.
    """

    seq: int
    published: bool = False
    held: bool = False


@dataclass(frozen=True, slots=True)
class LetGo:
    """The arrays of minibatch ``seq``, taken from the group's shelf (``Release(held=True)``), are gone:
    the shelf's file may be written again."""

    seq: int


@dataclass(frozen=True, slots=True)
class Bye:
    """A rank leaves its node's service."""


@dataclass(frozen=True, slots=True)
class Fail:
    """A rank failed; the service tells the node's other ranks ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Ready:
    """All files of the rank's minibatch ``seq`` are local; ``seconds`` of prefetcher time went into them.

    ``group``, in a shared group (``staging.share``): ``(files, bytes)`` of
    the minibatch that another job had staged (or was staging), then
    ``(files, bytes)`` this request fetched from the source; None alone.
    ``span``: how long its fetches took once handed out (``Dispatch.seconds``;
    0 when nothing was fetched), what a look-ahead must hide; ``spare``: a
    prefetcher had nothing to do when it was answered (a deeper look-ahead
    would give it work).
    """

    seq: int
    seconds: float
    group: Optional[Tuple[int, int, int, int]] = None
    span: float = 0.0
    spare: bool = False


@dataclass(frozen=True, slots=True)
class Claim:
    """A rank of a shared group is about to decode minibatch ``seq``: who decodes it?"""

    seq: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """The group's answer to ``Claim``: ``verdict`` ``publish`` (decode it and put it at ``path`` for the
    others), ``shared`` (another job decoded it: read it from ``path``, held until ``Release``, or until ``LetGo`` when the
    rank maps it) or ``own``
    (the job decoding it is late: decode it for this rank alone; ``path`` empty)."""

    seq: int
    verdict: str
    path: str


@dataclass(frozen=True, slots=True)
class StageTask:
    """Files for one prefetcher to fetch: ``files`` holds ``(index, relpath, size, mtime_ns)``."""

    task: int
    epoch: int
    step: int
    files: List[Tuple[int, str, int, Optional[int]]]


@dataclass(frozen=True, slots=True)
class PeerFetch:
    """Files for a peer fetch thread to ask leader ``owner`` for: ``files`` holds ``(index, relpath, size, mtime_ns)``.

    ``offers``: files this node dropped to make room for these, with their
    bytes (``protocol.Ask.offers``), for ``owner`` to keep. ``hops``: how
    many holders answered ``MOVED`` on the way here.
    """

    task: int
    epoch: int
    step: int
    owner: int
    files: List[Tuple[int, str, int, Optional[int]]]
    seq: int = -1
    offers: tuple = ()
    hops: int = 0


@dataclass(frozen=True, slots=True)
class Adopt:
    """Files leader ``giver`` gave this node (``protocol.Ask.offers``), for the service to keep if it has room.

    ``handed``: the files this node sent the giver in the same exchange, for
    its step ``seq``; they count as handed on (``holders.served``) only as
    the gifts are kept, so the room they leave is there for them.
    """

    giver: int
    epoch: int
    files: tuple
    handed: tuple = ()
    seq: int = -1


@dataclass(frozen=True, slots=True)
class Given:
    """A wake-up: ``Adopt``s wait for the service in ``Peers.given`` (a message of a few bytes, so the
    server thread never blocks on a pipe the service has stopped reading)."""


@dataclass(frozen=True, slots=True)
class Staged:
    """A prefetcher (or peer fetch thread) finished ``task``: ``done`` holds ``(index, bytes_fetched)``.

    ``bytes_fetched`` is ``PRESENT`` for a file already there (0 is an empty
    file, copied like any other), ``NO_SPACE`` for one the
    local file system had no room for (the service makes room and retries).
    ``route`` says where the bytes came from: ``source`` (the shared file
    system), ``peer`` (another node leader's copy) or ``fallback`` (the
    shared file system, because the leader holding the file stalled or left).
    ``seconds`` is the task's span (handed out to done). ``busy_s``: the
    seconds its files each kept a fetch going, summed (the span where they
    were fetched one after another; None: ``seconds``); ``cpu_s`` of them on a
    core and ``queued_s`` waiting for one (``perf.clock``), each None where
    not known: the rest waited on the source.
    """

    task: int
    worker: Any
    done: List[Tuple[int, int]]
    seconds: float
    epoch: int
    route: str = "source"
    cpu_s: Optional[float] = None
    busy_s: Optional[float] = None
    queued_s: Optional[float] = None


@dataclass(frozen=True, slots=True)
class ReadTask:
    """A minibatch for one reader to decode: ``files`` holds ``(index, relpath, label_or_None)``.

    ``publish``: where to put the decoded minibatch for the rank's group too, or None.
    """

    seq: int
    epoch: int
    step: int
    files: List[Tuple[int, str, Optional[int]]]
    publish: Optional[str] = None


@dataclass(frozen=True, slots=True)
class Decoded:
    """A reader's decoded minibatch ``seq``; ``published``: it is on the group's shelf too.

    ``samples`` is the list of decoded samples, or, where the decoder
    collates (``collated``), the one object its ``collate`` made of them;
    ``count`` is the number of samples either way.
    """

    seq: int
    worker: int
    samples: object
    seconds: float
    published: bool = False
    count: int = 0
    collated: bool = False
    decoded: object = None  # with a decoded tier: ``DecodedTier.progress()`` over this minibatch


@dataclass(frozen=True, slots=True)
class Consumed:
    """The consumer took minibatch ``seq``, after waiting ``stall`` seconds for it."""

    seq: int
    stall: float = 0.0


@dataclass(frozen=True, slots=True)
class Failure:
    """Something failed; where, and why.

    Attributes:
        stage: ``prefetch``, ``read`` or ``pipeline``.
        worker: Which worker (process name, ``service``, ``node leader``).
        epoch: Epoch of the minibatch concerned, or None.
        step: Step of the minibatch concerned, or None.
        path: Relative path of the file concerned, or None.
        cause: Name of the original exception type.
        message: What happened, for a person.
        traceback: The formatted traceback where it happened, or None.
    """

    stage: str
    worker: str
    epoch: Optional[int] = None
    step: Optional[int] = None
    path: Optional[str] = None
    cause: str = ""
    message: str = ""
    traceback: Optional[str] = None

    @classmethod
    def from_exception(cls, stage, worker, exc, epoch=None, step=None, path=None, message=None):
        """The failure for ``exc``, raised in the current ``except`` block."""
        return cls(stage, str(worker), epoch, step, path, type(exc).__name__,
                   message or f"{type(exc).__name__}: {exc}", traceback.format_exc())

    def to_error(self):
        """The ``StageError`` that the caller receives."""
        return StageError(f"{self.stage} worker {self.worker} failed: {self.message}", stage=self.stage,
                          epoch=self.epoch, step=self.step, path=self.path, cause=self.cause,
                          remote_traceback=self.traceback)


def worker_died(stage, proc):
    """The failure for a worker process that ended without reporting one."""
    return Failure(stage, proc.name, cause="WorkerDied",
                   message=f"{proc.name} (pid {proc.pid}) died (exit code {proc.exitcode})")
