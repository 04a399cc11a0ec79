"""Starts, wires and stops the three stages.

The parent process runs a coordinator thread that walks the plan (stage 1),
hands prefetch tasks to the prefetchers (stage 2) up to ``staging.lookahead``
minibatches ahead of the consumer, hands a minibatch to the readers (stage 3)
once all its files are staged, and puts decoded minibatches in plan order on
a queue that ``next()`` takes from. The coordinator alone decides which file
is copied by which task, so a file is never copied twice.

Shutdown protocol (``close()``, idempotent; also on an error in any stage, at
the end of the plan, and on leaving a ``with`` block):
  1. stop the coordinator (flag plus a wake-up message) and join it;
  2. set the stop event and send one ``None`` sentinel per worker;
  3. join each worker until ``processes.shutdown_timeout_s``, draining the
     reply queue meanwhile so that no worker blocks on a full pipe;
  4. terminate, then kill, whatever is still alive;
  5. remove the job's staging directory unless ``staging.keep`` is set.
Workers also exit on their own when the parent dies (they poll getppid).
"""

import logging
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import plan as planlib
from .catalog import Catalog
from .errors import StageError
from .jobdir import JobDir
from .stats import BatchTimes, Stats
from .workers import prefetcher_main, reader_main

log = logging.getLogger(__name__)

_ABSENT, _IN_FLIGHT, _STAGED = 0, 1, 2
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
    """

    epoch: int
    step: int
    indices: np.ndarray
    samples: list
    times: BatchTimes


class Pipeline:
    """Stages the plan's minibatches to node-local storage and decodes them.

    Iterate it (``for batch in pipeline``) to receive ``Batch`` objects in
    plan order. Use it as a context manager, or call ``close()``.

    Args:
        config: A ``Config``.
        catalog: The samples; default: built from ``config.dataset``.
        loader: Overrides ``config.dataset.loader``: a registry name,
            ``module:function`` or a callable taking a path (it must be
            picklable unless the start method is ``fork``).
        start: ``(epoch, step)`` of the first minibatch to deliver.
        on_staged: Optional callable ``(relpath, bytes, epoch)`` called in the
            coordinator thread for each file copied.
    """

    def __init__(self, config, catalog=None, *, loader=None, start=(0, 0), on_staged=None):
        self.config = config
        self.catalog = catalog if catalog is not None else Catalog.load(config.dataset)
        self.stats = Stats()
        self._loader = loader if loader is not None else config.dataset.loader
        self._start = start
        self._on_staged = on_staged
        self._staging = config.staging.enabled
        self._read_ahead = config.reader.ahead or 2 * config.reader.workers
        self._jobdir = JobDir(config.staging, self.catalog.root) if self._staging else None
        self._procs = []
        self._out = queue.Queue()
        self._halt = threading.Event()
        self._coordinator = None
        self._started = False
        self._closed = False

    @property
    def local_dir(self):
        """The job's node-local staging directory, or None when reading directly."""
        return self._jobdir.path if self._jobdir else None

    def worker_pids(self):
        """Process ids of the live prefetchers and readers."""
        return [p.pid for p in self._procs if p.is_alive()]

    # Lifecycle ------------------------------------------------------------

    def start(self):
        """Creates the staging directory and starts the workers; idempotent."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("pipeline is closed")
        self._started = True
        try:
            self._launch()
        except BaseException:
            self.close()
            raise
        return self

    def _launch(self):
        cfg = self.config
        ctx = multiprocessing.get_context(cfg.processes.start_method)
        self._stop = ctx.Event()
        self._events = ctx.Queue()
        self._read_q = ctx.Queue()
        self._prefetch_q = ctx.Queue() if self._staging else None
        parent = os.getpid()
        read_root = self.catalog.root
        if self._staging:
            read_root = self._jobdir.create()
            for i in range(cfg.staging.prefetchers):
                self._spawn(ctx, f"stager-prefetch-{i}", prefetcher_main,
                            (i, parent, self.catalog.root, read_root, self._prefetch_q, self._events, self._stop))
        options = {"hdf5_key": cfg.dataset.hdf5_key}
        for i in range(cfg.reader.workers):
            self._spawn(ctx, f"stager-read-{i}", reader_main,
                        (i, parent, read_root, self._loader, options, self._read_q, self._events, self._stop))
        self._coordinator = threading.Thread(target=self._coordinate, name="stager-coordinator", daemon=True)
        self._coordinator.start()

    def _spawn(self, ctx, name, target, args):
        proc = ctx.Process(target=target, args=args, name=name, daemon=True)
        proc.start()
        self._procs.append(proc)

    def close(self):
        """Stops every worker and removes the staging directory; safe to call twice."""
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
        self._stop_workers()
        if self._jobdir is not None:
            self._jobdir.remove()

    def _stop_workers(self):
        if not self._procs and not hasattr(self, "_stop"):
            return
        self._stop.set()
        for q, count in ((self._prefetch_q, self.config.staging.prefetchers),
                         (self._read_q, self.config.reader.workers)):
            if q is not None:
                for _ in range(count):
                    q.put(None)
        deadline = time.monotonic() + self.config.processes.shutdown_timeout_s
        for proc in self._procs:
            while proc.is_alive() and time.monotonic() < deadline:
                self._drain()
                proc.join(0.05)
        for proc in self._procs:
            if proc.is_alive():
                log.warning("stager: %s (pid %s) did not stop in time; terminating", proc.name, proc.pid)
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for q in (self._events, self._read_q, self._prefetch_q):
            if q is not None:
                q.cancel_join_thread()  # nobody will read what is left
                q.close()
        self._procs = []

    def _drain(self):
        try:
            while True:
                self._events.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        try:
            self.close()
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
            self.close()
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
    """The scheduling loop; lives in one thread of the parent process."""

    def __init__(self, pipe):
        self.pipe = pipe
        cfg = pipe.config
        self.catalog = pipe.catalog
        self.lookahead = cfg.staging.lookahead if pipe._staging else pipe._read_ahead
        self.plan = planlib.iterate(len(self.catalog), cfg.plan, *pipe._start)
        self.exhausted = False
        self.batches = {}       # seq -> Minibatch, from dispatch until delivered
        self.times = {}         # seq -> BatchTimes
        self.results = {}       # seq -> Batch decoded but waiting for its turn
        self.state = np.zeros(len(self.catalog), dtype=np.uint8)
        self.next_seq = 0       # next minibatch to take from the plan
        self.read_ptr = 0       # next minibatch to hand to a reader
        self.emit_ptr = 0       # next minibatch to deliver
        self.consumed = 0       # minibatches the consumer has taken

    def run(self):
        pipe = self.pipe
        while not pipe._halt.is_set():
            self.schedule()
            if self.exhausted and self.emit_ptr == self.next_seq:
                pipe._out.put(_END)
                return
            try:
                msg = pipe._events.get(timeout=1.0)
            except queue.Empty:
                if self.check_workers():
                    return
                continue
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
                missing = mb.indices[self.state[mb.indices] == _ABSENT]
                if len(missing):
                    self.state[missing] = _IN_FLIGHT
                    files = [(int(i), self.catalog.path(i), int(self.catalog.sizes[i])) for i in missing]
                    pipe._prefetch_q.put((seq, mb.epoch, mb.step, files))
        while (self.read_ptr < self.next_seq and self.read_ptr < self.consumed + pipe._read_ahead
               and self.ready(self.read_ptr)):
            mb = self.batches[self.read_ptr]
            files = [(self.catalog.path(i), self.catalog.label(i)) for i in mb.indices]
            pipe._read_q.put((self.read_ptr, mb.epoch, mb.step, files))
            self.read_ptr += 1

    def ready(self, seq):
        return not self.pipe._staging or bool(np.all(self.state[self.batches[seq].indices] == _STAGED))

    def handle(self, msg):
        pipe, kind = self.pipe, msg[0]
        if kind == "staged":
            _, seq, _worker, done, seconds = msg
            epoch = self.batches[seq].epoch
            self.times[seq].prefetch += seconds
            pipe.stats.prefetch_s += seconds
            for index, nbytes in done:
                self.state[index] = _STAGED
                if nbytes:
                    pipe.stats.files_staged += 1
                    pipe.stats.bytes_staged += nbytes
                    if pipe._on_staged is not None:
                        pipe._on_staged(self.catalog.path(index), nbytes, epoch)
                else:
                    pipe.stats.files_present += 1
        elif kind == "batch":
            _, seq, _worker, samples, seconds = msg
            mb = self.batches.pop(seq)
            times = self.times.pop(seq)
            times.read = seconds
            pipe.stats.read_s += seconds
            self.results[seq] = Batch(mb.epoch, mb.step, mb.indices, samples, times)
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

    def check_workers(self):
        """Reports a worker that died without saying why (killed, segfault)."""
        for proc in self.pipe._procs:
            if proc.exitcode is not None:
                self.pipe._out.put(StageError(
                    f"{proc.name} (pid {proc.pid}) exited unexpectedly with code {proc.exitcode}",
                    stage="prefetch" if "prefetch" in proc.name else "read"))
                return True
        return False
