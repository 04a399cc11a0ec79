"""``stager simulate``: a job's config at any number of nodes, on a profile's machine, against the baselines.

Each method is the same plan on the same machine read another way:

- ``stager``: the config's own staging (its capacity, policy and peers);
- ``no-peers``: the same without peers;
- ``unbounded``: the same with a cache that keeps everything;
- ``direct``: every rank's readers open the shared file system, as
  ``DataLoader`` workers do;
- ``stage-all``: every node copies the whole dataset first, then reads it
  locally (refused when the dataset does not fit the node).
"""

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Tuple

import numpy as np

from .demand import node_demand
from .des import Job
from .optimum import job_optimum
from .report import KIND
from ..cache import MAX_DEPTH, fitting_depth, lookahead_depth, parse_capacity, policy_name
from ..engine.perf import MAX_IN_FLIGHT, Rates, Tuner, choose_counts, start_split
from ..engine.perf.start import START_IN_FLIGHT
from ..engine.tuning.autocounts import AutoFetch, prefetcher_limit, tunes_in_flight
from ..errors import ConfigError
from ..plan import PlanSpec
from ..plan.shuffles import algorithm
from ..plan.shuffles.remembered import Remembered

METHODS = ("stager", "no-peers", "unbounded", "direct", "stage-all")


@dataclass(frozen=True)
class Layout:
    """The job's shape and what the simulation keeps exact.

    Attributes:
        nodes: Nodes in the job.
        ranks_per_node: Ranks on each node.
        tracked: Nodes whose cache is replayed file by file (the others read as they do); None: all.
        every_node: Simulate every node in time; by default only the tracked
            ones are, each standing for the nodes that read as it does
            (``des.Job``): the same where every node is tracked.
    """

    nodes: int
    ranks_per_node: int = 1
    tracked: int = None
    every_node: bool = False

    def __post_init__(self):
        if self.nodes < 1 or self.ranks_per_node < 1 or (self.tracked is not None and self.tracked < 1):
            raise ConfigError("stager simulate: --nodes, --ranks-per-node and --tracked must be at least 1")


@dataclass(frozen=True)
class AutoStart:
    """``auto``'s counts at start on a profile's node, and how its tuner is made.

    Attributes:
        prefetchers: Prefetcher processes at start.
        in_flight: Files in flight each prefetcher keeps at start.
        readers: Readers per rank.
        tuner: Makes one node's tuner (``Tuner``), fresh for each node.
        split: ``Job``'s ``threads``, ``(files in flight at most a process,
            processes at most)``; None where only processes are tuned.
    """

    prefetchers: int
    in_flight: int
    readers: int
    tuner: Callable[[], Tuner]
    split: Optional[Tuple[int, int]]


def _count(value, key):
    if not isinstance(value, int):
        raise ConfigError(f"stager simulate needs a number for {key}, not {value!r}: set one with --set {key}=N")
    return value


# The job-wide optimum is computed up to this many reads per epoch (about a
# second of Python for each million).
OPTIMUM_READS = 4_000_000

def capacity_bytes(staging, profile, dataset_bytes):
    """``staging.capacity`` in bytes on a profile's node, or None (unbounded)."""
    parsed = parse_capacity(staging.capacity)
    if parsed is None:
        return None
    kind, value = parsed
    local = profile.node.local_gb * 1e9
    if kind == "bytes":
        return value
    if kind == "share":
        return int(value * local)
    return None if dataset_bytes <= 0.8 * local else int(0.8 * local)  # auto, as storage.space resolves it


def simulate(cfg, profile, layout, sizes, to_files=None, containers=None, methods=("stager",), progress=None):
    """Simulates ``cfg``'s job on ``profile``'s machine, once per method.

    Args:
        cfg: A ``Config`` (plan, staging, reader, run).
        profile: A ``Profile``.
        layout: A ``Layout``.
        sizes: File sizes in bytes (the catalog's, or an assumed dataset's).
        to_files: Maps samples to the files holding them, or None.
        containers: Per sample, its container (for the ``shards`` shuffle), or None.
        methods: Names from ``METHODS``.
        progress: A ``progress.Progress`` that hears how far each method is, or None.

    Returns:
        A dict: the settings and, per method, per epoch and overall: time, stall,
        and files and bytes from the source, from peers and already local,
        with the file system's peak load.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"stager simulate: unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    sizes = np.asarray(sizes, dtype=np.int64)
    samples = len(sizes) if to_files is None else len(containers)
    size = layout.nodes * layout.ranks_per_node
    spec = PlanSpec.from_config(samples, cfg.plan, size, containers=containers)
    # Every tracked rank's reads are listed several times over: each epoch's order is drawn once.
    spec = replace(spec, shuffle_algorithm=Remembered(algorithm(spec.shuffle_algorithm, spec.shuffle)))
    if not spec.epochs:
        raise ConfigError("stager simulate needs plan.epochs above 0")
    staging, reader = cfg.staging, cfg.reader
    auto = None
    threads = tunes_in_flight(staging, cfg.dataset)
    if "auto" in (staging.prefetchers, reader.workers):
        auto = _auto_counts(profile, sizes, spec.batch_size, threads)
    prefetchers = (auto.prefetchers if staging.prefetchers == "auto"
                   else _count(staging.prefetchers, "staging.prefetchers"))
    readers = auto.readers if reader.workers == "auto" else _count(reader.workers, "reader.workers")
    tuner = auto.tuner if staging.prefetchers == "auto" else None
    # A shared file system's files in flight a prefetcher: as the engine's posix source has them.
    if threads:
        in_flight = auto.in_flight
    else:
        asked = cfg.dataset.requests_in_flight
        in_flight = 1 if asked in (None, "auto") else _count(asked, "dataset.requests_in_flight")
    read_ahead = reader.ahead or 2 * readers
    capacity = capacity_bytes(staging, profile, int(sizes.sum()))
    ahead = max(lookahead_depth(staging.lookahead), read_ahead)
    deepest = None
    if staging.lookahead == "auto":  # as the engine's start fits it to the node's capacity, and deepens it
        fit = (capacity, int(sizes.sum()), len(sizes), spec.batch_size, layout.ranks_per_node, 1 / layout.nodes)
        ahead = min(ahead, fitting_depth(*fit)[0])
        deepest = fitting_depth(*fit, MAX_DEPTH)[0]
    compute_ms = profile.costs.compute_ms if profile.costs.compute_ms is not None else cfg.run.compute_ms
    out = {"kind": KIND, "nodes": layout.nodes, "ranks_per_node": layout.ranks_per_node, "samples": samples, "files": len(sizes),
           "dataset_bytes": int(sizes.sum()), "epochs": spec.epochs, "batch_size": spec.batch_size,
           "capacity": capacity, "policy": policy_name(staging.cache_policy, capacity), "peers": staging.peers,
           "prefetchers": prefetchers, "in_flight": in_flight, "readers": readers, "lookahead": ahead,
           "compute_ms": compute_ms,
           "tracked": layout.tracked or layout.nodes, "profile": profile.to_dict(), "methods": {}}
    demands = {}

    def demand(cap, peers):
        key = (cap, peers)
        if key not in demands:
            demands[key] = node_demand(sizes, spec, layout.nodes, layout.ranks_per_node, layout.tracked, cap,
                                       staging.cache_policy if cap is not None else "auto", ahead, peers, to_files,
                                       staging.peer_swaps, progress=progress)
        return demands[key]

    peers = staging.peers == "partition"
    for method in methods:
        begin = time.process_time()
        if progress is not None:
            progress.start(method)
        if method == "stage-all" and capacity is not None and capacity < sizes.sum():
            out["methods"][method] = {"fits": False}
            continue
        if method in ("stager", "no-peers"):
            d = demand(capacity, peers and method == "stager")
        else:
            d = demand(None, method == "unbounded" and peers)
        mode = {"direct": "direct", "stage-all": "stage-all"}.get(method, "staged")
        job = Job(profile, d, prefetchers, readers, ahead, read_ahead, compute_ms / 1e3,
                  tuner if mode == "staged" else None, deepest if mode == "staged" else None, layout.every_node,
                  in_flight, auto.split if tuner is not None and threads else None)
        log = job.run(mode, (len(sizes), int(sizes.sum())), progress)
        out["methods"][method] = _summary(method, d, log, layout, samples, begin)
        if mode == "staged":
            out["methods"][method]["counts_timeline"] = _timeline(job, readers)
    if peers and capacity is not None and "stager" in methods and spec.samples <= OPTIMUM_READS:
        node_of_rank = np.repeat(np.arange(layout.nodes), layout.ranks_per_node)
        out["optimum"] = job_optimum(sizes, spec, node_of_rank, [capacity] * layout.nodes, ahead, to_files)
    return out


def _timeline(job, readers):
    """Node 0's counts over the run, in the engine's report's shape (the readers are not resized here)."""
    changes = sorted([(t, {"prefetchers": n, "in_flight": k}) for t, n, k in job.timelines[0][1:]] +
                     [(t, {"lookahead": n}) for t, n in job.depths[0][1:]], key=lambda change: change[0])
    _, prefetchers, in_flight = job.timelines[0][0]
    row = {"t": 0.0, "prefetchers": prefetchers, "in_flight": in_flight, "readers": readers,
           "lookahead": job.depths[0][0][1]}
    rows = [dict(row)]
    for t, counts in changes:
        row.update({"t": round(t, 4), **counts})
        rows.append(dict(row))
    return rows


def _auto_counts(profile, sizes, batch_size, threads):
    """``auto``'s start on a profile's node (an ``AutoStart``).

    The probe's figures come from the profile (the latency at start, the
    client's bandwidth, the costs per file), so the start is what the engine
    would choose there; the tuner then follows the simulated rates.

    Args:
        threads: Whether the files in flight are tuned too
            (``autocounts.tunes_in_flight``): the start is split threads
            first and the tuner sizes files in flight, as the engine's.
    """
    fs, c = profile.filesystem, profile.costs
    rates = Rates(open_s=fs.open_ms / 1e3, bandwidth=fs.client_mbps * 1e6, copy_s=c.copy_ms / 1e3,
                  read_s=c.read_ms / 1e3, batch_s=c.batch_ms / 1e3, file_bytes=float(np.mean(sizes)),
                  main_s=c.main_ms / 1e3, batch_size=batch_size, cores=profile.node.cores)
    slots, readers = choose_counts(rates)
    cores = max(1, int(round(profile.node.cores)))
    most_processes = prefetcher_limit(rates)
    if not threads:
        fetch = AutoFetch.of(rates, None, 1)

        def processes():
            return Tuner(slots, 1, max(fetch.limit, slots), limit=fetch.source_limit, cores=cores)

        return AutoStart(slots, 1, readers, processes, None)
    prefetchers, in_flight = start_split(slots, rates, MAX_IN_FLIGHT, most_processes)
    fetch = AutoFetch.of(rates, in_flight, MAX_IN_FLIGHT)
    high = max(fetch.limit, prefetchers)

    def files_in_flight():  # as ``autocounts.PoolResizer`` builds it with ``threads``
        size = prefetchers * in_flight
        return Tuner(size, min(size, START_IN_FLIGHT), high * MAX_IN_FLIGHT, limit=fetch.source_limit, cores=cores)

    return AutoStart(prefetchers, in_flight, readers, files_in_flight, (MAX_IN_FLIGHT, high))


def _summary(method, demand, log, layout, samples, begin):
    epochs = log.per_epoch()
    keys = ("source_files", "source_bytes", "peer_files", "peer_bytes", "local_files")
    tables = {k: demand.totals(k) for k in keys}
    read = {"files": tables["source_files"] + tables["peer_files"] + tables["local_files"],
            "bytes": tables["source_bytes"] + tables["peer_bytes"] + demand.totals("local_bytes")}
    zero = 0 * read["files"]
    if method == "direct":  # every sample every rank reads comes from the source
        tables = {"source_files": read["files"], "source_bytes": read["bytes"], "peer_files": zero,
                  "peer_bytes": zero, "local_files": zero}
    elif method == "stage-all":  # the copy before the first step, then every read is local
        copied_files, copied_bytes = zero.copy(), zero.copy()
        copied_files[0], copied_bytes[0] = log.source_reads()
        tables = {"source_files": copied_files, "source_bytes": copied_bytes, "peer_files": zero, "peer_bytes": zero,
                  "local_files": read["files"]}
    for row in epochs:
        for key, values in tables.items():
            row[key] = int(values[row["epoch"]])
    files, nbytes = log.source_reads()
    peak_opens, peak_bytes = log.peak_rates()
    seconds = sum(r["seconds"] for r in epochs)
    waited = log.mean_wait()
    return {"seconds": seconds, "stall": waited / seconds if seconds > 0 else 0.0, "epochs": epochs,
            "source_files": files, "source_bytes": nbytes,
            "source_files_per_node": files / layout.nodes, "peak_opens_per_s": peak_opens,
            "peak_mb_per_s": peak_bytes / 1e6, "samples_per_s": samples * len(epochs) / seconds if seconds else math.inf,
            "simulation_cpu_s": time.process_time() - begin}
