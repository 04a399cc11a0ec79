"""Counts from the model (``auto``) at start, from a probe, and the most a pool may grow to.

At start, ``choose_counts`` asks the equations how fast the rest of the
pipeline can go with the cores there are (the compute is not known yet, so
as fast as reading and the CPU allow), and gives the readers and the
prefetchers that rate with some headroom: by Little's law a pool that must
serve ``rate`` items a second, each keeping a worker ``t`` seconds, needs
``rate x t`` workers. The CPU's share comes from the probe process's CPU
per file (system calls included), and the headroom never goes past the rate
the cores allow, so the pool starts at about the count beyond which the
cores, not the source, would set the pace.
"""

import math
from dataclasses import replace

from .equations import Settings, per_file_s, predict

HEADROOM = 1.3          # workers beyond the law's count: rates vary file to file
PROCESS_BYTES = 64 << 20  # memory a worker process takes, for the upper bound
MAX_PREFETCHERS = 64
_UNBOUNDED = 1 << 30  # prefetchers enough that fetching sets no limit


def bounded(count, low, high):
    """``count`` within ``[low, high]``, as a whole number."""
    return int(max(low, min(high, count)))


def bandwidth_limit(rates, per_file):
    """The most prefetchers worth having when each spends ``per_file`` seconds a file.

    Beyond the count that fills the source's bandwidth they add nothing
    (allowed twice that: eight files read at once can underestimate it).
    None where the bandwidth or the file size is not known.
    """
    if rates.bandwidth > 0 and rates.file_bytes > 0:
        return math.ceil(2 * per_file * rates.bandwidth / rates.file_bytes) + 1
    return None


def count_limits(rates, max_prefetchers=MAX_PREFETCHERS, per_file=None):
    """``(max_prefetchers, max_readers)`` this machine and source allow.

    Readers decode: more than the cores only queue for them. Prefetchers
    mostly wait: at most ``bandwidth_limit`` at the probe's time per file (or
    ``per_file``, a time measured since). Both together must fit in half the
    available memory.
    """
    readers = max(1, int(rates.cores))
    prefetchers = max_prefetchers
    source = bandwidth_limit(rates, per_file_s(rates) if per_file is None else per_file)
    if source is not None:
        prefetchers = min(prefetchers, source)
    if rates.memory:
        room = max(2, int(rates.memory / 2 // PROCESS_BYTES))
        readers = min(readers, max(1, room // 4))
        prefetchers = min(prefetchers, max(1, room - readers))
    return max(1, prefetchers), readers


def choose_counts(rates, miss=1.0, max_prefetchers=MAX_PREFETCHERS):
    """The prefetchers and readers ``auto`` starts with.

    Args:
        rates: A ``Rates`` from a probe (``probe.probe``).
        miss: Fraction of files to fetch (1: a cold cache).
        max_prefetchers: Upper bound for the prefetchers.

    Returns:
        ``(prefetchers, readers)``.
    """
    if rates.cpu_s > 0:
        # The probe's copy time is a wall time among threads that share the cores; its CPU
        # per file is the steadier measure of a file's own cost (what is not decoding is fetching).
        rates = replace(rates, copy_s=max(0.0, rates.cpu_s - rates.read_s))
    p_max, r_max = count_limits(rates, max_prefetchers)
    b = rates.batch_size
    # The rate reading and the CPU allow (fetching's CPU included), with every reader there may be
    # and as many prefetchers as it takes.
    best = predict(rates, Settings(prefetchers=_UNBOUNDED, readers=r_max, miss=miss))
    per_batch = b * rates.read_s + rates.batch_s
    readers = bounded(math.ceil(best.samples_per_s / b * per_batch * HEADROOM), 1, r_max)
    rate = predict(rates, Settings(prefetchers=_UNBOUNDED, readers=readers, miss=miss))
    # The compute is not known before the run: the pool starts at what the rest allows (the
    # running tuner shrinks it when the training step is slower), with headroom, but never
    # past the rate the cores allow: beyond that, more prefetchers only wait for a core.
    files = min(rate.samples_per_s * HEADROOM, rate.cpu_rate) * miss
    # Never one: a lone prefetcher at the law's count is busy most of the time, and each file
    # that takes longer than the probe's (a core busy decoding) delays all the next ones.
    prefetchers = bounded(math.ceil(files * per_file_s(rates)), min(2, p_max), p_max)
    return prefetchers, readers
