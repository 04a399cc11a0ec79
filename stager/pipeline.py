"""Starts, wires and stops the three stages for one rank.

Each rank runs a coordinator thread that walks its share of the plan
(stage 1), asks the node's staging service (``service.py``, stage 2) for each
minibatch up to ``staging.lookahead`` minibatches ahead of the consumer, hands
a minibatch to its reader processes (stage 3) once the service says all its
files are local, and puts decoded minibatches in plan order on a queue that
``next()`` takes from. On the node leader (local rank 0) the pipeline also
owns the job directory and the service.

Shutdown protocol (``close()``, idempotent; also on an error in any stage, at
the end of the plan, and on leaving a ``with`` block):
  1. stop the coordinator (flag plus a wake-up message) and join it;
  2. tell the staging service goodbye;
  3. set the readers' stop event and send one ``None`` sentinel per reader;
     join each until ``processes.shutdown_timeout_s``, draining replies so no
     reader blocks on a full pipe; then terminate, then kill;
  4. on the node leader: wait (up to ``processes.peer_wait_s``, not at all
     on an error) for the node's other ranks to leave the service, stop the
     prefetchers the same way, and remove the job directory unless
     ``staging.keep`` is set.
Workers also exit on their own when their parent dies (they poll getppid).
"""

import contextlib
import multiprocessing
import multiprocessing.connection as mpc
import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import plan as planlib
from .catalog import Catalog, broadcast_catalog
from .errors import StageError
from .jobdir import JobDir, agreed_job_id
from .service import StagingService, stop_processes
from .stats import BatchTimes, Stats
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
        self._loader = loader if loader is not None else config.dataset.loader
        if plan is None:
            plan = planlib.iterate(len(catalog), config.plan, start[0], start[1], rank=self.world.rank,
                                   size=self.world.size)
        self._plan = iter(plan)
        self._on_staged = on_staged
        self._staging = config.staging.enabled
        self._read_ahead = config.reader.ahead or 2 * config.reader.workers
        self._jobdir = None
        self.local_dir = None
        if self._staging:
            self._jobdir = JobDir(config.staging, catalog.root, agreed_job_id(config.staging, self.world),
                                  self.world)
            self.local_dir = self._jobdir.path
        self._service = None
        self._client = None
        self._procs = []
        self._out = queue.Queue()
        self._halt = threading.Event()
        self._coordinator = None
        self._started = False
        self._closed = False

    def worker_pids(self):
        """Process ids of this rank's live prefetchers (node leader only) and readers."""
        procs = self._procs + (self._service.procs if self._service else [])
        return [p.pid for p in procs if p.is_alive()]

    # Lifecycle ------------------------------------------------------------

    def start(self):
        """Starts the workers (collective under MPI); idempotent."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("pipeline is closed")
        self._started = True
        try:
            self._launch()
        except BaseException:
            self._shutdown(wait_for_peers=False)
            raise
        return self

    def _launch(self):
        cfg = self.config
        ctx = multiprocessing.get_context(cfg.processes.start_method)
        with _children_skip_mpi(cfg.processes.start_method):
            read_root = self.catalog.root
            if self._staging:
                read_root = self._connect_service(ctx)
            self._stop = ctx.Event()
            self._events = ctx.Queue()
            self._read_q = ctx.Queue()
            options = {"hdf5_key": cfg.dataset.hdf5_key}
            for i in range(cfg.reader.workers):
                proc = ctx.Process(target=reader_main, name=f"stager-read-{i}", daemon=True,
                                   args=(i, os.getpid(), read_root, self._loader, options, self._read_q,
                                         self._events, self._stop))
                proc.start()
                self._procs.append(proc)
        self._coordinator = threading.Thread(target=self._coordinate, name="stager-coordinator", daemon=True)
        self._coordinator.start()

    def _connect_service(self, ctx):
        """Starts (leader) or joins (other ranks) the node's staging service.

        Returns:
            The node-local directory to read staged files from.
        """
        world = self.world
        shared = world.node_comm is not None and world.local_size > 1
        info = None
        if world.node_leader:
            try:
                path = self._jobdir.create()
                remote = world.local_size - 1 if shared else 0
                self._service = StagingService(self.config, self.catalog, path, remote, self.stats,
                                               self._on_staged)
                self._client = self._service.start(ctx)
                info = ("ok", path, self._service.address, self._service.authkey)
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
            self._client = mpc.Client(info[2], family="AF_UNIX", authkey=info[3])
        return info[1]

    def close(self):
        """Stops every worker and removes the staging directory; safe to call twice."""
        self._shutdown(wait_for_peers=True)

    def _shutdown(self, wait_for_peers, error=None):
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        self._halt.set()
        self._out.put(_END)  # wakes a consumer blocked in next() on another thread
        if self._coordinator is not None:
            self._events.put(("wake",))
            self._coordinator.join(timeout=self.config.processes.shutdown_timeout_s)
        if self._client is not None:
            with contextlib.suppress(OSError, EOFError):
                if error is not None and self._service is not None:
                    # The node's other ranks learn why their staging stops.
                    reason = str(error).split("\n\nOriginal traceback")[0]
                    self._client.send(("fail", f"rank {self.world.rank} failed: {type(error).__name__}: {reason}"))
                self._client.send(("bye",))
            self._client.close()
        if self._procs:
            self._stop.set()
            for _ in self._procs:
                self._read_q.put(None)
            stop_processes(self._procs, self._events, self.config.processes.shutdown_timeout_s)
            self._procs = []
        if hasattr(self, "_events"):
            for q in (self._events, self._read_q):
                q.cancel_join_thread()  # nobody will read what is left
                q.close()
        if self._service is not None:
            self._service.close(self.config.processes.peer_wait_s if wait_for_peers else 0)
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
        begin = time.perf_counter()
        item = self._out.get()
        stall = time.perf_counter() - begin
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self._shutdown(wait_for_peers=False, error=item)
            raise item
        seq, batch = item
        self._events.put(("consumed", seq))
        batch.times.stall = stall
        self.stats.delivered(len(batch.samples), batch.times)
        return batch

    # Coordinator ----------------------------------------------------------

    def _coordinate(self):
        try:
            _Coordinator(self).run()
        except BaseException as exc:  # a bug here must reach the consumer, not hang it
            self._out.put(StageError(f"coordinator failed: {type(exc).__name__}: {exc}", stage="pipeline"))


class _Coordinator:
    """The rank's scheduling loop; lives in one thread of the rank process."""

    def __init__(self, pipe):
        self.pipe = pipe
        cfg = pipe.config
        self.lookahead = max(cfg.staging.lookahead, pipe._read_ahead) if pipe._staging else pipe._read_ahead
        self.plan = pipe._plan
        self.exhausted = False
        self.batches = {}       # seq -> Minibatch, from request until delivered
        self.times = {}         # seq -> BatchTimes
        self.staged = set()     # seqs whose files are all local
        self.results = {}       # seq -> Batch decoded, waiting for its turn
        self.next_seq = 0       # next minibatch to take from the plan
        self.read_ptr = 0       # next minibatch to hand to a reader
        self.emit_ptr = 0       # next minibatch to deliver
        self.consumed = 0       # minibatches the consumer has taken

    def run(self):
        pipe = self.pipe
        events = pipe._events
        sources = [events._reader] + ([pipe._client] if pipe._client is not None else [])
        while not pipe._halt.is_set():
            self.schedule()
            if self.exhausted and self.emit_ptr == self.next_seq:
                pipe._out.put(_END)
                return
            ready = mpc.wait(sources, timeout=1.0)
            if not ready:
                if self.check_readers():
                    return
                continue
            for source in ready:
                if source is pipe._client:
                    try:
                        msg = pipe._client.recv()
                    except (EOFError, OSError):
                        msg = ("error", "prefetch", "service", None, None, None, "ServiceGone",
                               "the node's staging service (on local rank 0) is gone", None)
                else:
                    msg = events.get()
                if self.handle(msg):
                    return

    def schedule(self):
        pipe = self.pipe
        while not self.exhausted and self.next_seq < self.consumed + self.lookahead:
            mb = next(self.plan, None)
            if mb is None:
                self.exhausted = True
                break
            seq = self.next_seq
            self.next_seq += 1
            self.batches[seq] = mb
            self.times[seq] = BatchTimes()
            if pipe._staging:
                pipe._client.send(("need", seq, mb.epoch, mb.step, mb.indices))
            else:
                self.staged.add(seq)
        catalog = pipe.catalog
        while (self.read_ptr < self.next_seq and self.read_ptr < self.consumed + pipe._read_ahead
               and self.read_ptr in self.staged):
            mb = self.batches[self.read_ptr]
            self.staged.discard(self.read_ptr)
            files = [(catalog.path(i), catalog.label(i)) for i in mb.indices]
            pipe._read_q.put((self.read_ptr, mb.epoch, mb.step, files))
            self.read_ptr += 1

    def handle(self, msg):
        pipe, kind = self.pipe, msg[0]
        if kind == "ready":
            _, seq, seconds = msg
            self.staged.add(seq)
            self.times[seq].prefetch = seconds
        elif kind == "batch":
            _, seq, _worker, samples, seconds = msg
            mb = self.batches.pop(seq)
            times = self.times.pop(seq)
            times.read = seconds
            pipe.stats.read_s += seconds
            self.results[seq] = Batch(mb.epoch, mb.step, mb.indices, samples, times, mb.end, mb.last)
            while self.emit_ptr in self.results:
                pipe._out.put((self.emit_ptr, self.results.pop(self.emit_ptr)))
                self.emit_ptr += 1
        elif kind == "consumed":
            self.consumed = max(self.consumed, msg[1] + 1)
        elif kind == "error":
            _, stage, worker, epoch, step, path, cause, message, tb = msg
            pipe._out.put(StageError(f"{stage} worker {worker} failed: {message}", stage=stage, epoch=epoch,
                                     step=step, path=path, cause=cause, remote_traceback=tb))
            return True
        return False

    def check_readers(self):
        """Reports a reader that died without saying why (killed, segfault)."""
        for proc in self.pipe._procs:
            if proc.exitcode is not None:
                self.pipe._out.put(StageError(
                    f"{proc.name} (pid {proc.pid}) exited unexpectedly with code {proc.exitcode}", stage="read"))
                return True
        return False
