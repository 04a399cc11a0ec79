"""The bottleneck of a run and what to change, each rule tied to measured numbers.

The rules, in order (docs/analyze.md, "Where the time goes", lists them too):

1. **compute**: the loop waits less than ``STALL_OK`` of its time after the
   first minibatch. The training step sets the pace; more staging would not
   help. If the prefetchers were busy less than ``IDLE`` of the staging time,
   fewer would do.
2. Otherwise each stage's *capacity* (what its workers deliver when all are
   busy: workers / seconds per item, from busy time) is compared with the
   loop's *demand* (samples a second the consumer would take if it never
   waited: samples / compute seconds, summed over a node's ranks; for the
   prefetchers, times the share of samples that had to be fetched). The stage
   with the lowest capacity/demand below 1 is the bottleneck:
   **prefetch** (advice: ``staging.prefetchers`` = workers x demand /
   capacity) or **read** (``reader.workers``, the same way).
3. **cores**: the loop waits, no stage is short of workers but the
   prefetchers' fetches spent ``CORES_QUEUED`` of their time or more queued
   for a core (the kernel's run-queue delay): the stages keep up alone and
   wait on each other for the node's cores, which no staging count gives
   back. Advice: fewer processes on the node, or more cores.
4. **lookahead**: the loop waits but every stage could keep up: the work is
   asked for too late. Advice: double ``staging.lookahead``.
5. Notes, whatever the bottleneck: the first minibatch took more than
   ``STARTUP_NOTE`` of the run; the ranks of a node (or the nodes) waited
   unequally, by more than ``IMBALANCE`` of the wall time.
"""

import math
from dataclasses import dataclass, field

from ..cache.depth import AUTO_DEPTH

STALL_OK = 0.05       # below this steady stall fraction the run is compute-bound
IDLE = 0.25           # prefetchers busier than this are not too many
STARTUP_NOTE = 0.10   # a first minibatch slower than this share of the wall time is worth a note
IMBALANCE = 0.05      # ranks whose waits differ by more than this share of the wall time are unbalanced
MAX_STEP = 4          # never suggest more than this many times the current workers at once
CORES_QUEUED = 0.25   # prefetchers' fetch time queued for a core from which the cores, not the asking, are short


@dataclass
class Verdict:
    """The bottleneck and the advice.

    Attributes:
        bottleneck: ``compute``, ``prefetch``, ``read``, ``cores`` or ``lookahead``.
        reason: One sentence with the numbers that decided it.
        advice: Sentences, each naming a setting and the numbers behind it.
        ratios: Capacity over demand of each stage considered.
    """

    bottleneck: str
    reason: str
    advice: list = field(default_factory=list)
    ratios: dict = field(default_factory=dict)


def _config(report, section, key, default=None):
    return (report.get("config") or {}).get(section, {}).get(key, default)


def _suggest(workers, demand, capacity):
    """Workers that would meet ``demand`` at the measured per-worker rate, at most ``MAX_STEP`` x now."""
    workers = max(round(workers), 1)  # a resized pool's mean size
    need = max(workers + 1, math.ceil(workers * demand / capacity))
    return need, min(need, MAX_STEP * workers)


def fetch_split(prefetch):
    """Where the prefetchers' fetch time went, from a report's ``stages.prefetch``.

    Returns:
        ``[(what, share)]``: on a core, queued for a core (where the kernel
        said), and the rest, waiting on the source; ``[]`` where the fetches'
        CPU was not measured.
    """
    busy, cpu, queued = prefetch.get("timed_busy_s"), prefetch.get("cpu_s"), prefetch.get("queued_s")
    if not busy or cpu is None:
        return []
    parts = [("on a core", cpu / busy)] + ([("queued for a core", queued / busy)] if queued is not None else [])
    rest = "waiting on the source" if queued is not None else "waiting on the source or for a core"
    return parts + [(rest, max(0.0, 1.0 - sum(share for _, share in parts)))]


def _count(workers):
    """A pool's size: a whole number, or a resized pool's mean size."""
    return f"{workers}" if isinstance(workers, int) else f"{workers:g} (on average)"


def _in_flight(report):
    """Files each prefetcher kept in flight at the run's end (``counts_timeline``); 1 without a timeline."""
    rows = report.get("counts_timeline") or []
    return int(rows[-1].get("in_flight", 1)) if rows else 1


def _fetch_pressure(report):
    """Per node with a prefetch stage: (node, workers, capacity files/s, demand files/s)."""
    out = []
    for node, n in sorted(report["nodes_accounting"].items()):
        p = n["prefetch"]
        if not p or not p["files"] or not p["seconds_per_file"] or not n["samples"]:
            continue
        # Files in flight fetch at once: every slot (prefetchers x files in flight) delivers a file a seconds_per_file.
        capacity = p.get("slots", p["workers"]) / p["seconds_per_file"]
        demand = n["demand_samples_per_s"] * p["files"] / n["samples"]
        out.append((node, p["workers"], capacity, demand))
    return out


def _read_pressure(report):
    """Per rank: (rank, workers, capacity samples/s, demand samples/s)."""
    out = []
    for r in report["per_rank"]:
        read = r["stages"]["read"]
        if not read["busy_s"] or not r["compute_s"] or not r["samples"]:
            continue
        out.append((r["rank"], read["workers"], read["workers"] * read["samples"] / read["busy_s"],
                    r["samples"] / r["compute_s"]))
    return out


def judge(report):
    """The ``Verdict`` on a report written by ``stager run --report`` or a front end's ``report()``."""
    stall = report["steady_stall_fraction"]
    staged = "prefetch" in report["stages"]
    fetch, read = _fetch_pressure(report), _read_pressure(report)
    ratios = {}
    if fetch:
        node, workers, capacity, demand = min(fetch, key=lambda x: x[2] / x[3] if x[3] else math.inf)
        ratios["prefetch"] = capacity / demand if demand else math.inf
    if read:
        rank, rworkers, rcapacity, rdemand = min(read, key=lambda x: x[2] / x[3] if x[3] else math.inf)
        ratios["read"] = rcapacity / rdemand if rdemand else math.inf
    if stall < STALL_OK:
        verdict = Verdict("compute", f"the loop waited {stall:.1%} of its time after the first minibatch (under "
                                     f"{STALL_OK:.0%}): the training step sets the pace", ratios=ratios)
        stages = report["stages"]
        if staged and stages["prefetch"]["utilization"] < IDLE and stages["prefetch"]["workers"] > 2 and fetch:
            fewer = max(2, math.ceil(workers * 2 / ratios["prefetch"])) if ratios["prefetch"] else 2
            if fewer < workers:
                verdict.advice.append(
                    f"the prefetchers were busy {stages['prefetch']['utilization']:.0%} of the staging time: "
                    f"{fewer} instead of {_count(workers)} would still deliver twice what the loop consumes "
                    f"(staging.prefetchers: {fewer})")
        if not verdict.advice:
            verdict.advice.append("nothing to change in staging: a faster training step would be the gain")
    else:
        bound = [(ratios[s], s) for s in ("prefetch", "read") if s in ratios and ratios[s] < 1.0]
        if bound and min(bound)[1] == "prefetch":
            need, step = _suggest(workers, demand, capacity)
            in_flight = _in_flight(report)
            verdict = Verdict("prefetch", f"the loop waited {stall:.1%} after the first minibatch; on node {node} "
                                          f"the source delivers {capacity:,.0f} files/s with {_count(workers)} prefetchers "
                                          f"x {in_flight} file(s) in flight and the loop consumes {demand:,.0f} files/s",
                              ratios=ratios)
            if _config(report, "staging", "prefetchers") == "auto":
                # Requests in flight are what a slow source needs, and auto already grew them as far as the
                # source's measured limit and the cores let it: more of the same will not help.
                text = (f"staging.prefetchers: auto ended at {_count(workers)} prefetchers x {in_flight} file(s) in "
                        "flight, as far as the source's measured limit and the cores let it: each request should "
                        "carry more (fewer, larger files: stager pack), or fewer should go to the source "
                        "(staging.peers: partition on several nodes)")
            else:
                # A request waiting on the source costs a thread, not a process: auto grows those first.
                text = ("set staging.prefetchers: auto: it keeps more files in flight in each prefetcher (threads "
                        "waiting on the source, no new processes) before it adds processes, as far as the source "
                        f"keeps up; or try {step} prefetchers (staging.prefetchers: {step})")
                if step < need:
                    text += (f"; {need} would match the demand at today's rate per prefetcher, but a source's "
                             "bandwidth caps it: grow in steps and run the report again")
            verdict.advice.append(text)
        elif bound:
            need, step = _suggest(rworkers, rdemand, rcapacity)
            verdict = Verdict("read", f"the loop waited {stall:.1%} after the first minibatch; rank {rank}'s "
                                      f"{rworkers} readers decode {rcapacity:,.0f} samples/s and its loop consumes "
                                      f"{rdemand:,.0f} samples/s", ratios=ratios)
            verdict.advice.append(f"try {step} readers (reader.workers: {step})"
                                  + ("" if step == need else f"; {need} would match the demand if cores allow"))
        elif _queued_share(report) >= CORES_QUEUED:
            verdict = _cores(report, stall, ratios)
        else:
            lookahead = _config(report, "staging", "lookahead", 0)
            busy = ""
            if staged:
                prefetch = report["stages"]["prefetch"]
                busy = f"; prefetchers busy {prefetch['utilization']:.0%}"
                # Stages that keep up alone may still wait on each other for the cores: say how long they did.
                busy += "".join(f", {share:.0%} of their fetch time queued for a core"
                                for what, share in fetch_split(prefetch) if what == "queued for a core")
            verdict = Verdict("lookahead", f"the loop waited {stall:.1%} after the first minibatch although every "
                                           "stage could keep up ("
                                           + ", ".join(f"{s} {r:.1f}x the demand" for s, r in sorted(ratios.items()))
                                           + busy + "): the work is asked for too late", ratios=ratios)
            if staged and lookahead == "auto":
                # auto starts at AUTO_DEPTH and goes deeper only where the source's latency over the step
                # needs it: here the loop waited all the same, so a fixed depth beyond the deepest it reached.
                depths = [row.get("lookahead", 0) for row in report.get("counts_timeline") or ()]
                deepest = max(depths, default=0) or AUTO_DEPTH
                verdict.advice.append(f"ask further ahead: staging.lookahead: {2 * deepest} (now auto, which "
                                      f"reached {deepest})")
            elif staged and lookahead:
                verdict.advice.append(f"ask further ahead: staging.lookahead: {2 * lookahead} (now {lookahead})")
            elif not staged:
                verdict.advice.append("enable staging (staging.enabled: true) so files are fetched ahead of the "
                                      "loop")
    _notes(report, verdict)
    return verdict


def _queued_share(report):
    """The share of the prefetchers' fetch time spent queued for a core; 0 where not measured."""
    prefetch = report["stages"].get("prefetch")
    return dict(fetch_split(prefetch)).get("queued for a core", 0.0) if prefetch else 0.0


def _cores(report, stall, ratios):
    queued = _queued_share(report)
    readers = _config(report, "reader", "workers")
    keep_up = ", ".join(f"{s} {r:.1f}x the demand" for s, r in sorted(ratios.items()))
    verdict = Verdict("cores", f"the loop waited {stall:.1%} after the first minibatch although every stage could "
                               f"keep up alone ({keep_up}), and the prefetchers' fetches spent {queued:.0%} of "
                               "their time queued for a core: the stages wait on each other for the node's cores",
                      ratios=ratios)
    # Asking further ahead or adding workers queues more work for the same cores.
    verdict.advice.append("no staging count gives the cores back: run fewer processes on the node (reader.workers"
                          + (f", now {readers}" if readers is not None else "") + ", or the training's own "
                          "threads), decode less per sample, or use a node with more cores")
    return verdict


def _notes(report, verdict):
    wall = report["wall_s"] or 1e-9
    first = report["first_batch_s"]
    since_start = max(max(r["loop_end_s"] for r in report["per_rank"]), 1e-9)
    if first > STARTUP_NOTE * since_start:
        verdict.advice.append(f"the first minibatch came {first:.2f} s after the pipeline started "
                              f"({first / since_start:.0%} of the time from start to end): start-up weighs on a run "
                              "this short; the bottleneck above is judged on the steps after it")
    ranks = report["per_rank"]
    groups = {}
    for r in ranks:
        groups.setdefault(r["node"], []).append(r)
    for node, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        hi = max(members, key=lambda r: r["wait_s"])
        lo = min(members, key=lambda r: r["wait_s"])
        if hi["wait_s"] - lo["wait_s"] > IMBALANCE * wall:
            verdict.advice.append(f"on node {node}, rank {hi['rank']} waited {hi['wait_s']:.2f} s and rank "
                                  f"{lo['rank']} {lo['wait_s']:.2f} s: the slowest rank sets every step's pace; "
                                  "look for what else runs on its cores or its share of the files")
    if len(groups) > 1:
        waits = {node: max(r["wait_s"] for r in members) for node, members in groups.items()}
        hi, lo = max(waits, key=waits.get), min(waits, key=waits.get)
        if waits[hi] - waits[lo] > IMBALANCE * wall:
            verdict.advice.append(f"node {hi}'s ranks waited up to {waits[hi]:.2f} s, node {lo}'s "
                                  f"{waits[lo]:.2f} s: compare the nodes' prefetch rates in the table above")
