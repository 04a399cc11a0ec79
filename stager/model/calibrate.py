"""Measuring what a machine gives: the cores free now, and the stages' costs from a run's totals.

``available_cores`` spins one process a core to see what the cores give
now; ``from_summary`` reads what a run measured (a ``Stats.summary`` or
``stager run --report``'s JSON): prefetcher busy seconds per file, reader
seconds per sample, compute per step, on top of a probe's source latency
and bandwidth (``stager.engine.perf.probe``), where each is measured best.
"""

import time
from dataclasses import replace

from ..engine.perf import machine


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def available_cores(seconds=0.3):
    """Cores this machine gives us now: CPU seconds that one spinning process per core got, over the wall time.

    On a quiet machine this is the number of cores; on a shared one that is
    busy, less, which is what the stages will get (``machine`` counts the
    cores only).
    """
    import multiprocessing
    import resource

    cores, _ = machine()
    ctx = multiprocessing.get_context("fork")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    procs = [ctx.Process(target=_spin, args=(seconds,), name="stager-probe-cpu") for _ in range(cores)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    wall = time.perf_counter() - begin
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return min(float(cores), used / wall) if wall > 0 else float(cores)


def cores_note(before, after):
    """What a measurement between two ``available_cores`` readings can claim: the lines to print with it."""
    cores = machine()[0]
    note = f"cores free (spinning one process a core for 0.3 s): {before:.2f} of {cores} before, {after:.2f} after"
    if min(before, after) < 0.9 * cores:
        note += "\nWARNING: other work took the cores meanwhile; these figures describe a busy machine"
    return note


def from_summary(summary, base):
    """``base`` with the stages' costs a run measured.

    Args:
        summary: ``Stats.summary()`` or ``stager run --report``'s JSON (with
            ``files_staged``, ``prefetch_busy_s``, ``samples``, ``read_busy_s``,
            ``batches``, ``compute_s``; ``config`` for the batch size;
            ``per_rank`` for the start).
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
    starts = [r["startup_s"] for r in summary.get("per_rank") or () if "startup_s" in r]
    if starts:
        changes["startup_s"] = max(starts)
    batch = (summary.get("config") or {}).get("plan", {}).get("batch_size")
    if batch:
        changes["batch_size"] = int(batch)
    return replace(base, **changes)

