"""Starts, wires and stops the three stages for one rank.

The rank's coordinator thread (``coordinator.py``) walks its share of the
plan (stage 1), asks the node's staging service (``service.py``, stage 2)
for each minibatch ahead of the consumer, and hands it to the rank's reader
processes (stage 3) once its files are local; ``next()`` takes decoded
minibatches in plan order. On the node leader (local rank 0) the pipeline
also owns the job directory and the service.

Start (``start()``, collective under MPI: every rank calls it): find the
world, agree on the catalog (rank 0 lists the source) and the job id; the
node leader creates the job directory and the service and tells the node's
other ranks where it listens; every rank starts its readers and coordinator.

How ``start()`` wires the stages is ``startup.py``'s; the shutdown protocol
is written in ``shutdown.py``.
"""

import queue
import threading
import time
import weakref

from .batch import Batch
from .coordinator import END, Channels
from .cpuledger import CpuLedger
from .shutdown import close_abandoned, halt, stop
from .startup import Startup
from ..messages import Consumed
from ..tuning import autocounts
from ..workers.pool import Wake
from ... import plan as planlib
from ... import telemetry as tm
from ...errors import StageError
from ...telemetry import Stats
from ...telemetry.ledger import BEFORE

__all__ = ["Batch", "Pipeline"]


class Pipeline(Startup):
    """Stages this rank's minibatches to node-local storage and decodes them.

    Iterate it (``for batch in pipeline``) to receive ``Batch`` objects in
    plan order. Use it as a context manager, or call ``close()``. Under MPI
    every rank constructs and starts its pipeline (they agree on a few values
    collectively in ``start()``); each rank then reads its own share of every
    epoch. The constructor talks to nobody.

    Args:
        config: A ``Config``; the pipeline keeps the sections it reads
            (dataset, plan, staging, reader, processes, world).
        catalog: The samples; default, in ``start()``: built on rank 0 from
            ``config.dataset`` and broadcast, or mapped from the catalog file
            ``dataset.catalog`` (see ``stager.catalog.agreed_catalog``).
        loader: Overrides ``config.dataset.loader``: a registry name,
            ``module:function``, a callable taking a path, or a
            ``formats.SampleDecoder`` (a front end's, given each sample's
            index and epoch); it must be picklable unless the start method
            is ``fork``.
        start: ``plan.Position`` (or ``(epoch, consumed)``) to resume from:
            ``consumed`` samples of the epoch's global order are done
            (``Batch.end`` of the last minibatch consumed). On another number
            of ranks the same position continues the same global order.
        on_staged: Optional callable ``(relpath, bytes, epoch)``, called on the
            node leader for each file copied.
        world: A ``World``; default: ``world.detect`` from ``config.world`` in ``start()``.
        plan: What this rank reads: a description with ``minibatches(rank)``
            (``plan.PlanSpec``), which the node's service
            can evaluate too, or an iterable of ``plan.Minibatch`` (front ends
            whose order only they know); default: ``config.plan`` from ``start``.
        finish: Optional callable taking a ``Batch`` and returning its
            samples as the consumer gets them (a front end pins them there),
            run in the pipeline's receiving thread rather than the
            consumer's; an error in it reaches the consumer as a
            ``StageError`` of stage ``deliver``.
    """

    def __init__(self, config, catalog=None, *, loader=None, start=(0, 0), on_staged=None, world=None,
                 plan=None, finish=None):
        self._dataset, self._plan_cfg = config.dataset, config.plan
        self._staging, self._reader, self._processes = config.staging, config.reader, config.processes
        self._asked = config.staging  # as configured, before ``auto`` counts are resolved
        self._world_cfg = config.world
        self._auto = None  # with an auto count, the probe's model.Rates (after start)
        self._in_flight = 1  # files each prefetcher fetches at once (the source's, after start)
        self._deepest = 0  # with staging.lookahead auto, the deepest the node's room allows (after start)
        self.world = world
        self.catalog = catalog
        self.stats = Stats()
        self._ledger = CpuLedger(self.stats.telemetry)
        self._epoch, self._epoch_samples = None, 0  # the consumer's epoch, and its samples taken so far
        self.local_dir = None
        self._start = start if isinstance(start, planlib.Position) else planlib.Position(*start)
        self._plan = plan
        self._loader = loader if loader is not None else config.dataset.loader
        self._on_staged = on_staged
        self._ch = Channels(Wake())
        self._ch.finish = finish
        self._jobdir = None
        self._jobdirs = []  # the job directory once made, for the finaliser
        # With ``staging.share`` and ``auto`` counts, on the node leader: the group joined while resolving them,
        # or the founding claim, the directory of the probe's copies and what the group's service starts from
        # (``Startup``).
        self._group_found = self._group_claim = self._group_probe = self._group_setup = None
        self._coordinator = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        # At the end of the plan the coordinator thread closes the pipeline while
        # the consumer still takes the last decoded minibatches (see ``_finish``).
        self._draining = False
        self._close_error = None
        # An abandoned pipeline is closed by the collector: the finaliser holds
        # what closing needs, never the pipeline itself.
        self._finalizer = weakref.finalize(self, close_abandoned, self._ch, self._jobdirs)

    @property
    def counts(self):
        """``(prefetchers, readers)`` this rank started with, ``auto`` resolved (after ``start()``).

        Prefetchers are the node's (its leader's pool); with ``auto`` both
        pools may change while running (``telemetry.RESIZED`` events).
        """
        return self._staging.prefetchers, self._reader.workers

    @property
    def in_flight(self):
        """Files each prefetcher fetches at once, in threads (``dataset.requests_in_flight`` resolved)."""
        return self._in_flight

    def counts_timeline(self):
        """The counts as they started and after each change:
        ``[{"t", "prefetchers", "in_flight", "readers", "lookahead", "why"}]``.

        ``t`` is seconds since the pipeline started. Prefetchers are the node's
        (0 with staging off); their changes, and why each was made, are seen
        on the node's leader. ``in_flight``: files each prefetcher fetches at
        once. ``lookahead``: minibatches this rank asks for ahead (``auto``
        goes deeper where the source's latency needs it; 0 with staging off).
        ``why``: what chose the counts at start, the rule behind each change.
        """
        prefetchers, readers = self.counts
        rates = self._auto
        why = "as configured" if rates is None else (
            f"auto, from a probe: open {rates.open_s * 1000:.1f} ms, {rates.read_s * 1000:.2f} ms to decode a file, "
            f"{rates.cpu_s * 1000:.2f} ms CPU a file, {rates.cores:g} cores")
        row = {"t": 0.0, "prefetchers": prefetchers if self._staging.enabled else 0, "in_flight": self._in_flight,
               "readers": readers, "lookahead": self._ahead() if self._staging.enabled else 0, "why": why}
        rows = [dict(row)]
        names = {autocounts.PREFETCH: "prefetchers", autocounts.READ: "readers", tm.POOL_LOOKAHEAD: "lookahead",
                 tm.POOL_IN_FLIGHT: "in_flight"}
        service, readers = self._ch.service, self._ch.read_resizer
        reasons = {autocounts.PREFETCH: iter(service.resizer.why if service and service.resizer else ()),
                   autocounts.READ: iter(readers.why if readers is not None else ())}
        reasons[tm.POOL_IN_FLIGHT] = reasons[autocounts.PREFETCH]  # one list, in the order recorded
        for t, _, stage, size, _ in self.stats.telemetry.events([tm.RESIZED]):
            why = ("the source's latency over the step needs another depth" if stage == tm.POOL_LOOKAHEAD
                   else next(reasons[stage], ""))
            row.update({"t": round(t, 4), names[stage]: size, "why": why})
            rows.append(dict(row))
        return rows

    @property
    def capacity(self):
        """The node cache's capacity in bytes on its leader (``staging.capacity`` resolved), else None."""
        service = self._ch.service
        return service.cache.capacity if service is not None else None

    @property
    def closed(self):
        """Whether the pipeline was closed (by ``close()``, an error or the end of the plan).

        At the end of the plan it is closed once the consumer has taken the
        last minibatch and met the end (``StopIteration``).
        """
        return self._closed and not self._draining

    # Lifecycle ------------------------------------------------------------

    def start(self):
        """Agrees with the other ranks and starts the workers (collective under MPI); idempotent."""
        with self._lock:
            if self._started:
                return self
            if self._closed:
                raise RuntimeError("pipeline is closed")
            self._started = True
        self._ledger.mark(BEFORE, None, None)
        try:
            self._launch()
        except BaseException as exc:
            self._drop_group_probe()
            self._shutdown(wait_for_peers=False, error=exc)
            raise
        return self

    def close(self):
        """Stops every worker and removes the staging directory; safe to call twice, from any thread.

        Minibatches decoded but not yet taken are dropped: ``next()`` then
        raises ``StopIteration``.
        """
        self._draining = False
        self._shutdown(wait_for_peers=True)

    def _claim(self, draining=False):
        """Marks the pipeline closed; True for the one caller that then runs the shutdown."""
        with self._lock:
            if self._closed or not self._ch.claim():
                return False
            self._closed, self._draining = True, draining
        return True

    def _shutdown(self, wait_for_peers, error=None):
        if not self._claim():
            # Another thread is closing (at the end of the plan, the coordinator): return when it is
            # done (every step of the protocol is bounded), with its error if it had one.
            self._ch.shut.wait()
            self._join_coordinator()
            error, self._close_error = self._close_error, None
            if error is not None:
                raise error
            return
        self._protocol(wait_for_peers, error)

    def _finish(self):
        """The shutdown at the end of the plan, on the coordinator thread once it delivered every minibatch.

        Nothing is left for the workers to do then, so they stop and the job
        directory goes while the consumer takes the last minibatches (already
        decoded, in shared memory that outlives the readers) and runs its last
        steps, instead of inside its last ``next()``.
        """
        if not self._claim(draining=True):
            return
        self._ledger.look(*self._pools())  # the workers' last figures: they are gone by the consumer's end
        try:
            self._protocol(wait_for_peers=True)
        except BaseException as exc:  # raised to the consumer by its last next() or close()
            self._close_error = exc

    def _protocol(self, wait_for_peers, error=None):
        """Runs the shutdown protocol (``shutdown.py``), for the caller that claimed it."""
        try:
            self._stop_all(wait_for_peers, error)
        finally:
            self._ch.shut.set()
            self._finalizer.detach()

    def _stop_all(self, wait_for_peers, error=None):
        if not self._started:
            self._ch.wake.close()
            return
        timeout = self._processes.shutdown_timeout_s
        halt(self._ch)
        self._join_coordinator()
        reason = None
        if isinstance(error, Exception) and self._ch.service is not None:
            # The node's other ranks learn why their staging stops.
            text = error.message if isinstance(error, StageError) else str(error)
            reason = f"rank {self.world.rank} failed: {type(error).__name__}: {text}"
        stuck = stop(self._ch, timeout, self._processes.peer_wait_s if wait_for_peers else 0, reason)
        if self._jobdir is not None:
            self._jobdir.remove(stuck)  # only the node leader made it; elsewhere a no-op

    def _join_coordinator(self):
        """Waits (bounded) for the coordinator thread to end, unless this is it.

        A daemon thread still running when the interpreter exits is ended
        where it next takes the GIL; inside a C++ extension's frame (torch
        freeing the last minibatch's tensors as its frames unwind) that
        ends the whole process with ``std::terminate`` (SIGABRT). So
        ``close()`` returns only once the thread is gone, also when the
        coordinator itself ran the shutdown at the end of the plan.
        """
        thread = self._coordinator
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._processes.shutdown_timeout_s)

    def _pools(self):
        """``(readers, prefetchers)``: this rank's reader pool and, on a node's leader, the node's prefetchers."""
        service = self._ch.service
        return self._ch.readers, service.pool if service is not None else None

    def _epoch_ended(self):
        """Marks the CPU the epoch the consumer was in cost (``cpu_by_epoch``)."""
        if self._epoch is not None:
            self._ledger.mark(self._epoch, *self._pools(), self._epoch_samples)
        self._epoch, self._epoch_samples = None, 0

    def accounting(self, loop_begin=None, loop_end=None):
        """Where this rank's time went so far: ``stager.telemetry.account``'s record.

        Args:
            loop_begin: ``time.monotonic()`` when the training loop began;
                default: its first ``next()``.
            loop_end: ``time.monotonic()`` when it ended; default: the end
                of the plan, else the last minibatch consumed.
        """
        from ...telemetry import account

        leader = self._staging.enabled and self._ch.service is not None
        return account(self.stats.telemetry, rank=self.world.rank, node=self.world.node,
                       readers=self._reader.workers, prefetchers=self._staging.prefetchers if leader else None,
                       in_flight=self._in_flight, loop_begin=loop_begin, loop_end=loop_end)

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        # On an error, peers may never arrive: do not wait for them.
        self._shutdown(wait_for_peers=exc_type is None, error=exc)

    # Consumer side --------------------------------------------------------

    def __iter__(self):
        self.start()
        return self

    def __next__(self):
        return self.take()

    def take(self, timeout=None):
        """The next ``Batch``, as ``next()`` gives it, waiting at most ``timeout`` seconds.

        Raises:
            StopIteration: At the end of the plan, or once closed.
            TimeoutError: When no minibatch came within ``timeout``; the
                pipeline stays open, and a later call may still get it.
            StageError: When any stage failed (the pipeline is then closed).
        """
        if self.closed:
            raise StopIteration
        self.start()
        ch = self._ch
        begin = time.perf_counter()
        try:
            item = ch.out.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no minibatch came within {timeout} s (minibatch {self.stats.batches} of this "
                               f"rank's plan)") from None
        stall = time.perf_counter() - begin
        if item is END or self.closed:
            if item is END:
                self.stats.telemetry.record(tm.FINISHED, self.stats.batches, 0, stall)
                self._epoch_ended()
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self._shutdown(wait_for_peers=False, error=item)
            raise item
        seq, batch = item
        if batch.epoch != self._epoch:
            self._epoch_ended()
            self._epoch = batch.epoch
        self._epoch_samples += len(batch.indices)
        ch.wake.notify(Consumed(seq, stall))
        batch.times.stall = stall
        self.stats.telemetry.record(tm.CONSUMED, seq, len(batch.indices), stall)
        return batch
