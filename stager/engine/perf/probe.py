"""A short probe of the source and the decoding, and the cores' load: the rates ``auto`` counts start from.

``probe`` costs a few files, read at once in threads: it times each one's
open (when the source is a file system) and bytes apart, then fetches it
into a temporary directory and decodes the local copy with the run's
loader, and counts the CPU all that took. ``cpu_ticks`` reads how busy the
cores are, which the running tuner weighs.
"""

import itertools
import os
import resource
import shutil
import statistics
import tempfile
import time

from .equations import Rates
from ...formats import make_decoder
from ...sources.deadline import parallel, reading

PROBE_FILES = 8


# The rank process's own CPU per sample (coordinator, service, receiving the
# decoded arrays), which a probe outside a run cannot see: 0.13-0.2 ms on the
# 2-core development machine (docs/benchmarks.md); a run's report measures it.
MAIN_S = 0.15e-3


def machine():
    """``(cores, memory)`` of this machine: usable cores and bytes of memory available."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    memory = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    memory = int(line.split()[1]) * 1024
    except OSError:
        pass
    return cores, memory


def _union(intervals):
    """Seconds covered by at least one of ``intervals`` (``(start, end)`` pairs)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _time_posix(root, rel):
    """``(asked, opened, began, ended)`` instants of one file read from a file system (the probe's copy
    was found already there: nothing timed it)."""
    path = os.path.join(root, rel)
    asked = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    opened = time.perf_counter()
    try:
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
    return asked, opened, opened, time.perf_counter()


def probe(source, catalog, loader="npy", loader_options=None, files=PROBE_FILES, batch_size=32, compute_s=0.0,
          start=0, picks=None, into=None):
    """Measures the source and the decoding on a few files (seconds).

    Args:
        source: The run's ``Source``.
        catalog: Its ``Catalog``.
        loader: The run's loader (registry name, ``module:function`` or callable).
        loader_options: The loader's options (``hdf5_key``, ``layout``).
        files: How many files to probe; spread over the catalog.
        batch_size: The run's samples per minibatch (kept in the result).
        compute_s: The training step's time, when known.
        start: First catalog index to probe from (a different one per call
            avoids files the operating system has cached).
        picks: The sample indices to probe (a run's first ones, see
            ``first_files``), instead of ``files`` spread from ``start``.
        into: Where the copies go and stay (a run's staging directory, whose
            prefetchers then find them there: the probe's opens are the
            run's own); None: a temporary directory, removed.

    Returns:
        A ``Rates``.
    """
    n = len(catalog)
    if picks is None:
        stride = max(1, n // max(1, files))
        picks = sorted({(start + i * stride) % n for i in range(min(files, n))})
    root = source.local_root
    decoder = make_decoder(catalog.sample_decoder(loader, loader_options or {}), loader_options or {})
    files = catalog.files  # a sample's file, or the container it is packed in
    scratch = into or tempfile.mkdtemp(prefix="stager-probe-")
    # The run's copies are decoded from local copies of the probe's own: a loader that keeps files open
    # (HDF5 shares one open file among all handles of an inode, forked readers included) must not hand
    # the run's readers a handle made here.
    private = tempfile.mkdtemp(prefix=".stager-probe-", dir=into) if into else None

    def one(index):
        # Each file in its own thread: the probe costs about one file's latency, not one per file.
        file = int(catalog.file_index([index])[0])
        rel, size = files.path(file), int(files.sizes[file])
        with reading("open", source.describe(rel)):
            begin = time.perf_counter()
            if root is None:
                timed = None
                source.fetch(rel, size, files.mtime(file), scratch)
            else:
                # One open, timed inside the copy the run keeps (``into``): apart, then the bytes.
                times = []
                source.fetch(rel, size, files.mtime(file), scratch, times=times)
                asked, opened, began, ended = times[-1] if times else _time_posix(root, rel)
                timed = (opened - asked, ended - began, size, began, ended)
        fetched = time.perf_counter()
        decoder.decode(_private(scratch, rel, private), index, 0)
        return timed, fetched - begin, time.perf_counter() - fetched, size

    # The process's CPU, not wall times: what the files cost the cores whatever the waits
    # (their system calls and running the threads included), which sets how many files a
    # second the cores allow. An estimate: 1 to 3 ms a 64 KiB file from probe to probe on the
    # 2-core development machine, and a pipeline also hands files between processes.
    cpu_before = _cpu_seconds()
    try:
        # Its threads' reads count against the caller's deadline (``sources.deadline``), where it set one.
        results = parallel(one, picks, len(picks), "stager-probe")
    finally:
        shutil.rmtree(private or scratch, ignore_errors=True)
    cpu_s = (_cpu_seconds() - cpu_before) / len(picks)
    fetches = [r[1] for r in results]
    decodes = [r[2] for r in results]
    sizes = [r[3] for r in results]
    timed = [r[0] for r in results if r[0] is not None]
    fetch_s = statistics.median(fetches)
    mean_bytes = statistics.fmean(sizes)
    if timed:
        # Waiting for a core only ever adds to a latency: the quickest open is the source's.
        open_s = min(t[0] for t in timed)
        # Reads sharing a capped link are active exactly while it is busy: their
        # bytes over the time any of them was active is the shared bandwidth.
        busy = _union([(t[3], t[4]) for t in timed])
        bandwidth = sum(t[2] for t in timed) / busy if busy > 0 else 0.0
        # The fetch opens and reads again, then writes and publishes: the rest is its own cost.
        copy_s = max(0.0, min(fetches) - open_s - min(t[1] for t in timed))
    else:  # an object store: the request is the latency, its bytes ride with it
        open_s, bandwidth, copy_s = fetch_s, 0.0, 0.0
    cores, memory = machine()
    return Rates(open_s=open_s, bandwidth=bandwidth, copy_s=copy_s, read_s=statistics.median(decodes),
                 compute_s=compute_s, file_bytes=mean_bytes, main_s=MAIN_S, batch_size=batch_size, cores=cores,
                 memory=memory, cpu_s=cpu_s)


def _private(root, rel, private):
    """``root/rel``, or a copy of it under ``private``: a file of its own (another inode, which HDF5 does not
    take for the run's file either)."""
    path = os.path.join(root, rel)
    if private is None:
        return path
    alias = os.path.join(private, rel)
    os.makedirs(os.path.dirname(alias), exist_ok=True)
    shutil.copyfile(path, alias)
    return alias


def first_files(catalog, minibatches, files=PROBE_FILES, keep=None):
    """Sample indices of the first ``files`` distinct files (or containers) of the plan's first epoch, in order.

    Args:
        minibatches: The plan's ``Minibatch`` objects, in order (may never end:
            only the first epoch is read).
        keep: ``(file, seq) -> bool``, whether a file first met in the
            ``seq``-th minibatch (from 0) may be picked; None: any. With peers,
            only the files this node reads from the source, not another
            node's: the probe's copy is then the job's one read of it.
    """
    picks, seen, epoch = [], set(), None
    for seq, batch in enumerate(minibatches):
        if epoch is None:
            epoch = batch.epoch
        elif batch.epoch != epoch:
            break
        indices = [int(i) for i in batch.indices]
        for index, file in zip(indices, catalog.file_index(indices).tolist()):
            if file not in seen:
                seen.add(file)
                if keep is not None and not keep(file, seq):
                    continue
                picks.append(index)
                if len(picks) == files:
                    return picks
    return picks


def peek_first_files(catalog, minibatches, files=PROBE_FILES):
    """``first_files`` of a plan that is an iterator, read once: ``(first, the same minibatches, whole)``.

    A front end that draws its orders as it goes (Chainer's order samplers)
    hands the pipeline an iterator; the minibatches looked at here are put
    back in front of the rest.
    """
    taken = []

    def taking():
        for batch in minibatches:
            taken.append(batch)
            yield batch

    first = first_files(catalog, taking(), files)
    return first, itertools.chain(taken, minibatches)


def _cpu_seconds():
    """User and system CPU seconds of this process so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_ticks():
    """``(busy, total)`` clock ticks of the cores this process may run on, so far; None where unknown.

    From ``/proc/stat`` (Linux): every process's work on those cores counts,
    a file system's daemon and the kernel's included, which is what sets how
    much more work they can take.
    """
    try:
        cores = os.sched_getaffinity(0)
    except AttributeError:
        return None
    busy = total = 0
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(" ")
                if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
                    continue
                ticks = [int(v) for v in rest.split()[:8]]
                total += sum(ticks)
                busy += sum(ticks) - ticks[3] - ticks[4]  # all but idle and waiting for I/O
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None
