"""One rank's scheduling loop: walks the plan, asks the node for files, hands batches to readers.

The coordinator lives in a thread of the rank process so that staging and
reading go on while the training step runs. It waits on its readers' pipes,
its ``Wake`` channel (the consumer's ``Consumed`` notices) and its
connection to the node's staging service at once, and decides:

- how far ahead to ask for minibatches (``lookahead`` past the consumer);
- when a minibatch can be read (the service said ``Ready``) and by whom
  (the shared task queue of its reader pool);
- in which order decoded minibatches reach the consumer (plan order, by
  sequence number), and when the service may unpin a minibatch's files
  (``Release``, once a reader has read them) or, in a shared group, write
  again a shelf file this rank took (``LetGo``, once its arrays are gone).

Any failure, from a worker, the service or a bug here, goes to the consumer
as one ``StageError``.
"""

import functools
import logging
import multiprocessing.connection as mpc
import queue
import threading
import time

from .batch import Batch
from .. import batchfile
from ..messages import Claim, Claimed, Consumed, Decoded, Failure, LetGo, Need, ReadTask, Ready, Release
from ..workers.pool import RETIRED
from ... import telemetry as tm
from ...errors import StageError
from ...telemetry import BatchTimes

log = logging.getLogger(__name__)

END = object()  # on the out queue: the plan is done, or the pipeline closes
SERVICE_GONE = Failure("prefetch", "service", cause="ServiceGone",
                       message="the node's staging service (on local rank 0) is gone")


class Channels:
    """What the coordinator thread shares with its pipeline, and nothing more.

    The thread holds this object, never the pipeline, so an abandoned
    pipeline can be collected (and closed by its finaliser).

    Attributes:
        out: Decoded ``(seq, Batch)`` in plan order, an exception, or ``END``.
        halt: Set when the pipeline closes.
        wake: The consumer's ``Wake`` channel to the coordinator.
        readers: The rank's reader ``WorkerPool``.
        client: Connection to the node's staging service, or None (direct reading).
        client_lock: Serialises sends on ``client`` (coordinator and closer).
        service: The node's ``StagingService`` on the node leader, else None.
        read_resizer: With ``reader.workers: auto``, the readers'
            ``autocounts.PoolResizer``, else None.
        on_end: A ``weakref.WeakMethod`` the coordinator calls once it has
            delivered the whole plan (the pipeline's close), or None.
        shut: Set once the shutdown protocol has run to its end.
        claims: In a shared group with a decoded stream, the rank asks
            (``Claim``) before decoding each minibatch.
        shelf_gone: Then, a ``collections.deque`` of the minibatches taken
            from the group's shelf whose arrays are gone (their finalisers
            append from whatever thread drops them), to let go of.
        linger: Seconds to wait after the goodbye for the service to hang up
            (a shared group's); 0: none.
        finish: A callable taking a ``Batch`` and returning its samples as
            the consumer gets them, run here before each delivery (a front
            end's pinning), or None.
    """

    def __init__(self, wake):
        self.out = queue.Queue()
        self.halt = threading.Event()
        self.wake = wake
        self.readers = None
        self.client = None
        self.client_lock = threading.Lock()
        self.service = None
        self.read_resizer = None
        self.on_end = None
        self.shut = threading.Event()
        self.claims = False
        self.shelf_gone = None
        self.linger = 0.0
        self.finish = None
        self._claim_lock = threading.Lock()
        self._claimed = False

    def send(self, msg):
        """Sends ``msg`` to the node's service.

        Raises:
            StageError: The service hung up; why, if it said so before (see ``last_word``).
        """
        with self.client_lock:
            try:
                self.client.send(msg)
            except (OSError, EOFError):
                raise self.last_word().to_error() from None

    def last_word(self):
        """The ``Failure`` the service sent before it hung up, still unread on its connection, else ``SERVICE_GONE``.

        A rank that fails ends its node's service when it is the leader, and
        the service's last message to the others says which rank failed and
        why: that, not the broken pipe, is what they must report.
        """
        try:
            while self.client.poll(0):
                msg = self.client.recv()
                if isinstance(msg, Failure):
                    return msg
        except (OSError, EOFError):
            pass
        return SERVICE_GONE

    def claim(self):
        """True for the first caller only: the one that runs the shutdown protocol (and then sets ``shut``).

        The pipeline's ``close()``, its close at the end of the plan and its
        finaliser may each come first; the others wait for ``shut``.
        """
        with self._claim_lock:
            first, self._claimed = not self._claimed, True
        return first


class Coordinator:
    """The rank's scheduling state; ``run()`` is the thread's body.

    Args:
        channels: The ``Channels`` shared with the pipeline.
        plan: Iterator of this rank's ``plan.Minibatch``.
        catalog: The job's ``Catalog``.
        telemetry: The pipeline's ``Telemetry``.
        lookahead: Minibatches asked for past the consumer's position.
        read_ahead: Minibatches handed to readers past the consumer's position.
        deepening: With ``staging.lookahead: auto`` and room to go deeper,
            the ``deepening.Deepening`` that moves ``lookahead`` as the
            measured rates need; else None.
    """

    def __init__(self, channels, plan, catalog, telemetry, lookahead, read_ahead, deepening=None):
        self.ch = channels
        self.plan = plan
        self.catalog = catalog
        self.telemetry = telemetry
        self.staging = channels.client is not None
        self.lookahead = max(lookahead, read_ahead) if self.staging else read_ahead
        self.read_ahead = read_ahead
        self.deepening = deepening
        self.batches = {}       # seq -> Minibatch, from request until delivered
        self.times = {}         # seq -> BatchTimes
        self.staged = set()     # seqs whose files are all local
        self.results = {}       # seq -> Batch decoded, waiting for its turn
        self.claims = channels.claims
        self.exhausted = False
        self.next_seq = 0       # next minibatch to take from the plan
        self.read_ptr = 0       # next minibatch to hand to a reader
        self.emit_ptr = 0       # next minibatch to deliver
        self.consumed = 0       # minibatches the consumer has taken
        self.first_read = False  # this rank's first minibatch is decoded: ask for the whole look-ahead

    def run(self):
        """Schedules until the plan is delivered, the pipeline halts or something fails."""
        try:
            self._loop()
        except StageError as exc:  # already says where and why
            self.ch.out.put(exc)
        except BaseException as exc:  # a bug here must reach the consumer, not hang it
            self.ch.out.put(Failure.from_exception("pipeline", "coordinator", exc,
                                                   message=f"coordinator failed: {type(exc).__name__}: {exc}")
                            .to_error())

    def _loop(self):
        ch = self.ch
        readers = ch.readers
        others = [ch.wake.conn] + ([ch.client] if self.staging else [])
        waitables = list(readers.conns) + others
        while not ch.halt.is_set():
            if ch.read_resizer is not None and ch.read_resizer.resize():
                waitables = list(readers.conns) + others  # between minibatches: nothing is half read
            self.schedule()
            if self.exhausted and self.emit_ptr == self.next_seq:
                ch.out.put(END)
                finish = ch.on_end() if ch.on_end is not None else None
                if finish is not None:
                    finish()
                return
            ready = mpc.wait(waitables, timeout=1.0)
            self.let_go()
            if not ready and ch.service is not None and not ch.service.alive():
                self.handle(Failure("prefetch", "service", cause="ServiceGone",
                                    message="the node's staging service stopped"))
                return
            for source in ready:
                if source is ch.wake.conn:
                    msg = ch.wake.recv()
                elif source is ch.client:
                    try:
                        msg = ch.client.recv()
                    except (EOFError, OSError):
                        msg = SERVICE_GONE
                else:
                    msg = readers.receive(source)
                    if msg is RETIRED:
                        waitables.remove(source)
                        continue
                    if isinstance(msg, Decoded) and ch.read_resizer is not None:
                        ch.read_resizer.finished(1, msg.seconds)
                if self.handle(msg):
                    return

    def ask(self):
        """Asks the node's service for minibatches up to the look-ahead (or takes them, reading directly).

        Until this rank's first minibatch is decoded it asks for that one
        alone: the consumer waits for it, and the look-ahead's requests would
        compete with it, at the source (a store that serves requests at a
        fixed rate finishes all of them together, later) and then for this
        process's CPU while the node's service queues them.
        """
        ch, telemetry = self.ch, self.telemetry
        while not self.exhausted and self.next_seq < self.consumed + self.lookahead:
            if self.staging and self.next_seq and not self.first_read:
                break
            mb = next(self.plan, None)
            if mb is None:
                self.exhausted = True
                break
            seq = self.next_seq
            self.next_seq += 1
            self.batches[seq] = mb
            self.times[seq] = BatchTimes()
            if self.staging:
                ch.send(Need(seq, mb.epoch, mb.step, mb.indices))
                telemetry.record(tm.NEEDED, seq, len(mb.indices))
            else:
                self.staged.add(seq)

    def schedule(self):
        """Hands staged minibatches to readers, then asks for more up to the look-ahead.

        Reading comes first: the consumer waits for the earliest minibatch,
        not for the look-ahead. Reading directly, what ``ask`` took is ready
        to read at once.
        """
        self.read()
        self.ask()
        if not self.staging:
            self.read()

    def read(self):
        """Hands staged minibatches to the readers, in plan order, up to the read-ahead."""
        ch = self.ch
        while (self.read_ptr < self.next_seq and self.read_ptr < self.consumed + self.read_ahead
               and self.read_ptr in self.staged):
            self.staged.discard(self.read_ptr)
            if self.claims:  # the group says who decodes it (``Claimed``)
                ch.send(Claim(self.read_ptr))
            else:
                self.hand_out(self.read_ptr)
            self.read_ptr += 1

    def hand_out(self, seq, publish=None):
        """Gives minibatch ``seq`` to the readers (to put at ``publish`` for the group too)."""
        ch, catalog, mb = self.ch, self.catalog, self.batches[seq]
        files = [(i, catalog.path(i), catalog.label(i)) for i in mb.indices.tolist()]
        ch.readers.tasks.put(ReadTask(seq, mb.epoch, mb.step, files, publish))
        if ch.read_resizer is not None:
            ch.read_resizer.asked(1)

    def take(self, seq, path):
        """Minibatch ``seq``, decoded by another job, from the group's shelf; True if that failed."""
        mb = self.batches[seq]
        begin = time.perf_counter()
        try:
            samples, seconds = batchfile.read(path, functools.partial(self.ch.shelf_gone.append, seq))
        except (OSError, EOFError) as exc:
            self.ch.out.put(Failure.from_exception("read", "shelf", exc, mb.epoch, mb.step, path,
                                                   f"cannot take minibatch {mb.step} of epoch {mb.epoch}, decoded "
                                                   f"by another job of the group, from {path}: {exc}").to_error())
            return True
        self.first_read = True
        self.telemetry.record(tm.GROUP, tm.GROUP_TAKEN, len(samples), seconds)
        self.ch.send(Release(seq, held=True))
        return self.deliver(seq, samples, time.perf_counter() - begin)

    def let_go(self):
        """Tells the group which shelf files this rank's arrays no longer view."""
        gone = self.ch.shelf_gone
        while gone:
            self.ch.send(LetGo(gone.popleft()))

    def deliver(self, seq, samples, seconds, collated=False):
        """Minibatch ``seq`` is decoded: the consumer gets it, and those before it, in plan order.

        Returns:
            True when the coordinator must stop: ``finish`` failed, and the
            consumer gets that error instead.
        """
        mb = self.batches.pop(seq)
        times = self.times.pop(seq)
        times.read = seconds
        self.results[seq] = Batch(mb.epoch, mb.step, mb.indices, samples, times, mb.end, mb.last, collated)
        finish = self.ch.finish
        while self.emit_ptr in self.results:
            batch = self.results.pop(self.emit_ptr)
            if finish is not None:
                try:
                    batch.samples = finish(batch)
                except Exception as exc:
                    self.ch.out.put(Failure.from_exception(
                        "deliver", "rank", exc, batch.epoch, batch.step, None,
                        f"cannot finish minibatch {batch.step} of epoch {batch.epoch} with {finish!r}: "
                        f"{type(exc).__name__}: {exc}").to_error())
                    return True
            self.telemetry.record(tm.DELIVERED, self.emit_ptr, len(batch.indices))  # before the consumer sees it
            self.ch.out.put((self.emit_ptr, batch))
            self.emit_ptr += 1
        return False

    def handle(self, msg):
        """Acts on one message; True when the coordinator must stop."""
        telemetry = self.telemetry
        if isinstance(msg, Ready):
            self.times[msg.seq].prefetch = msg.seconds
            telemetry.record(tm.READY, msg.seq, 0, msg.seconds)
            if self.deepening is not None:
                self.deepening.staged(msg.span, msg.spare)
            if msg.group is not None:
                telemetry.record(tm.GROUP, tm.GROUP_FETCHED, msg.group[2], msg.group[3])
                if msg.group[0]:
                    telemetry.record(tm.GROUP, tm.GROUP_FILES, msg.group[0], msg.group[1])
            self.staged.add(msg.seq)
        elif isinstance(msg, Claimed):
            if msg.verdict != "shared":  # publish, or own
                self.hand_out(msg.seq, msg.path or None)
            elif self.take(msg.seq, msg.path):
                return True
        elif isinstance(msg, Decoded):
            self.first_read = True
            telemetry.record(tm.READ, msg.seq, msg.count, msg.seconds)
            if msg.decoded is not None:
                hits, kept, saved, note = msg.decoded
                if hits or kept or saved:
                    telemetry.record(tm.DECODED, hits, kept, saved)
                if note:
                    log.info("stager: reader %d stopped keeping decoded copies: %s", msg.worker, note)
            if msg.published:
                telemetry.record(tm.GROUP, tm.GROUP_GIVEN, msg.count, 0)
            if self.staging:
                self.ch.send(Release(msg.seq, msg.published))
            return self.deliver(msg.seq, msg.samples, msg.seconds, msg.collated)
        elif isinstance(msg, Consumed):
            self.consumed = max(self.consumed, msg.seq + 1)
            if self.deepening is not None and not self.exhausted:  # at the plan's end the prefetchers idle anyway
                self.lookahead = max(self.deepening.consumed(time.monotonic(), msg.stall), self.read_ahead)
        elif isinstance(msg, Failure):
            self.ch.out.put(msg.to_error())
            return True
        return False
