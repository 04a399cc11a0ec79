"""The stall report as text: the run, the stages, the ranks, the verdict."""

import json

from .advice import fetch_split, judge
from .ledger import ledger_lines
from ..errors import StagerError

NEEDS = ("steady_stall_fraction", "first_batch_s", "stages", "nodes_accounting", "per_rank", "wall_s")


class ReportError(StagerError, ValueError):
    """A report file that cannot be read or lacks the accounting."""


def check(report, path):
    """Raises ``ReportError`` naming ``path`` and the missing key unless ``report`` has the accounting."""
    if not isinstance(report, dict):
        raise ReportError(f"{path}: not a stager report (a JSON object was expected)")
    for key in NEEDS:
        if key not in report:
            raise ReportError(f"{path}: no {key!r}: not written by 'stager run --report' or a front end's "
                              "report() of this version; run the job again to get one")


def _table(rows, header):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header)] + [fmt.format(*row) for row in rows]


def group_lines(report):
    """What a job of a shared group (``staging.share``) got from it and gave it, as text lines; [] for others."""
    g = report.get("group")
    if g is None:
        return []
    name = ((report.get("config") or {}).get("staging") or {}).get("share") or "?"
    return [f"group {name!r}: this job fetched {g['files_fetched']} files ({g['bytes_fetched'] / 1e6:.1f} MB) from "
            f"the source; {g['files_from_group']} files ({g['bytes_from_group'] / 1e6:.1f} MB) it read were staged "
            "by other jobs (source reads the group saved it)",
            f"group {name!r}: {g['batches_from_group']} minibatches ({g['samples_from_group']} samples) decoded by "
            f"other jobs; {g['samples_decoded']} samples decoded here, {g['batches_published']} minibatches of them "
            "published for the others"] + _decoding_spared(name, g)


def _decoding_spared(name, group):
    """What the group's decoding spared a job: the seconds the other jobs' readers spent on its minibatches."""
    spared = group.get("decoding_spared_s")  # reports written before it was counted have none
    if not spared:
        return []
    return [f"group {name!r}: decoding the {group['samples_from_group']} samples the others decoded for this job "
            f"took their readers {spared:.1f} s, which this job's readers did not spend"]


def decoded_lines(report):
    """What the decoded tier (``staging.decoded``) did for the job, as text lines; [] where it says nothing."""
    d = report.get("decoded")
    if not d or (d.get("note") is None and not d["samples_kept"]):
        return []
    if d["samples_kept"] or d["samples_from_decoded"]:
        return [f"decoded copies: {d['samples_from_decoded']} samples built from decoded copies, not decoded "
                f"(their readers saved about {d['decoding_saved_s']:.1f} s); {d['samples_kept']} copies kept; "
                f"room: {d['note']}"]
    note = d["note"]
    return [f"decoded copies: none kept: {note[len('none: '):] if note.startswith('none: ') else note}"]


def _reads(reads):
    """Where the files read came from: the source, peers, copies already local (of containers: their samples)."""
    def way(files, nbytes, label, unit="files"):
        return f"{files} {unit} ({nbytes / 1e6:.1f} MB) {label}"

    local = reads["local"]
    parts = [way(reads["source"]["files"], reads["source"]["bytes"], "from the source"),
             way(reads["peers"]["files"], reads["peers"]["bytes"], "from peers"),
             way(local["files"], local["bytes"], "already local") if local.get("samples", local["files"]) ==
             local["files"] else way(local["samples"], local["bytes"], f"already local (in {local['files']} "
                                     "containers asked for)", "samples")]
    after, swapped = reads["source_after_peer"], reads.get("swapped", {}).get("files", 0)
    return "; ".join(parts) + (f"; {after} of the source's because a peer stalled or left" if after else "") + \
        (f"; {way(swapped, reads['swapped']['bytes'], 'kept for the job when another node had to drop them')}"
         if swapped else "")


def reads_lines(reads, most_nodes=8):
    """The job's reads by origin (the report's ``reads``) and, with 2 to ``most_nodes`` nodes, each node's."""
    nodes = reads.get("nodes") or {}
    if not 1 < len(nodes) <= most_nodes:
        return ["reads: " + _reads(reads)]
    return ["reads: " + _reads(reads)] + [
        f"  node {node}: {_reads(own)}; {own['peers_out']['files']} files ({own['peers_out']['bytes'] / 1e6:.1f} MB) "
        "sent to peers" for node, own in sorted(nodes.items())]


def cache_line(cache, shown=6):
    """The node cache's epochs in one line; a long run's shows its first and last epochs and the totals."""
    def epoch(e):
        return f"epoch {e['epoch']}: {e['hits']} hits, {e['misses']} misses, {e['evictions']} evicted"

    if len(cache) <= shown:
        return "; ".join(epoch(e) for e in cache)
    total = {k: sum(e[k] for e in cache) for k in ("hits", "misses", "evictions")}
    return "; ".join([epoch(e) for e in cache[:shown // 2]] + [f"... {len(cache) - shown + 1} epochs ..."] +
                     [epoch(e) for e in cache[-(shown // 2 - 1):]] +
                     [f"all {len(cache)} epochs: {total['hits']} hits, {total['misses']} misses, "
                      f"{total['evictions']} evicted (the report has each)"])


def dropped_line(cache, lookahead):
    """What the node cache dropped for room that is read again, and what a fixed look-ahead had to do with it; or None.

    Args:
        cache: The node cache's epochs (``Stats.cache_table``).
        lookahead: ``staging.lookahead`` as configured (``auto`` or minibatches).
    """
    files, nbytes = sum(e.get("dropped", 0) for e in cache), sum(e.get("bytes_dropped", 0) for e in cache)
    if not files:
        return None
    why = (f"staging.lookahead is fixed at {lookahead}: where the start warned that it takes their room, "
           "staging.lookahead: auto keeps them" if lookahead != "auto" else
           "the capacity is below what the node keeps for the job beside its look-ahead")
    return (f"node cache: {files} files ({nbytes / 1e6:.1f} MB) dropped for room though the job reads them again "
            f"(each once more from the source); {why}")


def count_lines(report):
    """The counts at start and why, and the pools' sizes over the run (``counts_timeline``) where ``auto``
    changed them, each change with the rule that made it."""
    timeline = report.get("counts_timeline") or []
    if not timeline:
        return []
    first = timeline[0]
    lines = ["", f"counts at start: {first['prefetchers']} prefetcher(s) x {first['in_flight']} file(s) in flight, "
                 f"{first['readers']} reader(s): {first.get('why') or 'as configured'}"]
    if len(timeline) < 2:
        return lines
    lines.append(f"counts over the run (rank 0's node; {len(timeline) - 1} change(s)):")
    rows = [(f"{c['t']:.2f}", c["prefetchers"], c["in_flight"], c["prefetchers"] * c["in_flight"], c["readers"],
             c.get("lookahead", "-"), c.get("why") or "-") for c in timeline]
    return lines + ["  " + x for x in _table(rows, ("s", "prefetchers", "in flight each", "requests out",
                                                    "readers", "look-ahead", "why"))]


def render(report, plots=()):
    """The report's text.

    Args:
        report: A report dictionary (``check``ed).
        plots: ``(title, path)`` of the plots made, or a one-item list with
            the reason none were.
    """
    verdict = judge(report)
    st = report["stages"]
    ranks = report["per_rank"]
    lines = [f"run: {report.get('mode', '?')}, {len(report['nodes_accounting'])} node(s), {len(ranks)} rank(s): "
             f"{report['batches']} minibatches, {report['samples']} samples in {report['wall_s']:.2f} s "
             f"({report['samples_per_s']:,.1f} samples/s)",
             f"stall: {report['stall_fraction']:.1%} of the loop (slowest rank: {report['stall_s']:.2f} s waiting); "
             f"after the first minibatch {report['steady_stall_fraction']:.1%}",
             f"time to first minibatch: {report['first_batch_s']:.2f} s",
             f"bottleneck: {verdict.bottleneck}: {verdict.reason}", *group_lines(report), *decoded_lines(report)]
    dropped = dropped_line(report.get("cache") or [], ((report.get("config") or {}).get("staging") or {}).get(
        "lookahead", "auto"))
    lines += ([dropped] if dropped else []) + ["", "stages:"]
    rows = []
    if "prefetch" in st:
        p = st["prefetch"]
        k = p.get("in_flight", 1)  # files each prefetcher keeps in flight; busy is summed over them
        rows.append(("prefetch", f"{p['workers']}{'' if k == 1 else f' x {k}'}/node", f"{p['busy_s']:.2f}",
                     f"{p['utilization']:.0%}",
                     f"{p['files_per_s']:,.1f} files/s", f"{p['capacity_files_per_s']:,.1f} files/s",
                     f"{p['seconds_per_file'] * 1e3:.2f} ms/file"))
    r = st["read"]
    rows.append(("read", f"{r['workers']}/rank", f"{r['busy_s']:.2f}", f"{r['utilization']:.0%}",
                 f"{r['samples_per_s']:,.1f} samples/s", f"{r['capacity_samples_per_s']:,.1f} samples/s",
                 f"{r['seconds_per_sample'] * 1e3:.3f} ms/sample"))
    c = st["consume"]
    rows.append(("consume", f"{c['ranks']} rank(s)", f"{c['compute_s']:.2f}", "",
                 f"{c['samples_per_s']:,.1f} samples/s", f"{c['demand_samples_per_s']:,.1f} samples/s",
                 f"{c['seconds_per_step'] * 1e3:.2f} ms/step"))
    lines += ["  " + x for x in _table(rows, ("stage", "workers", "busy s", "busy", "rate", "capacity/demand",
                                              "per item"))]
    split = fetch_split(st.get("prefetch") or {})
    if split:
        lines.append("  prefetchers' fetch time: " + ", ".join(f"{share:.0%} {what}" for what, share in split))
    lines += ["", "ranks (seconds of each rank's loop):"]
    rows = [(r["rank"], r["node"], f"{r['wall_s']:.2f}", f"{r['compute_s']:.2f}", f"{r['wait_s']:.2f}",
             f"{r['other_s']:.2f}", f"{r['stall_fraction']:.1%}", f"{r['first_batch_s']:.2f}",
             " ".join(f"{k} {q['mean']:.1f}/{q['max']}" for k, q in r["queues"].items())) for r in ranks]
    lines += ["  " + x for x in _table(rows, ("rank", "node", "wall", "compute", "wait", "other", "stall",
                                              "first", "queues mean/max"))]
    waits = [r["wait_s"] for r in ranks]
    if len(ranks) > 1:
        lines.append(f"  imbalance: waits from {min(waits):.2f} s to {max(waits):.2f} s "
                     f"({(max(waits) - min(waits)) / max(report['wall_s'], 1e-9):.1%} of the wall time)")
    lines += count_lines(report)
    lines += ledger_lines(report.get("cpu_by_epoch") or [])  # reports written before the ledger have none
    lines += ["", "advice:"] + [f"  - {a}" for a in verdict.advice]
    if plots:
        lines += ["", "plots:"] + [f"  {p}" if isinstance(p, str) else f"  {p[0]}: {p[1]}" for p in plots]
    return "\n".join(lines)


def load_report(path):
    """Reads and checks a report file.

    Raises:
        ReportError: The file is missing, not JSON, or lacks the accounting.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (write one with 'stager run CONFIG --report {path}')") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    check(report, path)
    return report
