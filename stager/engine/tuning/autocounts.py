"""``auto`` process counts: chosen at start from a probe, resized while running.

At start (``resolve``) the node leader probes a few files of the source; every
rank of the node receives its measurements and asks the model
(``perf.choose_counts``) for the same counts. While running, a
``PoolResizer`` feeds its pool's ``perf.Tuner`` with what is asked of the
pool and how long each item took, and between minibatches grows or shrinks
the pool as the tuner decides (``WorkerPool.grow``/``shrink``: no task is lost,
none is reordered: tasks wait on the same queue, and batches are put in plan
order by sequence number whoever decodes them).
"""

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .. import perf
from ..perf import cpu_ticks
from ..workers.limits import workers_room
from ... import telemetry as tm
from ...errors import StageError
from ...sources.deadline import within
from ...world import agree

log = logging.getLogger(__name__)

PREFETCH, READ = tm.POOL_PREFETCH, tm.POOL_READ


def is_auto(value):
    return value == "auto"


def tunes_in_flight(staging, dataset):
    """Whether the files each prefetcher keeps in flight are ``auto`` (tuned with the prefetchers).

    Only where the prefetchers are ``auto`` too: a count the user set for
    them keeps the source's files in flight (one for a file system), as it
    did. A group's shared service (``staging.share``) follows the same rule.
    """
    return staging.enabled and is_auto(staging.prefetchers) and is_auto(dataset.requests_in_flight)


def resolve(staging, reader, dataset, batch_size, catalog, source, node_comm, loader=None, first=None, into=None,
            leaders=None, given=None):
    """The ``StagingConfig`` and ``ReaderConfig`` with ``auto`` counts made numbers.

    Collective over ``node_comm`` (None: this rank alone) when a count is
    ``auto``, and over ``leaders`` on the node leaders; a rank whose config
    has none returns at once, as do all ranks of a job, since they share one
    config.

    Args:
        loader: What the readers decode with (the pipeline's loader: a front
            end's ``SampleDecoder`` too); default ``dataset.loader``.
        first: Sample indices the probe reads (the plan's first files,
            ``perf.probe.first_files``), or None: spread over the catalog.
        into: A callable, run on the node leader only, giving the directory
            the probe's copies stay in (the job's staging directory), or None.
        leaders: With peers, on a node leader, the leaders' communicator: a
            leader given no ``first`` files (every one it reads first comes
            from another node) takes another leader's measurements rather
            than open files of the source that another node reads.
        given: A callable, run on the node leader only, returning
            measurements already made, ``(rates dict, (prefetchers, in
            flight, jobs attached) or None)``, or None to probe: a shared
            group's, whose counts a joining job takes rather than reading
            the source again. Its readers are its share of one job's: the
            group decodes each minibatch once, with every job's readers.

    Returns:
        ``(staging, reader, rates, in_flight)``: ``rates`` is the probe's
        ``perf.Rates`` (None without ``auto``); ``in_flight`` the files each
        prefetcher starts with in flight where they are tuned
        (``tunes_in_flight``), else None.
    """
    if not (is_auto(staging.prefetchers) or is_auto(reader.workers)):
        return staging, reader, None, None

    def probe(picks):
        options = {"hdf5_key": dataset.hdf5_key, "layout": dataset.layout}
        # Its reads of the source have the stall limit too: a hung source fails the start, not hangs it.
        return within(staging.stall_timeout_s, perf.probe, source, catalog, loader or dataset.loader, options,
                      batch_size=batch_size, picks=picks,
                      into=into() if into is not None and picks else None).to_dict()

    def measure():
        found = given() if given is not None else None
        if found is not None:
            return found
        if leaders is None:
            return probe(first), None
        return _among_leaders(leaders, probe, first), None

    measured, theirs = agree(node_comm, measure, lambda text: StageError(
        f"the node leader could not probe {catalog.root} for auto counts: {text}", stage="prefetch"))
    rates = perf.Rates.from_dict(measured)
    prefetchers, readers = perf.choose_counts(rates, miss=1.0 if staging.enabled else 0.0)
    if not staging.enabled:
        # Readers open the source themselves: they wait on its latency as prefetchers would.
        readers = max(readers, prefetchers)
    in_flight = None
    if tunes_in_flight(staging, dataset):
        prefetchers, in_flight = perf.start_split(prefetchers, rates, most_in_flight=source.concurrency,
                                                  most_processes=prefetcher_limit(rates))
    if theirs is not None:  # the group's prefetchers as they run now, however its tuner moved them
        prefetchers, in_flight = theirs[0], theirs[1] if in_flight is not None else None
        # Each reader process costs its start (a fork, the image libraries, its first shared memory) however
        # little it decodes; a pool that falls short grows (``reader.workers: auto``), also as jobs leave.
        readers = max(1, readers // theirs[2])
    if is_auto(staging.prefetchers):
        staging = replace(staging, prefetchers=prefetchers)
    if is_auto(reader.workers):
        reader = replace(reader, workers=readers)
    fetching = (f"{staging.prefetchers} prefetchers x {in_flight or source.concurrency} files in flight, "
                if staging.enabled else "staging off, ")
    log.info("stager: auto counts%s: %s%s readers (probe: open %.1f ms, %.0f MB/s, read %.2f ms/file, CPU %.2f "
             "ms/file, %d cores)", f" (the group's, {theirs[2]} jobs)" if theirs is not None else "", fetching,
             reader.workers,
             rates.open_s * 1000, rates.bandwidth / 1e6, rates.read_s * 1000, rates.cpu_s * 1000, rates.cores)
    return staging, reader, rates, in_flight


def _among_leaders(leaders, probe, first):
    """This leader's probe of its ``first`` files; without any, another leader's (collective over ``leaders``).

    Every leader learns whether each one's probe failed, so that none waits
    on another that gave up. A leader that takes another's measurements keeps
    its own cores and memory; where no leader had files of its own, each
    probes a spread of the catalog.
    """
    mine, failure = None, None
    if first:
        try:
            mine = probe(first)
        except Exception as exc:
            failure = exc
    told = leaders.allgather((mine, None if failure is None else f"{type(failure).__name__}: {failure}"))
    if failure is not None:
        raise failure
    for leader, (_, text) in enumerate(told):
        if text is not None:
            raise StageError(f"node leader {leader} could not probe the source for auto counts: {text}",
                             stage="prefetch")
    if mine is not None:
        return mine
    theirs = next((rates for rates, _ in told if rates is not None), None)
    if theirs is None:
        return probe(None)
    cores, memory = perf.machine()
    return dict(theirs, cores=cores, memory=memory)


def reader_limit(rates):
    """The most readers ``auto`` may grow to."""
    return perf.count_limits(rates)[1]


def prefetcher_limit(rates):
    """The most prefetchers ``auto`` may grow to (memory allowing), whatever the source's pace."""
    return perf.count_limits(replace(rates, bandwidth=0.0))[0]


def source_limit(rates):
    """``(seconds per file) -> prefetchers``: the most worth having at the time per file measured.

    The bandwidth the probe saw bounds them at the time each file takes now,
    so a source that slows down (each open waits longer) allows more.
    """
    return lambda per_file: perf.count_limits(rates, per_file=per_file)[0]


def slot_limit(rates, most):
    """``(seconds per file) -> files in flight``: as ``source_limit``, for files rather than processes."""
    return lambda per_file: min(most, perf.start.bandwidth_limit(rates, per_file) or most)


@dataclass
class AutoFetch:
    """What the node's staging service needs to size its prefetchers while running (``prefetchers: auto``).

    Attributes:
        limit: The most prefetcher processes (``prefetcher_limit``).
        source_limit: ``(seconds per file) -> size``: the most worth having
            at the time per file measured (``source_limit``, or ``slot_limit``
            where files in flight are tuned).
        in_flight: Files each prefetcher starts with in flight where they are
            tuned (``resolve``), else None.
    """

    limit: int
    source_limit: Optional[Callable] = None
    in_flight: Optional[int] = None

    @classmethod
    def of(cls, rates, in_flight, most_in_flight):
        limit = prefetcher_limit(rates)
        if in_flight is None:
            return cls(limit, source_limit(rates), None)
        return cls(limit, slot_limit(rates, limit * most_in_flight), in_flight)

    def resizer(self, pool, telemetry, threads=None, most_threads=1):
        """The prefetchers' ``PoolResizer`` (``threads``: the shared files-in-flight bound, with ``in_flight``)."""
        return PoolResizer(pool, PREFETCH, self.limit, telemetry, limit=self.source_limit, threads=threads,
                           most_threads=most_threads)


class PoolResizer:
    """Resizes one pool as its ``perf.Tuner`` decides.

    With ``threads`` (the prefetchers' shared files-in-flight bound) the
    tuner sizes the files in flight, processes x threads, and each decision
    is split threads first (``perf.split_slots``): a process is added only
    where the prefetchers were busy on their own CPU, with cores to spare,
    or their threads cannot hold the files asked for.

    Args:
        pool: The ``WorkerPool``.
        stage: ``PREFETCH`` or ``READ`` (recorded in the telemetry).
        high: The largest size (``perf.count_limits``): processes.
        telemetry: Where ``RESIZED`` events go.
        before_grow: Optional callable ``(count)`` returning ``(keep_fds, owned)``
            for that many new workers, made before they start (readers' rings).
        limit: Optional callable ``(seconds per item) -> size`` below the
            largest size (``source_limit``; ``slot_limit`` with ``threads``).
        threads: A shared integer, the files each prefetcher keeps in flight
            (``prefetcher_main``'s ``in_flight``), or None.
        most_threads: The most ``threads`` may be (the source's concurrency).
    """

    def __init__(self, pool, stage, high, telemetry, before_grow=None, limit=None, threads=None, most_threads=1):
        self.pool = pool
        self.stage = stage
        self.threads, self.most_threads = threads, most_threads if threads is not None else 1
        self.high = max(high, pool.size)
        # The cores ``cpu_ticks`` reads: what a worker's CPU seconds are a share of.
        self.cores = len(os.sched_getaffinity(0))
        # Files in flight cost threads, not cores: never fewer than the start's (``perf.start_split``).
        low = min(self.size(), perf.start.START_IN_FLIGHT) if threads is not None else 1
        self.tuner = perf.Tuner(self.size(), low, self.high * self.most_threads, limit=limit, cores=self.cores)
        self.telemetry = telemetry
        self.before_grow = before_grow
        self._ticks = cpu_ticks()  # the cores' clock ticks when the tuner's window began
        self._window = time.monotonic()
        self.why = []  # one reason per change, in order (``counts_timeline``)

    def size(self):
        """The tuner's unit: workers, or files in flight (processes x threads)."""
        return self.pool.size * (self.threads.value if self.threads is not None else 1)

    def asked(self, items):
        self.tuner.asked(items, time.monotonic())

    def finished(self, items, seconds, cpu_s=None, queued_s=None):
        self.tuner.finished(items, seconds, cpu_s, queued_s)

    def staged(self, msg):
        """A prefetcher's ``Staged`` reply: its files, and the time each kept a fetch (or a process) going."""
        if self.threads is None and msg.busy_s is not None:
            # Workers are processes here, each holding several files at once: a task's span is what it
            # kept its process, and its CPU is not a share of one worker's.
            self.finished(len(msg.done), msg.seconds)
        else:
            self.finished(len(msg.done), msg.seconds if msg.busy_s is None else msg.busy_s, msg.cpu_s, msg.queued_s)

    def _cpu_bound(self, now, cores_busy):
        """Whether the prefetchers were busy on their own CPU (``PROCESS_BUSY`` of a core each), cores to spare."""
        _, cpu_s, _ = self.tuner.window()
        elapsed = now - self._window
        if cpu_s is None or elapsed <= 0 or cores_busy is None or cores_busy >= perf.tune.CORES_FULL:
            return False
        return cpu_s / elapsed / self.pool.size >= perf.start.PROCESS_BUSY

    def resize(self):
        """Applies the tuner's decision, if any; True when the pool changed (wait on its new ``conns``)."""
        now = time.monotonic()
        if not self.tuner.due(now):
            return False  # read the cores' load once a window, not every turn of the loop
        ticks = cpu_ticks()
        cores_busy = None
        if ticks is not None and self._ticks is not None and ticks[1] > self._ticks[1]:
            cores_busy = (ticks[0] - self._ticks[0]) / (ticks[1] - self._ticks[1])
        self._ticks = ticks
        cpu_bound = self.threads is not None and self._cpu_bound(now, cores_busy)
        decision = self.tuner.decide(now, cores_busy)
        self._window = now
        if decision is None or decision.count == self.size():
            return False
        processes, threads = decision.count, None
        if self.threads is not None:
            processes, threads = perf.split_slots(decision.count, self.pool.size,
                                                  cpu_bound and decision.count > self.size(),
                                                  self.most_threads, self.high)
        change = processes - self.pool.size
        if change > 0:
            # Each worker costs this process a few descriptors: growth stops short of its open-files limit.
            change = min(change, workers_room())
        if change > 0:
            keep_fds, owned = self.before_grow(change) if self.before_grow else ((), ())
            self.pool.grow(change, keep_fds, owned)
        elif change < 0:
            self.pool.shrink(-change)
        moved = threads is not None and threads != self.threads.value
        if moved:
            self.threads.value = threads
        self.tuner.count = self.size()  # what the pool is, where a limit held it below the decision
        if change == 0 and not moved:
            return False
        self.tuner.restart(time.monotonic())  # judge the new size on a window of its own
        self._ticks, self._window = cpu_ticks(), time.monotonic()
        if change:
            self.telemetry.record(tm.RESIZED, self.stage, self.pool.size, decision.per_item_s)
            self.why.append(decision.why + (", the prefetchers busy on their own CPU" if cpu_bound else ""))
        if moved:
            self.telemetry.record(tm.RESIZED, tm.POOL_IN_FLIGHT, threads, decision.per_item_s)
            self.why.append(decision.why)
        log.debug("stager: %s pool now %d x %d (demand %.1f/s, %.2f ms per item, %.0f%% busy: %s)",
                  "prefetch" if self.stage == PREFETCH else "read", self.pool.size,
                  self.threads.value if self.threads is not None else 1, decision.demand,
                  decision.per_item_s * 1000, decision.busy * 100, decision.why)
        return True
