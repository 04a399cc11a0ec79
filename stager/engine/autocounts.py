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
from dataclasses import replace

from . import perf
from .limits import workers_room
from .perf import cpu_ticks
from .. import telemetry as tm
from ..errors import StageError
from ..sources.deadline import within
from ..world import agree

log = logging.getLogger(__name__)

PREFETCH, READ = tm.POOL_PREFETCH, tm.POOL_READ


def is_auto(value):
    return value == "auto"


def resolve(staging, reader, dataset, batch_size, catalog, source, node_comm, loader=None):
    """The ``StagingConfig`` and ``ReaderConfig`` with ``auto`` counts made numbers.

    Collective over ``node_comm`` (None: this rank alone) when a count is
    ``auto``; a rank whose config has none returns at once, as do all ranks
    of a job, since they share one config.

    Args:
        loader: What the readers decode with (the pipeline's loader: a front
            end's ``SampleDecoder`` too); default ``dataset.loader``.

    Returns:
        ``(staging, reader, rates)``: ``rates`` is the probe's ``perf.Rates``
        (None without ``auto``).
    """
    if not (is_auto(staging.prefetchers) or is_auto(reader.workers)):
        return staging, reader, None

    def measure():
        options = {"hdf5_key": dataset.hdf5_key, "layout": dataset.layout}
        # Its reads of the source have the stall limit too: a hung source fails the start, not hangs it.
        return within(staging.stall_timeout_s, perf.probe, source, catalog, loader or dataset.loader, options,
                      batch_size=batch_size).to_dict()

    rates = perf.Rates.from_dict(agree(node_comm, measure, lambda text: StageError(
        f"the node leader could not probe {catalog.root} for auto counts: {text}", stage="prefetch")))
    prefetchers, readers = perf.choose_counts(rates, miss=1.0 if staging.enabled else 0.0)
    if not staging.enabled:
        # Readers open the source themselves: they wait on its latency as prefetchers would.
        readers = max(readers, prefetchers)
    if is_auto(staging.prefetchers):
        staging = replace(staging, prefetchers=prefetchers)
    if is_auto(reader.workers):
        reader = replace(reader, workers=readers)
    log.info("stager: auto counts: %s prefetchers, %s readers (probe: open %.1f ms, %.0f MB/s, read %.2f ms/file, "
             "CPU %.2f ms/file, %d cores)", staging.prefetchers, reader.workers, rates.open_s * 1000,
             rates.bandwidth / 1e6, rates.read_s * 1000, rates.cpu_s * 1000, rates.cores)
    return staging, reader, rates


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


class PoolResizer:
    """Resizes one pool as its ``perf.Tuner`` decides.

    Args:
        pool: The ``WorkerPool``.
        stage: ``PREFETCH`` or ``READ`` (recorded in the telemetry).
        high: The largest size (``perf.count_limits``).
        telemetry: Where ``RESIZED`` events go.
        before_grow: Optional callable ``(count)`` returning ``(keep_fds, owned)``
            for that many new workers, made before they start (readers' rings).
        limit: Optional callable ``(seconds per item) -> size`` below ``high``
            (``source_limit``).
    """

    def __init__(self, pool, stage, high, telemetry, before_grow=None, limit=None):
        self.pool = pool
        self.stage = stage
        # The cores ``cpu_ticks`` reads: what a worker's CPU seconds are a share of.
        self.tuner = perf.Tuner(pool.size, 1, max(high, pool.size), limit=limit, cores=len(os.sched_getaffinity(0)))
        self.telemetry = telemetry
        self.before_grow = before_grow
        self._ticks = cpu_ticks()  # the cores' clock ticks when the tuner's window began

    def asked(self, items):
        self.tuner.asked(items, time.monotonic())

    def finished(self, items, seconds, cpu_s=None):
        self.tuner.finished(items, seconds, cpu_s)

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
        decision = self.tuner.decide(now, cores_busy)
        if decision is None or decision.count == self.pool.size:
            return False
        change = decision.count - self.pool.size
        if change > 0:
            # Each worker costs this process a few descriptors: growth stops short of its open-files limit.
            change = min(change, workers_room())
        if change > 0:
            keep_fds, owned = self.before_grow(change) if self.before_grow else ((), ())
            self.pool.grow(change, keep_fds, owned)
        elif change < 0:
            self.pool.shrink(-change)
        self.tuner.count = self.pool.size  # what the pool is, where the limit held it below the decision
        if change == 0:
            return False
        self.tuner.restart(time.monotonic())  # judge the new size on a window of its own
        self._ticks = cpu_ticks()
        self.telemetry.record(tm.RESIZED, self.stage, self.pool.size, decision.per_item_s)
        log.debug("stager: %s pool now %d (demand %.1f/s, %.2f ms per item, %.0f%% busy)",
                  "prefetch" if self.stage == PREFETCH else "read", self.pool.size, decision.demand,
                  decision.per_item_s * 1000, decision.busy * 100)
        return True
