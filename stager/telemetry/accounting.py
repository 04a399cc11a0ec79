"""Where one rank's time went, read from its pipeline's event log.

The log (``stager.telemetry``) is written as the run goes, a few appends per
minibatch and one per file; nothing here runs before the run ends. From it,
per rank:

- the consumer's loop, step by step: the wait in ``next()`` (a ``CONSUMED``
  event's value) and the compute between one ``next()`` returning and the
  next call. Every moment of the loop is one of: wait, compute, or ``other``
  (before the first ``next()`` and after the last), so the three add up to
  the loop's wall time;
- each stage's busy time (readers: ``READ``; on the node leader the node's
  prefetchers: ``TASK``), its work (files, bytes, samples) and its rate. A
  prefetcher's busy time is the sum of its files' fetch times, several at
  once where it keeps several files in flight: its slots are prefetchers x
  files in flight;
- the depth of the queues between the stages, as a time-weighted mean and
  maximum over the loop;
- a timeline in ``BINS`` bins from the pipeline's creation: the fraction of
  each stage's workers busy, the consumer's wait and the queues, per bin.

``job_stages`` sums the ranks' records into the measured rate of every stage
for the whole job, the structure the stall report and a tuner read.
"""

import math

import numpy as np

from . import events as tm
from .ledger import by_epoch

BINS = 120          # timeline bins per rank
STEPS_KEPT = 2000   # per-step series longer than this are summed in groups of ``stride`` steps


def _r(x):
    return round(float(x), 6)


def _edges(width, nbins):
    return np.arange(nbins + 1, dtype=np.float64) * width


def _interval_bins(intervals, width, nbins):
    """Seconds of ``(start, end)`` intervals falling in each of ``nbins`` bins of ``width`` from 0."""
    if not intervals:
        return [0.0] * nbins
    iv = np.asarray(intervals, dtype=np.float64)
    lo, hi = np.sort(iv[:, 0]), np.sort(np.maximum(iv[:, 1], iv[:, 0]))
    # Busy seconds before t: sum over intervals of clip(t - lo, 0, hi - lo), from sorted ends and prefix sums.
    edges = _edges(width, nbins)
    clo, chi = np.concatenate(([0.0], np.cumsum(lo))), np.concatenate(([0.0], np.cumsum(hi)))
    nlo, nhi = np.searchsorted(lo, edges), np.searchsorted(hi, edges)
    busy = (nlo * edges - clo[nlo]) - (nhi * edges - chi[nhi])
    return np.diff(busy).tolist()


def _depth(changes, lo, hi, width, nbins):
    """A queue's depth from its ``(time, +n/-n)`` changes: (mean over [lo, hi], max there, per-bin mean)."""
    if not changes:
        return 0.0, 0, [0.0] * nbins
    ch = np.asarray(sorted(changes), dtype=np.float64)
    times = ch[:, 0]
    # A retried task has no QUEUED of its own: a depth never goes below 0.
    depth = np.maximum(np.cumsum(ch[:, 1]), 0.0)  # from times[j] until times[j + 1]
    area = np.concatenate(([0.0], np.cumsum(depth[:-1] * np.diff(times))))  # integral up to times[j]

    def integral(t):
        j = np.searchsorted(times, t, side="right") - 1
        inside = j >= 0
        jj = np.where(inside, j, 0)
        return np.where(inside, area[jj] + depth[jj] * (t - times[jj]), 0.0)

    bins = np.diff(integral(_edges(width, nbins))) / width
    mean = float(integral(np.array([hi]))[0] - integral(np.array([lo]))[0]) / (hi - lo) if hi > lo else 0.0
    # The largest depth held at some moment of [lo, hi].
    after = np.append(times[1:], np.inf)
    held = (times <= hi) & (after > lo)
    peak = float(depth[held].max()) if held.any() else 0.0
    return mean, peak, bins.tolist()


def _steps_series(ends, waits, computes):
    n = len(ends)
    stride = max(1, math.ceil(n / STEPS_KEPT))
    if stride == 1:
        return {"stride": 1, "end": [_r(x) for x in ends], "wait": [_r(x) for x in waits],
                "compute": [_r(x) for x in computes]}
    groups = range(0, n, stride)
    return {"stride": stride, "end": [_r(ends[min(i + stride, n) - 1]) for i in groups],
            "wait": [_r(sum(waits[i:i + stride])) for i in groups],
            "compute": [_r(sum(computes[i:i + stride])) for i in groups]}


def _mean_size(start, changes, begin, end):
    """The time-weighted mean size over [begin, end] of a pool of ``start`` workers resized at ``changes``."""
    if end <= begin:
        return float(changes[-1][1] if changes and changes[-1][0] <= begin else start)
    total, size, at = 0.0, start, begin
    for t, new in changes:
        if t >= end:
            break
        if t > at:
            total, at = total + size * (t - at), t
        size = new
    return (total + size * (end - at)) / (end - begin)


def _product(start_a, a_changes, start_b, b_changes):
    """The changes of ``a x b``: ``a`` starts at ``start_a`` and changes at ``a_changes`` (``(t, size)``), ``b`` likewise."""
    a, b, out = start_a, start_b, []
    for t, which, size in sorted([(t, 0, size) for t, size in a_changes] + [(t, 1, size) for t, size in b_changes]):
        a, b = (size, b) if which == 0 else (a, size)
        out.append((t, a * b))
    return out


def _core_times(tasks, cores):
    """Of the prefetchers' busy seconds, those on a core and those queued for one.

    Args:
        tasks: ``(task id, busy seconds)`` of the ``TASK`` events.
        cores: ``(task id, microseconds queued or -1, CPU seconds)`` of the ``TASK_CPU`` events.

    Returns:
        ``{"timed_busy_s", "cpu_s", "queued_s"}`` over the tasks whose CPU was
        measured (``queued_s`` None where the kernel did not say), or ``{}``
        where none was.
    """
    if not cores:
        return {}
    busy_of = dict(tasks)
    known = [(busy_of.get(task, 0.0), queued, cpu) for task, queued, cpu in cores]
    return {"timed_busy_s": _r(sum(k[0] for k in known)), "cpu_s": _r(sum(k[2] for k in known)),
            "queued_s": None if any(k[1] < 0 for k in known) else _r(sum(k[1] for k in known) / 1e6)}


def account(telemetry, *, rank, node, readers, prefetchers=None, in_flight=1, loop_begin=None, loop_end=None):
    """One rank's accounting, from its ``Telemetry``.

    Args:
        telemetry: The rank's pipeline's event log.
        rank: This rank.
        node: This rank's node name.
        readers: Reader processes of this rank.
        prefetchers: On the node leader of a staged run, the node's
            prefetchers at start; None elsewhere. A pool resized while
            running (``RESIZED`` events) is reported by its mean size over
            the staging time.
        in_flight: Files each prefetcher fetches at once at start
            (``dataset.requests_in_flight`` resolved); resized while running
            (``POOL_IN_FLIGHT`` events) likewise.
        loop_begin: ``time.monotonic()`` when the training loop began; default:
            its first ``next()``.
        loop_end: ``time.monotonic()`` when it ended; default: the ``next()``
            that found the end, else the last minibatch consumed.

    Returns:
        A JSON-ready dictionary (described in docs/analyze.md, "Where the time goes").
    """
    origin = telemetry.started
    t, kind, a, b, value = telemetry.arrays()

    def of(k, *columns):
        mask = kind == k
        picked = [col[mask].tolist() for col in columns]
        return list(zip(*picked)) if len(picked) > 1 else picked[0]

    steps = of(tm.CONSUMED, t, b, value)
    reads = of(tm.READ, t, b, value)
    tasks = of(tm.TASK, t, b, value)
    queued = of(tm.QUEUED, t, b, value)
    needed, ready, delivered = of(tm.NEEDED, t), of(tm.READY, t), of(tm.DELIVERED, t)
    finished = of(tm.FINISHED, t, value)
    changes = of(tm.RESIZED, t, a, b)
    resized = [(at, size) for at, pool, size in changes if pool == tm.POOL_PREFETCH]
    threads = [(at, size) for at, pool, size in changes if pool == tm.POOL_IN_FLIGHT]
    finished = finished[0] if finished else None
    # One event per file: the log keeps only the latest, its totals count them all.
    # PRESENT is a copy found already there, NO_SPACE one not kept; 0 bytes is an empty file copied.
    staged_files, staged_bytes, present = telemetry.file_totals(tm.STAGED)
    peer_files, peer_bytes, _ = telemetry.file_totals(tm.PEER)

    calls = [t - w for t, _, w in steps]
    if loop_begin is not None:
        begin = loop_begin - origin
    else:
        begin = calls[0] if calls else 0.0
    last_call = finished[0] - finished[1] if finished else None
    if loop_end is not None:
        end = loop_end - origin
    elif finished:
        end = finished[0]
    else:
        end = steps[-1][0] if steps else begin
    waits = [w for _, _, w in steps]
    computes = []
    for i, (t, _, _) in enumerate(steps):
        upto = calls[i + 1] if i + 1 < len(steps) else (last_call if last_call is not None else end)
        computes.append(max(upto - t, 0.0))
    wait_s = sum(waits) + (finished[1] if finished else 0.0)
    compute_s = sum(computes)
    wall = max(end - begin, 0.0)
    first_wait = waits[0] if waits else 0.0
    before = (calls[0] - begin) if calls else 0.0
    steady_wall = wall - first_wait - before
    samples = sum(b for _, b, _ in steps)

    width = max(end, 1e-9) / BINS
    timeline = {"bin_s": _r(width), "bins": BINS}
    wait_bins = _interval_bins([(t - w, t) for t, _, w in steps] + ([(last_call, finished[0])] if finished else []),
                               width, BINS)
    compute_bins = _interval_bins([(t, t + c) for (t, _, _), c in zip(steps, computes)], width, BINS)
    timeline["wait"] = [_r(v / width) for v in wait_bins]
    timeline["compute"] = [_r(v / width) for v in compute_bins]

    read_busy = sum(v for *_, v in reads)
    stages = {"read": {"workers": readers, "busy_s": _r(read_busy),
                       "idle_s": _r(max(readers * wall - read_busy, 0.0)), "batches": len(reads),
                       "samples": sum(b for _, b, _ in reads),
                       "utilization": _r(read_busy / (readers * wall)) if readers and wall > 0 else 0.0}}
    timeline["read_busy"] = [_r(v / width / max(readers, 1))
                             for v in _interval_bins([(t - v, t) for t, _, v in reads], width, BINS)]
    queues = {}

    def queue(name, changes):
        mean, peak, bins = _depth(changes, begin, end, width, BINS)
        queues[name] = {"mean": _r(mean), "max": int(peak)}
        timeline[f"queue_{name}"] = [_r(v) for v in bins]

    if needed:  # a staged run: minibatches asked of the node, then staged, then decoded
        queue("staging", [(t, 1) for t in needed] + [(t, -1) for t in ready])
        queue("reading", [(t, 1) for t in ready] + [(t, -1) for t, _, _ in reads])
    queue("delivered", [(t, 1) for t in delivered] + [(t, -1) for t, _, _ in steps])

    if prefetchers is not None:
        busy = sum(v for *_, v in tasks)
        files = sum(b for _, b, _ in tasks)
        active_from = queued[0][0] if queued else 0.0
        active = max((tasks[-1][0] - active_from) if tasks else 0.0, 0.0)
        in_flight = in_flight or 1
        # Busy time is summed over the files in flight: the stage's slots are processes x files in flight.
        slots = prefetchers * in_flight
        if resized or threads:  # pools that grew and shrank (``auto``): their mean sizes over the staging time
            window = (active_from, active_from + active)
            slots = round(_mean_size(slots, _product(prefetchers, resized, in_flight, threads), *window), 1)
            prefetchers = round(_mean_size(prefetchers, resized, *window), 1) if resized else prefetchers
            in_flight = round(_mean_size(in_flight, threads, *window), 1) if threads else in_flight
        stages["prefetch"] = {
            "workers": prefetchers, "in_flight": in_flight, "slots": slots, "busy_s": _r(busy),
            "idle_s": _r(max(slots * active - busy, 0.0)),
            "tasks": len(tasks), "files": files,
            "files_from_source": staged_files, "bytes": staged_bytes + peer_bytes, "bytes_from_source": staged_bytes,
            "files_from_peers": peer_files, "files_present": present, "active_s": _r(active),
            "seconds_per_file": _r(busy / files) if files else 0.0,
            "utilization": _r(busy / (slots * active)) if slots and active > 0 else 0.0,
            **_core_times(of(tm.TASK, a, value), of(tm.TASK_CPU, a, b, value))}
        timeline["prefetch_busy"] = [_r(v / width / max(slots, 1))
                                     for v in _interval_bins([(t - v, t) for t, _, v in tasks], width, BINS)]
        queue("prefetch_tasks", [(t, b) for t, b, _ in queued] + [(t, -1) for t, _, _ in tasks])

    return {
        "rank": rank, "node": node, "wall_s": _r(wall), "wait_s": _r(wait_s), "compute_s": _r(compute_s),
        "other_s": _r(max(wall - wait_s - compute_s, 0.0)), "before_s": _r(before),
        "after_s": _r(max(wall - wait_s - compute_s - before, 0.0)), "steps": len(steps), "samples": samples,
        "startup_s": _r(calls[0] if calls else 0.0), "first_batch_s": _r(steps[0][0] if steps else 0.0),
        "first_wait_s": _r(first_wait), "loop_begin_s": _r(begin), "loop_end_s": _r(end),
        "stall_fraction": _r(wait_s / wall) if wall > 0 else 0.0,
        "steady_stall_fraction": _r((wait_s - first_wait) / steady_wall) if steady_wall > 0 else 0.0,
        "stages": stages, "queues": queues, "cpu_by_epoch": by_epoch(of(tm.EPOCH_CPU, a, b, value)),
        "series": _steps_series([t for t, _, _ in steps], waits, computes),
        "timeline": timeline,
    }


def job_stages(records):
    """The job's measured stage rates from every rank's ``account`` record.

    Returns:
        ``{"prefetch": ..., "read": ..., "consume": ...}`` (``prefetch`` only
        when some rank led a node in a staged run); docs/analyze.md, "Where the time
        goes", describes each key.
    """
    out = {}
    leaders = [r["stages"]["prefetch"] for r in records if "prefetch" in r["stages"]]
    if leaders:
        busy = sum(p["busy_s"] for p in leaders)
        files = sum(p["files"] for p in leaders)
        workers = max(p["workers"] for p in leaders)
        slots = [p.get("slots", p["workers"]) for p in leaders]  # reports before files in flight were slots
        spf = busy / files if files else 0.0
        out["prefetch"] = {
            "nodes": len(leaders), "workers": workers, "in_flight": max(p.get("in_flight", 1) for p in leaders),
            "slots": max(slots), "busy_s": _r(busy),
            "idle_s": _r(sum(p["idle_s"] for p in leaders)), "tasks": sum(p["tasks"] for p in leaders),
            "files": files, "bytes": sum(p["bytes"] for p in leaders),
            "files_from_source": sum(p["files_from_source"] for p in leaders),
            "bytes_from_source": sum(p["bytes_from_source"] for p in leaders),
            "files_from_peers": sum(p["files_from_peers"] for p in leaders),
            "files_present": sum(p["files_present"] for p in leaders),
            "active_s": _r(max(p["active_s"] for p in leaders)),
            "seconds_per_file": _r(spf),
            "bytes_per_file": _r(sum(p["bytes"] for p in leaders) / files) if files else 0.0,
            "files_per_s": _r(sum(p["files"] / p["active_s"] for p in leaders if p["active_s"] > 0)),
            "capacity_files_per_s": _r(sum(slots) / spf) if spf else 0.0,
            "utilization": _r(busy / sum(n * p["active_s"] for n, p in zip(slots, leaders)))
            if any(p["active_s"] > 0 for p in leaders) else 0.0}
        if all("cpu_s" in p for p in leaders):
            queued = [p["queued_s"] for p in leaders]
            out["prefetch"].update({"timed_busy_s": _r(sum(p["timed_busy_s"] for p in leaders)),
                                    "cpu_s": _r(sum(p["cpu_s"] for p in leaders)),
                                    "queued_s": None if None in queued else _r(sum(queued))})
    reads = [r["stages"]["read"] for r in records]
    busy = sum(x["busy_s"] for x in reads)
    samples = sum(x["samples"] for x in reads)
    capacity = sum(x["workers"] * x["samples"] / x["busy_s"] for x in reads if x["busy_s"] > 0)
    out["read"] = {
        "ranks": len(reads), "workers": max(x["workers"] for x in reads), "busy_s": _r(busy),
        "idle_s": _r(sum(x["idle_s"] for x in reads)),
        "batches": sum(x["batches"] for x in reads), "samples": samples,
        "seconds_per_sample": _r(busy / samples) if samples else 0.0,
        "samples_per_s": _r(sum(x["samples"] / r["wall_s"] for x, r in zip(reads, records) if r["wall_s"] > 0)),
        "capacity_samples_per_s": _r(capacity),
        "utilization": _r(sum(x["utilization"] for x in reads) / len(reads))}
    compute = sum(r["compute_s"] for r in records)
    steps = sum(r["steps"] for r in records)
    out["consume"] = {
        "ranks": len(records), "steps": steps, "samples": sum(r["samples"] for r in records),
        "compute_s": _r(compute), "wait_s": _r(sum(r["wait_s"] for r in records)),
        "other_s": _r(sum(r["other_s"] for r in records)),
        "seconds_per_step": _r(compute / steps) if steps else 0.0,
        "demand_samples_per_s": _r(sum(r["samples"] / r["compute_s"] for r in records if r["compute_s"] > 0)),
        "samples_per_s": _r(sum(r["samples"] / r["wall_s"] for r in records if r["wall_s"] > 0))}
    return out


def job_nodes(records):
    """Per node: its ranks, its prefetch stage (from its leader) and its ranks' demand."""
    nodes = {}
    for r in records:
        node = nodes.setdefault(r["node"], {"ranks": [], "prefetch": None, "samples": 0,
                                            "demand_samples_per_s": 0.0, "wait_s": {}})
        node["ranks"].append(r["rank"])
        node["samples"] += r["samples"]
        node["wait_s"][str(r["rank"])] = r["wait_s"]
        if r["compute_s"] > 0:
            node["demand_samples_per_s"] = _r(node["demand_samples_per_s"] + r["samples"] / r["compute_s"])
        if "prefetch" in r["stages"]:
            node["prefetch"] = r["stages"]["prefetch"]
    return nodes
