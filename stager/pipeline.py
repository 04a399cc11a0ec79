"""Starts, wires and stops the three stages for one rank.

Each rank runs a coordinator thread that walks its share of the plan
(stage 1), asks the node's staging service (``service.py``, stage 2) for each
minibatch up to ``staging.lookahead`` minibatches ahead of the consumer, hands
a minibatch to its reader processes (stage 3) once the service says all its
files are local, and puts decoded minibatches in plan order on a queue that
``next()`` takes from. On the node leader (local rank 0) the pipeline also
owns the job directory and the service.

Shutdown protocol (``close()``, idempotent and thread-safe; also on an error
in any stage, at the end of the plan, on leaving a ``with`` block, and when
the pipeline is garbage-collected):
  1. stop the coordinator (flag plus a wake-up message) and join it;
  2. tell the staging service goodbye (and, on an error, why);
  3. set the readers' stop event and send one ``None`` sentinel per reader;
     join each until ``processes.shutdown_timeout_s``, draining replies so no
     reader blocks on a full pipe; then terminate, then kill;
  4. on the node leader: wait (up to ``processes.peer_wait_s``, not at all
     on an error) for the node's other ranks to leave the service, stop the
     prefetchers the same way, and remove the job directory unless
     ``staging.keep`` is set.
Workers also exit on their own when their parent dies (they poll getppid).
The coordinator thread holds only the pipeline's ``_Core``, never the
pipeline itself, so an abandoned pipeline is collected and closed.
"""

import contextlib
import multiprocessing
import multiprocessing.connection as mpc
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

from . import plan as planlib
from . import wire
from .catalog import Catalog, broadcast_catalog
from .errors import StageError
from .jobdir import JobDir, agreed_job_id
from .service import StagingService
from .stats import BatchTimes, Stats
from .workerpool import WorkerPool
from .workers import reader_main
from .world import detect

_END = object()


@dataclass
class Batch:
    """A decoded minibatch, as delivered to the consumer.

    Attributes:
        epoch: Epoch number.
        step: Index within the epoch.
        indices: Catalog indices of the samples, in order.
        samples: Decoded samples, ``(data, label)`` tuples for labelled data.
        times: Where the time went for this minibatch.
        end: Position in the epoch's global order after this minibatch
            (see ``plan.Minibatch.end``).
        last: Whether it is the last minibatch of its epoch.
    """

    epoch: int
    step: int
    indices: np.ndarray
    samples: list
    times: BatchTimes
    end: int = 0
    last: bool = False


@contextlib.contextmanager
def _children_skip_mpi(start_method):
    # A spawned child re-imports __main__; if that imports mpi4py.MPI, the
    # child would initialise MPI and crash or hang (ENVIRONMENT.md). Only the
    # children see this variable: it is restored as soon as they exist.
    if start_method == "fork":
        yield
        return
    old = os.environ.get("MPI4PY_RC_INITIALIZE")
    os.environ["MPI4PY_RC_INITIALIZE"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MPI4PY_RC_INITIALIZE"]
        else:
            os.environ["MPI4PY_RC_INITIALIZE"] = old


class _Core:
    """What the coordinator thread shares with the pipeline (and nothing more)."""

    def __init__(self, config, catalog, stats, plan, staging, read_ahead):
        self.config = config
        self.catalog = catalog
        self.stats = stats
        self.plan = plan
        self.staging = staging
        self.read_ahead = read_ahead
        self.out = queue.Queue()          # (seq, Batch), an exception, or _END
        self.halt = threading.Event()
        self.wake_r, self.wake_w = multiprocessing.Pipe(duplex=False)  # consumer -> coordinator
        self.wake_lock = threading.Lock()
        self.client = None                # connection to the node's staging service
        self.client_lock = threading.Lock()
        self.readers = None               # WorkerPool
        self.service = None               # StagingService, on the node leader

    def notify(self, msg):
        """Sends ``msg`` to the coordinator; False once the channel is closed."""
        with self.wake_lock:
            try:
                self.wake_w.send(msg)
                return True
            except (OSError, ValueError):
                return False


class Pipeline:
    """Stages this rank's minibatches to node-local storage and decodes them.

    Iterate it (``for batch in pipeline``) to receive ``Batch`` objects in
    plan order. Use it as a context manager, or call ``close()``. Under MPI
    every rank constructs and starts its pipeline (they agree on a few values
    collectively); each rank then reads its own share of every epoch.

    Args:
        config: A ``Config``.
        catalog: The samples; default: built on rank 0 from
            ``config.dataset`` and broadcast.
        loader: Overrides ``config.dataset.loader``: a registry name,
            ``module:function`` or a callable taking a path (it must be
            picklable unless the start method is ``fork``).
        start: ``(epoch, position)`` to resume from: ``position`` samples of
            the epoch's global order are done (``Batch.end`` of the last
            minibatch consumed; ``step * batch_size * ranks`` when the number
            of ranks is unchanged). On another number of ranks the same
            position continues the same global order.
        on_staged: Optional callable ``(relpath, bytes, epoch)``, called on the
            node leader for each file copied.
        world: A ``World``; default: ``world.detect(config.world.mpi)``.
        plan: This rank's minibatches, an iterable of ``plan.Minibatch``
            (front ends with other batching rules pass theirs); default:
            ``plan.iterate`` over ``config.plan`` from ``start``.
    """

    def __init__(self, config, catalog=None, *, loader=None, start=(0, 0), on_staged=None, world=None,
                 plan=None):
        self.config = config
        self.world = world if world is not None else detect(config.world.mpi)
        if catalog is None:
            catalog = broadcast_catalog(self.world.comm, lambda: Catalog.load(config.dataset))
        self.catalog = catalog
        self.stats = Stats()
        if plan is None:
            plan = planlib.iterate(len(catalog), config.plan, start[0], start[1], rank=self.world.rank,
                                   size=self.world.size)
        self._loader = loader if loader is not None else config.dataset.loader
        self._on_staged = on_staged
        self._staging = config.staging.enabled
        self._core = _Core(config, catalog, self.stats, iter(plan), self._staging,
                           config.reader.ahead or 2 * config.reader.workers)
        self._jobdir = None
        self.local_dir = None
        if self._staging:
            self._jobdir = JobDir(config.staging, catalog.root, agreed_job_id(config.staging, self.world),
                                  self.world)
            self.local_dir = self._jobdir.path
        self._coordinator = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def closed(self):
        """Whether the pipeline was closed (by ``close()``, an error or the end of the plan)."""
        return self._closed

    def worker_pids(self):
        """Process ids of this rank's live prefetchers (node leader only) and readers."""
        core = self._core
        return ((core.service.pool.pids() if core.service and core.service.pool else [])
                + (core.readers.pids() if core.readers else []))

    # Lifecycle ------------------------------------------------------------

    def start(self):
        """Starts the workers (collective under MPI); idempotent."""
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
        cfg, core = self.config, self._core
        ctx = multiprocessing.get_context(cfg.processes.start_method)
        with _children_skip_mpi(cfg.processes.start_method):
            read_root = self.catalog.root
            if self._staging:
                read_root = self._connect_service(ctx)
            core.readers = WorkerPool(ctx, "stager-read", cfg.reader.workers, reader_main,
                                      (read_root, self._loader, {"hdf5_key": cfg.dataset.hdf5_key}))
        self._coordinator = threading.Thread(target=_coordinate, args=(core,), name="stager-coordinator",
                                             daemon=True)
        self._coordinator.start()

    def _connect_service(self, ctx):
        """Starts (leader) or joins (other ranks) the node's staging service.

        Returns:
            The node-local directory to read staged files from.
        """
        world, core = self.world, self._core
        shared = world.node_comm is not None and world.local_size > 1
        info = None
        if world.node_leader:
            try:
                path = self._jobdir.create()
                remote = world.local_size - 1 if shared else 0
                core.service = StagingService(self.config, self.catalog, path, remote, self.stats,
                                              self._on_staged, self._jobdir.keep_open())
                core.client = core.service.start(ctx)
                info = ("ok", path, core.service.address, core.service.authkey)
            except Exception as exc:
                info = ("error", f"{type(exc).__name__}: {exc}")
                if shared:
                    world.node_comm.bcast(info, root=0)  # the node's other ranks must not wait
                raise
        if shared:
            info = world.node_comm.bcast(info, root=0)
        if info[0] == "error":
            raise StageError(f"the node leader could not start staging: {info[1]}", stage="prefetch")
        if not world.node_leader:
            core.client = mpc.Client(info[2], family="AF_UNIX", authkey=info[3])
        return info[1]

    def close(self):
        """Stops every worker and removes the staging directory; safe to call twice, from any thread."""
        self._shutdown(wait_for_peers=True)

    def _shutdown(self, wait_for_peers, error=None):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if not started:
            return
        core, timeout = self._core, self.config.processes.shutdown_timeout_s
        core.halt.set()
        core.out.put(_END)  # wakes a consumer blocked in next() on another thread
        core.notify(("wake",))
        if self._coordinator is not None:
            self._coordinator.join(timeout=timeout)
        if core.client is not None:
            # A coordinator stuck in a send would hold the lock: then skip the goodbye.
            if core.client_lock.acquire(timeout=timeout):
                try:
                    with contextlib.suppress(OSError, EOFError, ValueError):
                        if isinstance(error, Exception) and core.service is not None:
                            # The node's other ranks learn why their staging stops.
                            reason = str(error).split("\n\nOriginal traceback")[0]
                            core.client.send(("fail", f"rank {self.world.rank} failed: "
                                                      f"{type(error).__name__}: {reason}"))
                        core.client.send(("bye",))
                    core.client.close()
                finally:
                    core.client_lock.release()
        if core.readers is not None:
            core.readers.stop(timeout)
        if core.service is not None:
            core.service.close(self.config.processes.peer_wait_s if wait_for_peers else 0)
        with core.wake_lock:
            core.wake_r.close()
            core.wake_w.close()
        if self._jobdir is not None and self.world.node_leader:
            self._jobdir.remove()

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        # On an error, peers may never arrive: do not wait for them.
        self._shutdown(wait_for_peers=exc_type is None, error=exc)

    def __del__(self):
        try:
            self._shutdown(wait_for_peers=False)
        except Exception:
            pass

    # Consumer side --------------------------------------------------------

    def __iter__(self):
        self.start()
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        self.start()
        core = self._core
        begin = time.perf_counter()
        item = core.out.get()
        stall = time.perf_counter() - begin
        if item is _END or self._closed:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self._shutdown(wait_for_peers=False, error=item)
            raise item
        seq, batch = item
        core.notify(("consumed", seq))
        batch.times.stall = stall
        self.stats.delivered(len(batch.samples), batch.times)
        return batch


def _coordinate(core):
    try:
        _Coordinator(core).run()
    except BaseException as exc:  # a bug here must reach the consumer, not hang it
        core.out.put(StageError(f"coordinator failed: {type(exc).__name__}: {exc}", stage="pipeline",
                                cause=type(exc).__name__, remote_traceback=traceback.format_exc()))


class _Coordinator:
    """The rank's scheduling loop; lives in one thread of the rank process."""

    def __init__(self, core):
        self.core = core
        cfg = core.config
        self.lookahead = max(cfg.staging.lookahead, core.read_ahead) if core.staging else core.read_ahead
        self.batches = {}       # seq -> Minibatch, from request until delivered
        self.times = {}         # seq -> BatchTimes
        self.staged = set()     # seqs whose files are all local
        self.results = {}       # seq -> Batch decoded, waiting for its turn
        self.exhausted = False
        self.next_seq = 0       # next minibatch to take from the plan
        self.read_ptr = 0       # next minibatch to hand to a reader
        self.emit_ptr = 0       # next minibatch to deliver
        self.consumed = 0       # minibatches the consumer has taken

    def run(self):
        core = self.core
        readers = list(core.readers.conns)
        sources = readers + [core.wake_r] + ([core.client] if core.client is not None else [])
        while not core.halt.is_set():
            self.schedule()
            if self.exhausted and self.emit_ptr == self.next_seq:
                core.out.put(_END)
                return
            ready = mpc.wait(sources, timeout=1.0)
            if not ready and core.service is not None and not core.service.alive():
                self.fail(("error", "prefetch", "service", None, None, None, "ServiceGone",
                           "the node's staging service stopped", None))
                return
            for source in ready:
                if source is core.wake_r:
                    msg = core.wake_r.recv()
                elif source is core.client:
                    try:
                        msg = core.client.recv()
                    except (EOFError, OSError):
                        msg = ("error", "prefetch", "service", None, None, None, "ServiceGone",
                               "the node's staging service (on local rank 0) is gone", None)
                else:
                    try:
                        msg = wire.recv(source)
                    except (EOFError, OSError):
                        proc = core.readers.by_conn[source]
                        proc.join(1.0)
                        msg = ("error", "read", proc.name, None, None, None, "WorkerDied",
                               f"{proc.name} (pid {proc.pid}) died (exit code {proc.exitcode})", None)
                if self.handle(msg):
                    return

    def schedule(self):
        core = self.core
        while not self.exhausted and self.next_seq < self.consumed + self.lookahead:
            mb = next(core.plan, None)
            if mb is None:
                self.exhausted = True
                break
            seq = self.next_seq
            self.next_seq += 1
            self.batches[seq] = mb
            self.times[seq] = BatchTimes()
            if core.staging:
                with core.client_lock:
                    core.client.send(("need", seq, mb.epoch, mb.step, mb.indices))
            else:
                self.staged.add(seq)
        catalog = core.catalog
        while (self.read_ptr < self.next_seq and self.read_ptr < self.consumed + core.read_ahead
               and self.read_ptr in self.staged):
            mb = self.batches[self.read_ptr]
            self.staged.discard(self.read_ptr)
            files = [(catalog.path(i), catalog.label(i)) for i in mb.indices]
            core.readers.tasks.put((self.read_ptr, mb.epoch, mb.step, files))
            self.read_ptr += 1

    def fail(self, msg):
        _, stage, worker, epoch, step, path, cause, message, tb = msg
        self.core.out.put(StageError(f"{stage} worker {worker} failed: {message}", stage=stage, epoch=epoch,
                                     step=step, path=path, cause=cause, remote_traceback=tb))

    def handle(self, msg):
        core, kind = self.core, msg[0]
        if kind == "ready":
            _, seq, seconds = msg
            self.staged.add(seq)
            self.times[seq].prefetch = seconds
        elif kind == "batch":
            _, seq, _worker, samples, seconds = msg
            mb = self.batches.pop(seq)
            times = self.times.pop(seq)
            times.read = seconds
            core.stats.read_s += seconds
            self.results[seq] = Batch(mb.epoch, mb.step, mb.indices, samples, times, mb.end, mb.last)
            while self.emit_ptr in self.results:
                core.out.put((self.emit_ptr, self.results.pop(self.emit_ptr)))
                self.emit_ptr += 1
        elif kind == "consumed":
            self.consumed = max(self.consumed, msg[1] + 1)
        elif kind == "error":
            self.fail(msg)
            return True
        return False
