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

The shutdown protocol is written in ``shutdown.py``.
"""

import logging
import multiprocessing
import multiprocessing.connection as mpc
import queue
import threading
import time
import weakref
from dataclasses import replace

from . import autocounts
from .coordinator import END, Batch, Channels, Coordinator
from . import group
from .limits import check_worker_counts
from .messages import Consumed, Hello
from .peers import node_peers
from .service import StagingService
from .shutdown import close_abandoned, halt, stop
from .wire import Ring
from .workerpool import Wake, WorkerPool, children_skip_mpi
from .workers import reader_main
from .. import plan as planlib
from .. import telemetry as tm
from ..cache import Cache, policy_name
from ..catalog import agreed_catalog
from ..errors import ConfigError, StageError
from ..sources import open_source
from ..storage import JobDir, agreed_job_id, staging_capacity
from ..telemetry import Stats
from ..world import agree, detect, split_leaders

__all__ = ["Batch", "Pipeline"]

log = logging.getLogger(__name__)


def _more_rings(rings, count):
    """Shared memory for ``count`` more readers (an ``auto`` pool growing): ``(keep_fds, owned)``."""
    new = [Ring() for _ in range(count)]
    rings.extend(new)  # reader i uses rings[i]; the pool's indices only grow
    return [fd for r in new for fd in r.fds], new


class Pipeline:
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
    """

    def __init__(self, config, catalog=None, *, loader=None, start=(0, 0), on_staged=None, world=None,
                 plan=None):
        self._dataset, self._plan_cfg = config.dataset, config.plan
        self._staging, self._reader, self._processes = config.staging, config.reader, config.processes
        self._asked = config.staging  # as configured, before ``auto`` counts are resolved
        self._world_cfg = config.world
        self._auto = None  # with an auto count, the probe's model.Rates (after start)
        self.world = world
        self.catalog = catalog
        self.stats = Stats()
        self.local_dir = None
        self._start = start if isinstance(start, planlib.Position) else planlib.Position(*start)
        self._plan = plan
        self._loader = loader if loader is not None else config.dataset.loader
        self._on_staged = on_staged
        self._ch = Channels(Wake())
        self._jobdir = None
        self._jobdirs = []  # the job directory once made, for the finaliser
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
        try:
            self._launch()
        except BaseException as exc:
            self._shutdown(wait_for_peers=False, error=exc)
            raise
        return self

    def _launch(self):
        if self.world is None:
            self.world = detect(self._world_cfg.mpi, self._world_cfg.backend)
        world = self.world
        if self.catalog is None:
            self.catalog = agreed_catalog(world.comm, self._dataset, self._staging.stall_timeout_s)
        spec, minibatches = self._rank_plan()
        ch, ctx = self._ch, multiprocessing.get_context(self._processes.start_method)
        source = open_source(self.catalog.root, self._dataset, self._staging.verify)
        if not self._staging.enabled or world.node_leader:
            try:
                # Workers forked from here inherit what the source prepares (an object store's session).
                getattr(source, "warm", lambda: None)()
            except Exception:
                pass  # a worker's first fetch meets the same error and reports it with its context
        auto_prefetch, auto_read = (autocounts.is_auto(self._staging.prefetchers),
                                    autocounts.is_auto(self._reader.workers))
        shared = world.node_comm is not None and world.local_size > 1
        self._staging, self._reader, self._auto = autocounts.resolve(
            self._staging, self._reader, self._dataset, getattr(spec, "batch_size", self._plan_cfg.batch_size),
            self.catalog, source, world.node_comm if shared else None, self._loader)
        # The counts as they start (auto ones resolved), before any worker or directory exists.
        check_worker_counts(self._staging, self._reader, world.local_size, world.node_leader)
        if auto_read and not self._reader.ahead:
            # Room to hand a grown pool work: as far ahead as its largest size would read.
            self._reader = replace(self._reader, ahead=2 * max(self._reader.workers,
                                                               autocounts.reader_limit(self._auto)))
        with children_skip_mpi(self._processes.start_method):
            # Staging off: readers open the source's items in place, or have the source fetch each one.
            read_root = source.local_root or source
            if read_root is source and not hasattr(source, "open_direct"):
                raise ConfigError(f"staging.enabled is false, but {self.catalog.root} holds no files readers can "
                                  "open in place: enable staging")
            options = {"hdf5_key": self._dataset.hdf5_key, "layout": self._dataset.layout}
            if self._staging.enabled and self._staging.share:
                read_root = self.local_dir = self._join_group(spec)
                stream = group.stream_key(spec, self._loader, options, world.rank)
                ch.claims = stream is not None
                ch.shelf_ring = Ring() if ch.claims else None
                ch.send(Hello(world.rank, spec, stream, self._ahead()))
            elif self._staging.enabled:
                self._jobdir = JobDir(self._staging, self.catalog.root, agreed_job_id(self._staging, world), world)
                self._jobdirs.append(self._jobdir)
                self.local_dir = self._jobdir.path
                read_root = self._connect_service(ctx, source, spec, self._join_peers(),
                                                  autocounts.prefetcher_limit(self._auto) if auto_prefetch else None)
                ch.send(Hello(world.rank, spec, ahead=self._ahead()))
            read_ahead = self._reader.ahead or 2 * self._reader.workers
            coordinator = Coordinator(ch, minibatches, self.catalog, self.stats.telemetry, self._ahead(), read_ahead)
            if self._staging.enabled:
                coordinator.ask()  # the prefetchers start on the first minibatch while the readers start
            rings = [Ring() for _ in range(self._reader.workers)]
            ch.readers = WorkerPool(ctx, "read", "stager-read", self._reader.workers, reader_main,
                                    (read_root, self.catalog.sample_decoder(self._loader, options), options, rings),
                                    keep_fds=[fd for r in rings for fd in r.fds],
                                    recv=lambda i, conn: rings[i].recv(conn), owned=rings)
            if auto_read:
                ch.read_resizer = autocounts.PoolResizer(ch.readers, autocounts.READ,
                                                         autocounts.reader_limit(self._auto), self.stats.telemetry,
                                                         before_grow=lambda count: _more_rings(rings, count))
        ch.on_end = weakref.WeakMethod(self._finish)
        self._coordinator = threading.Thread(target=coordinator.run, name="stager-coordinator", daemon=True)
        self._coordinator.start()

    def _rank_plan(self):
        """This rank's plan: ``(description or None, iterator of Minibatch)``."""
        plan, rank = self._plan, self.world.rank
        if plan is None:
            plan = planlib.PlanSpec.from_config(len(self.catalog), self._plan_cfg, self.world.size, self._start,
                                                self.catalog.containers)
        if hasattr(plan, "minibatches"):
            return plan, iter(plan.minibatches(rank))
        return None, iter(plan)

    def _ahead(self):
        """Minibatches the coordinator asks for past the consumer (staged, not yet read)."""
        return max(self._staging.lookahead, self._reader.ahead or 2 * self._reader.workers)

    def _join_peers(self):
        """With ``staging.peers: partition``, the leaders' communicator (collective); else None."""
        if self._staging.peers == "off":
            return None
        world = self.world
        if world.comm is None or world.source != "mpi":
            raise ConfigError("staging.peers is 'partition', but this run has no MPI communicator (world.mpi off, "
                              "or not started by an MPI launcher): node leaders share their caches over MPI; start "
                              "the job under mpiexec or srun, or set staging.peers: off")
        return split_leaders(world)

    def _connect_service(self, ctx, source, spec, peer_link, auto_limit=None):
        """Starts (leader) or joins (other ranks) the node's staging service.

        Args:
            ctx: The multiprocessing context.
            source: The ``Source`` the prefetchers fetch from.
            spec: This rank's plan description, or None.
            peer_link: ``world.split_leaders``'s result (``staging.peers``), or None.
            auto_limit: With ``staging.prefetchers: auto``, the most the pool may grow to.

        Returns:
            The node-local directory to read staged files from.
        """
        world, ch = self.world, self._ch
        shared = world.node_comm is not None and world.local_size > 1

        def start_service():
            path = self._jobdir.create()
            ranks = world.local_size if shared else 1
            batch_size = getattr(spec, "batch_size", self._plan_cfg.batch_size)
            files = self.catalog.files
            capacity, ahead, window, note = staging_capacity(self._staging, path, files.sizes, batch_size,
                                                             self._ahead(), ranks,
                                                             spec.most_files() if hasattr(spec, "most_files") else None)
            if note:
                log.info("stager: %s", note)
            self._fit_ahead(ahead)
            cache = Cache(files.sizes, policy_name(self._staging.cache_policy, capacity), capacity, window,
                          self.catalog.file_index)
            peers = None
            if peer_link is not None:
                peers = node_peers(peer_link, spec, self.catalog, source, path, self._staging.prefetchers,
                                   self.stats.telemetry, self._staging.peer_choice, self._staging.stall_timeout_s)
                peers.keep_in(cache)
            ch.service = StagingService(self._staging, self._processes, self.catalog, source, path, ranks - 1,
                                        self.stats.telemetry, cache, self._on_staged, self._jobdir.keep_open(),
                                        peers, auto_limit)
            ch.client = ch.service.start(ctx)
            return path, ch.service.address, ch.service.authkey, ahead

        if not world.node_leader and not shared:
            raise StageError("a rank that is not its node's leader has no node communicator", stage="prefetch")
        path, address, authkey, ahead = agree(
            world.node_comm if shared else None, start_service,
            lambda text: StageError(f"the node leader could not start staging: {text}", stage="prefetch"))
        self._fit_ahead(ahead)  # the node's window, the same on every rank of it
        if not world.node_leader:
            ch.client = mpc.Client(address, family="AF_UNIX", authkey=authkey)
        return path

    def _join_group(self, spec):
        """Attaches this rank to its node's shared group (``staging.share``); returns the group's directory."""
        batch_size = getattr(spec, "batch_size", self._plan_cfg.batch_size)
        self._ch.client, welcome = group.join(self.world, self._staging, self._processes, self._dataset,
                                              self.catalog, spec, batch_size, self._ahead(), self._asked)
        self._fit_ahead(welcome.ahead)
        self._ch.linger = 3 * self._processes.shutdown_timeout_s  # the service's own shutdown, if this job is last
        return welcome.local_dir

    def _fit_ahead(self, ahead):
        """Cuts this rank's look-ahead (staged and decoded ahead) to ``ahead``, the most the node cache fits."""
        if ahead < self._ahead():
            self._staging = replace(self._staging, lookahead=ahead)
            self._reader = replace(self._reader, ahead=min(self._reader.ahead or 2 * self._reader.workers, ahead))

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
        if self._coordinator is not None and self._coordinator is not threading.current_thread():
            self._coordinator.join(timeout=timeout)
        reason = None
        if isinstance(error, Exception) and self._ch.service is not None:
            # The node's other ranks learn why their staging stops.
            text = error.message if isinstance(error, StageError) else str(error)
            reason = f"rank {self.world.rank} failed: {type(error).__name__}: {text}"
        stuck = stop(self._ch, timeout, self._processes.peer_wait_s if wait_for_peers else 0, reason)
        if self._jobdir is not None:
            self._jobdir.remove(stuck)  # only the node leader made it; elsewhere a no-op

    def accounting(self, loop_begin=None, loop_end=None):
        """Where this rank's time went so far: ``stager.telemetry.account``'s record.

        Args:
            loop_begin: ``time.monotonic()`` when the training loop began;
                default: its first ``next()``.
            loop_end: ``time.monotonic()`` when it ended; default: the end
                of the plan, else the last minibatch consumed.
        """
        from ..telemetry import account

        leader = self._staging.enabled and self._ch.service is not None
        return account(self.stats.telemetry, rank=self.world.rank, node=self.world.node,
                       readers=self._reader.workers, prefetchers=self._staging.prefetchers if leader else None,
                       loop_begin=loop_begin, loop_end=loop_end)

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
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self._shutdown(wait_for_peers=False, error=item)
            raise item
        seq, batch = item
        ch.wake.notify(Consumed(seq))
        batch.times.stall = stall
        self.stats.telemetry.record(tm.CONSUMED, seq, len(batch.samples), stall)
        return batch
