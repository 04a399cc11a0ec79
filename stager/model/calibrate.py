"""Measuring the model's rates: a short probe of the source, and a run's totals.

``probe`` costs a few files: it fetches them one at a time from the source
into a temporary directory, timing the open (when the source is a file
system), the bytes and the publication apart, then decodes the local copies
with the run's loader. ``from_summary`` reads what a run measured (a
``Stats.summary`` or ``stager run --report``'s JSON): prefetcher busy
seconds per file, reader seconds per sample, compute per step. ``combine``
keeps the source's latency and bandwidth from the probe and the stages'
costs from the run, where each is measured best.
"""

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace

from ..loaders import make_loader
from .equations import Rates

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


def _time_posix(root, rel):
    """``(open_s, read_s, bytes)`` of one file read from a file system."""
    path = os.path.join(root, rel)
    begin = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    opened = time.perf_counter()
    nbytes = 0
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            nbytes += len(chunk)
    finally:
        os.close(fd)
    return opened - begin, time.perf_counter() - opened, nbytes


def probe(source, catalog, loader="npy", loader_options=None, files=PROBE_FILES, batch_size=32, compute_s=0.0,
          start=0):
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

    Returns:
        A ``Rates``.
    """
    n = len(catalog)
    stride = max(1, n // max(1, files))
    picks = sorted({(start + i * stride) % n for i in range(min(files, n))})
    opens, reads, fetches, decodes, sizes = [], [], [], [], []
    root = source.local_root
    load = make_loader(loader, loader_options or {})
    scratch = tempfile.mkdtemp(prefix="stager-probe-")
    try:
        for index in picks:
            rel, size = catalog.path(index), int(catalog.sizes[index])
            if root is not None:
                o, r, nbytes = _time_posix(root, rel)
                opens.append(o)
                reads.append(r)
            begin = time.perf_counter()
            source.fetch(rel, size, catalog.mtime(index), scratch)
            fetches.append(time.perf_counter() - begin)
            sizes.append(size)
            begin = time.perf_counter()
            load(os.path.join(scratch, rel))
            decodes.append(time.perf_counter() - begin)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fetch_s = statistics.median(fetches)
    mean_bytes = statistics.fmean(sizes)
    if opens:
        open_s = statistics.median(opens)
        read_s = statistics.median(reads)
        # A read much faster than a millisecond says nothing about a bandwidth cap.
        bandwidth = mean_bytes / read_s if read_s > 1e-3 else 0.0
        copy_s = max(0.0, fetch_s - open_s - read_s)
    else:  # an object store: the request is the latency, its bytes ride with it
        open_s, bandwidth, copy_s = fetch_s, 0.0, 0.0
    cores, memory = machine()
    return Rates(open_s=open_s, bandwidth=bandwidth, copy_s=copy_s, read_s=statistics.median(decodes),
                 compute_s=compute_s, file_bytes=mean_bytes, main_s=MAIN_S, batch_size=batch_size, cores=cores,
                 memory=memory)


def from_summary(summary, base):
    """``base`` with the stages' costs a run measured.

    Args:
        summary: ``Stats.summary()`` or ``stager run --report``'s JSON (with
            ``files_staged``, ``prefetch_busy_s``, ``samples``, ``read_busy_s``,
            ``batches``, ``compute_s``; ``config`` for the batch size).
        base: A ``Rates`` with the source's latency and bandwidth (a probe).

    Returns:
        A ``Rates``: a prefetcher's own cost per file is what its busy time
        per file leaves after the latency and the bytes.
    """
    changes = {}
    if summary.get("files_staged") and summary.get("prefetch_busy_s"):
        per_file = summary["prefetch_busy_s"] / summary["files_staged"]
        transfer = base.file_bytes / base.bandwidth if base.bandwidth > 0 else 0.0
        changes["copy_s"] = max(0.0, per_file - base.open_s - transfer)
    if summary.get("samples") and summary.get("read_busy_s"):
        changes["read_s"] = summary["read_busy_s"] / summary["samples"]
        changes["batch_s"] = 0.0
    if summary.get("batches") and summary.get("compute_s"):
        changes["compute_s"] = summary["compute_s"] / summary["batches"]
    if summary.get("main_cpu_s") and summary.get("samples"):
        changes["main_s"] = summary["main_cpu_s"] / summary["samples"]
    batch = (summary.get("config") or {}).get("plan", {}).get("batch_size")
    if batch:
        changes["batch_size"] = int(batch)
    return replace(base, **changes)
