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


# Files one prefetcher keeps in flight at most, in threads: a file waiting on the source costs a
# thread, not a core, so requests in flight grow here before processes do.
MAX_IN_FLIGHT = 64
# A prefetcher busy on its own CPU this share of a core sets the pace of its files: another process helps.
PROCESS_BUSY = 0.6
# Files in flight at start, at least, and the fewest the tuner keeps: a request waiting on the source
# costs a thread, and every file too few in flight is a step of epoch 1 waiting on the source's latency.
START_IN_FLIGHT = 16


def split_slots(slots, processes, cpu_bound=False, most_in_flight=MAX_IN_FLIGHT, most_processes=MAX_PREFETCHERS):
    """``(processes, in_flight)`` that keep up to ``slots`` files in flight: threads first.

    A process is added only where the prefetchers' own CPU is the limit
    (``cpu_bound``: the caller saw them busy on their cores, with cores to
    spare); more files than the processes' threads can hold wait for that.
    There are never more processes than files in flight.

    Args:
        slots: Files in flight wanted (the tuner's count).
        processes: Prefetcher processes now.
        cpu_bound: Whether one more process would add CPU the prefetchers lack.
        most_in_flight: Files one process fetches at once at most.
        most_processes: The most processes (memory, open files).
    """
    slots = max(1, int(slots))
    count = max(1, min(max(1, processes) + (1 if cpu_bound else 0), slots, most_processes))
    return count, max(1, min(most_in_flight, math.ceil(slots / count)))


def start_split(slots, rates, most_in_flight=MAX_IN_FLIGHT, most_processes=MAX_PREFETCHERS):
    """``(processes, in_flight)`` at start for ``slots`` files in flight (``choose_counts``' prefetchers).

    Twice the law's count of files in flight (at least ``START_IN_FLIGHT``:
    cheap, and the running tuner sheds what is not used), and as many
    processes as the prefetchers' own CPU per file (the probe's CPU beyond
    decoding) needs at the rate those files allow (and the cores, fetching
    and decoding each file, allow), each at most ``PROCESS_BUSY`` of a
    core, never more than the cores.
    """
    slots = max(START_IN_FLIGHT, 2 * int(slots))
    own = max(0.0, rates.cpu_s - rates.read_s) if rates.cpu_s > 0 else rates.copy_s
    per_file = per_file_s(rates)
    rate = slots / per_file if per_file > 0 else 0.0
    if rates.cpu_s > 0:
        rate = min(rate, rates.cores / rates.cpu_s)
    cpu = rate * own
    processes = bounded(math.ceil(cpu / PROCESS_BUSY), 1, max(1, min(int(rates.cores), most_processes)))
    return split_slots(slots, processes, most_in_flight=most_in_flight, most_processes=most_processes)
