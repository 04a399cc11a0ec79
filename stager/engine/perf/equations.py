"""The model's equations: throughput and stall of the three stages from measured rates.

Pure functions over two small records: ``Rates`` (what was measured on this
machine and source) and ``Settings`` (what is asked about). Every time is in
seconds, every size in bytes.

Per file, one prefetcher spends its open's latency, the file's bytes over
the source's bandwidth, and its own CPU (copy, publish, messages)::

    f = open_s + size / bandwidth + copy_s                              (1)

``P`` prefetchers each fetch one file at a time, and together cannot exceed
the shared bandwidth (Little's law: files in flight = rate x time per file)::

    fetch_rate = min(P / f, bandwidth / size)             files/s        (2)

A reader decodes a whole minibatch of ``b`` files, ``read_s`` each, plus a
fixed ``batch_s`` (hand-over through shared memory); ``M`` readers, at most
one per core::

    read_rate = min(M, cores) / (b * read_s + batch_s)    minibatches/s  (3)

All CPU work shares the cores: a sample costs ``miss * copy_s`` in a
prefetcher (``miss``: the fraction of files fetched from the source),
``read_s + batch_s / b`` in a reader and ``main_s`` in the rank's own
process (scheduling threads, receiving the decoded arrays)::

    cpu_rate = cores / (miss * copy_s + read_s + batch_s / b + main_s)   samples/s  (4)

The rank's process does its share in one interpreter, one core at most
(``b * main_s`` a step). A step can go no faster than its compute, its
fetches, its reading, the CPU or the rank's process, and with enough
look-ahead it goes as fast as the slowest of them::

    step_s = max(compute_s, b * miss / fetch_rate, 1 / read_rate, b / cpu_rate, b * main_s)   (5)
    throughput = b / step_s,   stall = 1 - compute_s / step_s                      (6)

The stage that sets ``step_s`` is the bottleneck. ``miss`` comes from the
cache (``misses.py``): 1 for a cold, unbounded cache's first epoch, 0 for
its later epochs, and in between what a bounded clairvoyant cache misses.
Such a cache misses unevenly within an epoch, so a run over it is the sum of
its minibatches' steps, each at its own miss fraction (``predict_run``, (7)).
"""

import math
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Rates:
    """What was measured (a calibration).

    Attributes:
        open_s: Latency of one open at the source.
        bandwidth: The source's shared bandwidth in bytes/s; 0: unlimited.
        copy_s: A prefetcher's own time per file, beyond latency and bytes.
        read_s: A reader's time per file (read from local storage and decode).
        batch_s: A reader's time per minibatch beyond its files (hand-over).
        compute_s: The training step's time per minibatch.
        file_bytes: Mean bytes per file.
        main_s: The rank process's own CPU per sample.
        batch_size: Samples per minibatch (of one rank).
        cores: CPU cores the stages share.
        memory: Bytes of memory available for workers (0: not known).
        cpu_s: The probe process's CPU seconds per file (fetched, decoded,
            system calls included); 0: not measured.
        startup_s: A run's start: the seconds before its slowest rank first
            asked for a minibatch (the stages forked, the catalog agreed);
            0: not measured.
    """

    open_s: float
    bandwidth: float
    copy_s: float
    read_s: float
    batch_s: float = 0.0
    compute_s: float = 0.0
    file_bytes: float = 0.0
    main_s: float = 0.0
    batch_size: int = 32
    cores: float = 1.0
    memory: float = 0.0
    cpu_s: float = 0.0
    startup_s: float = 0.0

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, data):
        """A ``Rates`` from ``to_dict``'s output; unknown keys are refused."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown calibration keys {sorted(unknown)}; valid: "
                             f"{sorted(cls.__dataclass_fields__)}")
        return cls(**data)


@dataclass(frozen=True)
class Settings:
    """What is asked about; None keeps the calibration's value.

    Attributes:
        prefetchers: Prefetcher processes of the node.
        readers: Reader processes of the rank.
        open_s: Another latency per open.
        bandwidth: Another shared bandwidth (bytes/s, 0: unlimited).
        compute_s: Another compute time per step.
        miss: Fraction of files fetched from the source (1: a cold cache).
    """

    prefetchers: int
    readers: int
    open_s: float = None
    bandwidth: float = None
    compute_s: float = None
    miss: float = 1.0


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one ``Settings``.

    Attributes:
        samples_per_s: Steady throughput.
        step_s: Time per minibatch.
        stall: Fraction of the time the training loop waits.
        bottleneck: ``compute``, ``fetch``, ``read``, ``cpu`` or ``main``.
        fetch_rate: Files/s the prefetchers can deliver.
        read_rate: Minibatches/s the readers can decode.
        cpu_rate: Samples/s the cores allow.
    """

    samples_per_s: float
    step_s: float
    stall: float
    bottleneck: str
    fetch_rate: float
    read_rate: float
    cpu_rate: float


def with_source(rates, open_s=None, bandwidth=None, compute_s=None):
    """``rates`` with another source or compute (None keeps each)."""
    changes = {k: v for k, v in (("open_s", open_s), ("bandwidth", bandwidth), ("compute_s", compute_s))
               if v is not None}
    return replace(rates, **changes)


def per_file_s(rates):
    """Equation (1): one prefetcher's time per file."""
    transfer = rates.file_bytes / rates.bandwidth if rates.bandwidth > 0 else 0.0
    return rates.open_s + transfer + rates.copy_s


def fetch_rate(rates, prefetchers):
    """Equation (2): files/s that ``prefetchers`` deliver."""
    rate = prefetchers / per_file_s(rates) if per_file_s(rates) > 0 else math.inf
    if rates.bandwidth > 0 and rates.file_bytes > 0:
        rate = min(rate, rates.bandwidth / rates.file_bytes)
    return rate


def read_rate(rates, readers):
    """Equation (3): minibatches/s that ``readers`` decode."""
    per_batch = rates.batch_size * rates.read_s + rates.batch_s
    return min(readers, max(rates.cores, 1.0)) / per_batch if per_batch > 0 else math.inf


def cpu_rate(rates, miss):
    """Equation (4): samples/s the cores allow."""
    per_sample = miss * rates.copy_s + rates.read_s + rates.batch_s / rates.batch_size + rates.main_s
    return rates.cores / per_sample if per_sample > 0 else math.inf


def predict(rates, settings):
    """Equations (5) and (6) for ``settings`` on ``rates``.

    Args:
        rates: A ``Rates`` (the calibration).
        settings: A ``Settings``.

    Returns:
        A ``Prediction``.
    """
    r = with_source(rates, settings.open_s, settings.bandwidth, settings.compute_s)
    b, miss = r.batch_size, settings.miss
    fetch = fetch_rate(r, settings.prefetchers)
    read = read_rate(r, settings.readers)
    cpu = cpu_rate(r, miss)
    times = {"compute": r.compute_s, "fetch": b * miss / fetch if miss > 0 else 0.0,
             "read": 1.0 / read, "cpu": b / cpu, "main": b * r.main_s}
    bottleneck = max(times, key=times.get)
    step = times[bottleneck]
    if step <= 0:
        return Prediction(math.inf, 0.0, 0.0, bottleneck, fetch, read, cpu)
    return Prediction(b / step, step, max(0.0, 1.0 - r.compute_s / step), bottleneck, fetch, read, cpu)


def predict_run(rates, settings, misses_per_step, ahead=16):
    """A whole run's throughput when the misses differ from minibatch to minibatch (a bounded cache).

    A bounded clairvoyant cache keeps the files the next epoch reads first,
    so that epoch's misses come bunched at its end (``misses.step_misses``).
    An epoch's mean miss fraction in (5) would hide that its start waits on
    the compute and its end on the prefetchers: the mean of the steps' times
    is more than the time of the mean step. So each minibatch ``k`` has its
    own fetch time ``w_k = misses_k / fetch_rate`` and the time ``s_k`` of
    the other terms of (5) at its own miss fraction. The prefetchers serve
    the minibatches in order, at most ``ahead`` (the look-ahead) past the one
    being consumed; ``F_k`` is when minibatch ``k`` is fetched, ``S_k`` when
    its step starts::

        F_k = max(F_{k-1}, S_{k-ahead}) + w_k
        S_k = max(S_{k-1} + s_{k-1}, F_k)                                   (7)

    With the same misses at every step, (7) gives (5)'s step time again.

    Args:
        rates: A ``Rates``.
        settings: A ``Settings`` (its ``miss`` is ignored).
        misses_per_step: For each epoch, the files fetched from the source
            for each of its minibatches (``misses.step_misses``).
        ahead: Minibatches asked for ahead (``staging.lookahead``).

    Returns:
        ``(samples_per_s, stall, seconds)`` from the first minibatch's step to
        the end (steady: the wait for the first minibatch is start-up).
    """
    r = with_source(rates, settings.open_s, settings.bandwidth, settings.compute_s)
    b = r.batch_size
    fetch = fetch_rate(r, settings.prefetchers)
    steady = max(r.compute_s, 1.0 / read_rate(r, settings.readers), b * r.main_s)
    rest = {}  # step time of the stages other than fetching, by misses (at most b + 1 values a rank)
    started = []
    fetched = end = 0.0
    for epoch in misses_per_step:
        for misses in epoch:
            misses = int(misses)
            if misses not in rest:
                rest[misses] = max(steady, b / cpu_rate(r, misses / b))
            issued = started[-ahead] if len(started) >= ahead else 0.0
            fetched = max(fetched, issued) + misses / fetch
            start = max(end, fetched)
            started.append(start)
            end = start + rest[misses]
    if not started:
        return math.inf, 0.0, 0.0
    seconds = end - started[0]
    if seconds <= 0:
        return math.inf, 0.0, 0.0
    return len(started) * b / seconds, max(0.0, 1.0 - len(started) * r.compute_s / seconds), seconds
