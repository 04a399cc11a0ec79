"""A run's report: every rank's totals and accounting, gathered on rank 0.

``stager run --report`` and the front ends' ``report()`` write the same JSON:
the job's totals (``Stats.summary`` keys, summed over ranks), one entry per
rank under ``ranks``, and the accounting (``accounting.py``) under
``per_rank``, ``stages`` and ``nodes``. ``counts_timeline`` (rank 0's at the
top, each rank's under ``ranks``) lists the pools' sizes at start and after
every change ``auto`` made.
"""

import json
import os
import time

from .accounting import job_nodes, job_stages

REPORT_VERSION = 1


def rank_summary(pipe, wall_s=None, *, loop_begin=None, loop_end=None, compute_s=None, **extra):
    """This rank's totals and accounting as a JSON-ready dictionary.

    Args:
        pipe: The rank's ``Pipeline``.
        wall_s: Seconds of the training loop (rates are over it); default:
            the accounting's (first ``next()`` to ``loop_end``).
        loop_begin, loop_end: ``time.monotonic()`` at the loop's ends
            (``accounting.account``).
        compute_s: Simulated compute of the loop, if known; default: measured.
        extra: More keys (mode, epochs, config...).
    """
    world = pipe.world
    summary = {"rank": world.rank, "node": world.node, "world_size": world.size, "nodes": world.nodes, **extra}
    accounting = pipe.accounting(loop_begin, loop_end)
    summary.update(pipe.stats.summary(accounting["wall_s"] if wall_s is None else wall_s))
    summary["accounting"] = accounting
    summary["counts_timeline"] = pipe.counts_timeline()
    summary["compute_s"] = round(summary["accounting"]["compute_s"] if compute_s is None else compute_s, 4)
    return summary


def combine_epochs(tables):
    """Rows of per-epoch tables summed epoch by epoch, the largest ``peak_bytes`` kept: the job's cache counters
    over its nodes, or its CPU ledger over its ranks."""
    epochs = {}
    for table in tables:
        for row in table:
            into = epochs.setdefault(row["epoch"], dict.fromkeys(row, 0))
            for key, value in row.items():
                into[key] = max(into[key], value) if key == "peak_bytes" else into[key] + value
            into["epoch"] = row["epoch"]
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in epochs[e].items()} for e in sorted(epochs)]


def read_totals(table):
    """Where a job's files came from, over the epochs of a cache table (``combine_epochs``'s or a node's).

    Returns:
        ``{"source": {"files", "bytes"}, "peers": {...}, "peers_out": {...},
        "swapped": {...}, "local": {"files", "samples", "bytes"},
        "source_after_peer": files}``: read from the shared file system (of
        which ``source_after_peer`` because the node holding them stalled or
        left), fetched from other nodes' copies, sent to other nodes, given
        by a node short of room and kept (``engine.peers.swaps``), found already here (``files``
        hit; ``samples`` and ``bytes``: what the readers read from them,
        of a container only its samples asked for).
    """
    def total(key):
        return sum(row.get(key, 0) for row in table)

    return {"source": {"files": total("files_from_source"), "bytes": total("bytes_from_source")},
            "peers": {"files": total("files_from_peers"), "bytes": total("bytes_from_peers")},
            "peers_out": {"files": total("files_to_peers"), "bytes": total("bytes_to_peers")},
            "swapped": {"files": total("files_swapped_in"), "bytes": total("bytes_swapped_in")},
            "local": {"files": total("hits"), "samples": total("samples_local"), "bytes": total("bytes_local")},
            "source_after_peer": total("files_after_peer")}


def combine_ranks(summaries):
    """Job totals from every rank's summary (gathered on rank 0)."""
    first = summaries[0]
    total = dict(first)
    for key in ("batches", "samples", "files_staged", "bytes_staged", "files_present", "prefetch_busy_s",
                "read_busy_s", "compute_s"):
        total[key] = round(sum(s[key] for s in summaries), 4) if isinstance(first[key], float) else \
            sum(s[key] for s in summaries)
    total["wall_s"] = max(s["wall_s"] for s in summaries)
    total["stall_s"] = max(s["stall_s"] for s in summaries)  # the slowest rank sets the pace
    total["stall_fraction"] = round(total["stall_s"] / total["wall_s"], 4) if total["wall_s"] else 0.0
    total["samples_per_s"] = round(total["samples"] / total["wall_s"], 2) if total["wall_s"] else 0.0
    total["ranks"] = [{k: s[k] for k in ("rank", "node", "batches", "samples", "files_staged", "wall_s",
                                         "stall_s", "counts_timeline")} for s in summaries]
    # Only node leaders have cache counters: one table per node, and the job's per epoch.
    total["node_cache"] = {s["node"]: s["cache"] for s in summaries if s["cache"]}
    total["cache"] = combine_epochs(total["node_cache"].values())
    total["reads"] = read_totals(total["cache"])
    total["reads"]["nodes"] = {node: read_totals(table) for node, table in total["node_cache"].items()}
    decoded = [s["decoded"] for s in summaries if "decoded" in s]
    if decoded:
        total["decoded"] = {key: (round(sum(d[key] for d in decoded), 4) if key != "note" else
                                  next((d["note"] for d in decoded if d["note"]), None)) for key in decoded[0]}
    groups = [s["group"] for s in summaries if "group" in s]
    if groups:
        total["group"] = {key: sum(g[key] for g in groups) for key in groups[0]}
    return total


def job_summary(world, summary):
    """Gathers every rank's ``rank_summary`` on rank 0 (collective) and combines them.

    Returns:
        On rank 0 (or without a communicator) the job's report; on other
        ranks, this rank's own summary.
    """
    if world.comm is not None:
        gathered = world.comm.gather(summary, root=0)
        if world.rank != 0:
            return summary
        records = [s.pop("accounting") for s in gathered]
        total = combine_ranks(gathered)
    else:
        records = [summary.pop("accounting")]
        total = summary
        total["reads"] = read_totals(total.get("cache") or [])
    total["report_version"] = REPORT_VERSION
    total["first_batch_s"] = max(r["first_batch_s"] for r in records)
    total["steady_stall_fraction"] = max(r["steady_stall_fraction"] for r in records)
    total["stages"] = job_stages(records)
    total["nodes_accounting"] = job_nodes(records)
    total["cpu_by_epoch"] = combine_epochs(r.get("cpu_by_epoch", ()) for r in records)
    total["per_rank"] = records
    return total


def pipeline_report(pipe, config, path=None):
    """A front end's ``report()``: the loop so far, gathered over the world (collective), written by rank 0.

    Args:
        pipe: The rank's running (or finished) ``Pipeline``.
        config: The front end's ``Config`` (recorded in the report).
        path: JSON file rank 0 writes, or None.

    Returns:
        On rank 0 the job's report, elsewhere this rank's summary.
    """
    summary = rank_summary(pipe, loop_end=time.monotonic(), mode="staged" if config.staging.enabled else "direct",
                           samples_in_catalog=len(pipe.catalog), config=config.to_dict())
    report = job_summary(pipe.world, summary)
    if path is not None and pipe.world.rank == 0:
        write_report(path, report)
    return report


def write_report(path, report):
    """Writes a report as indented JSON, making its directory if needed (as ``--record`` does)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
        fh.write("\n")
