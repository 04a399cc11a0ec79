"""``auto`` counts on a source that slows down or speeds up mid-epoch, against fixed counts.

One source directory holds two mounts of the emulated slow file system,
``fast/`` (1 ms an open) and ``slow/`` (40 ms), with 512 files of 16 KB each;
one unshuffled epoch reads one half and then the other (both orders), batch
32, 5 ms of compute a step. ``staging.prefetchers: auto`` (readers ``auto``
in every run: that row is the defaults) against fixed prefetchers of a
sweep, in rounds, medians reported. Then three phases in one job: a JPEG
dataset (decoded to float32 CHW by 2 readers) behind one mount whose
latency per open is 2 ms in the first epoch, 30 ms in the second and 2 ms
in the third (set when the training reaches each epoch's first minibatch;
the node cache holds 40% of the dataset, LRU, so most of every epoch is
read from the source): the defaults (no count set), the defaults with only
the look-ahead set to the fixed rows' 4, and ``auto`` prefetchers against
each fixed count and against the count ``auto`` chose at start held fixed,
per epoch and in total, with how many of each later epoch's minibatches
were staged before it began (its work done in the epoch before); each round
starts one setting later than the last, and the JSON keeps every round.
Then four ranks of one node under mpiexec, rank 0's files on the slow
mount: the wall time and the per-rank stall with ``node_schedule``
``deadline`` and ``arrival``.

    .venv/bin/python benchmarks/counts/counts_follow.py --json docs/counts-follow.json
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from stager import telemetry as tm
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS

SWEEP = (4, 8, 16, 32, 64)
HALF = 512
PHASES_MS = (2.0, 30.0, 2.0)
PHASE_SWEEP = (2, 4, 8, 16, 32)
PHASE_FILES = 1536
PHASE_BATCH = 32
PHASE_STEP_S = 0.05
PHASE_CAPACITY = "72M"


def one_epoch(src, local, prefetchers, step_s=0.005):
    cfg = config_from_dict({"dataset": {"source": src, "manifest": MANIFEST, "loader": "npy"},
                            "plan": {"batch_size": 32, "epochs": 1, "shuffle": False},
                            "staging": {"local_dir": local, "prefetchers": prefetchers},
                            "reader": {"workers": "auto"}})
    begin = time.perf_counter()
    with Pipeline(cfg) as pipe:
        for _ in pipe:
            time.sleep(step_s)  # the training step
        wall = time.perf_counter() - begin
        most = max(r["prefetchers"] for r in pipe.counts_timeline())
    return wall, most


def three_phases(mount, src, local, prefetchers):
    """One run of ``len(PHASES_MS)`` epochs; returns ``(seconds per epoch, counts at start, ahead)``.

    ``ahead``: for each epoch after the first, its minibatches staged before
    its first was taken (work of that epoch done in the one before).

    ``prefetchers`` None is the defaults: no count set at all (prefetchers,
    lookahead and readers left to stager), only the case's cache;
    ``"defaults-la4"`` is the defaults with only the look-ahead set to the
    fixed rows' 4, to tell the look-ahead's part in the defaults' row.
    """
    # A node cache of 40% of the dataset, LRU: most of every epoch is read from the source.
    staging = {"local_dir": local, "capacity": PHASE_CAPACITY, "cache_policy": "lru"}
    reader = {}
    if prefetchers == "defaults-la4":
        staging["lookahead"] = 4
    elif prefetchers is not None:
        staging.update(prefetchers=prefetchers, lookahead=4)
        reader["workers"] = 2
    cfg = config_from_dict({"dataset": {"source": src, "manifest": MANIFEST, "loader": "image", "layout": "chw"},
                            "plan": {"batch_size": PHASE_BATCH, "epochs": len(PHASES_MS), "seed": 1},
                            "staging": staging, "reader": reader})
    mount.set(open_ms=PHASES_MS[0])
    marks = []
    begin = time.perf_counter()
    with Pipeline(cfg) as pipe:
        for batch in pipe:
            if batch.step == 0 and batch.epoch > 0:
                mount.set(open_ms=PHASES_MS[batch.epoch])
                marks.append(time.perf_counter())
            time.sleep(PHASE_STEP_S)  # the training step
        end = time.perf_counter()
        start_count = pipe.counts[0]
        ahead = _staged_ahead(pipe.stats.telemetry.events([tm.READY, tm.CONSUMED]), PHASE_FILES // PHASE_BATCH)
    edges = [begin] + marks + [end]
    return [b - a for a, b in zip(edges, edges[1:])], start_count, ahead


def _staged_ahead(events, per_epoch):
    """For each epoch after the first, how many of its minibatches were staged before its first was taken."""
    began = {seq // per_epoch: t for t, kind, seq, _, _ in events if kind == "consumed" and seq % per_epoch == 0}
    return [sum(1 for t, kind, seq, _, _ in events
                if kind == "ready" and seq // per_epoch == epoch and t < began[epoch])
            for epoch in range(1, len(PHASES_MS))]


def phase_runs(root, repeats):
    """Every setting of the three-phase job, in rounds; per setting the median seconds of each epoch and in all."""
    data = os.path.join(root, "jpeg")
    make_dataset(data, PHASE_FILES, nbytes=115_000, seed=3, progress=False, fmt="jpeg")
    src = os.path.join(root, "jpeg-mnt")
    os.makedirs(src)
    local = os.path.join(root, "local-phases")
    # "auto" and "start" run as one unit: "start" holds the count auto chose just before.
    units = [["defaults"], ["defaults-la4"], ["auto", "start"]] + [[str(p)] for p in PHASE_SWEEP]
    runs = {key: [] for unit in units for key in unit}
    ahead = {key: [] for key in runs}
    starts = []
    mount = SlowFS(data, src, open_ms=PHASES_MS[0])
    with mount:
        for round_ in range(repeats):
            # Each round starts one unit later, so no setting always runs first after the
            # dataset is written or right after the same neighbour.
            shift = round_ % len(units)
            for key in [key for unit in units[shift:] + units[:shift] for key in unit]:
                epochs, start_count, staged = three_phases(mount, src, local, _setting(key, starts))
                shutil.rmtree(local, ignore_errors=True)
                if key == "auto":
                    starts.append(start_count)
                runs[key].append(epochs + [sum(epochs)])
                ahead[key].append(staged)
    out = {key: [statistics.median(col) for col in zip(*rows)] for key, rows in runs.items()}
    out["start_counts"] = starts
    out["rounds"] = runs
    out["ahead"] = ahead
    return out


def _setting(key, starts):
    """The prefetchers a row of the three-phase table runs with (None: the defaults)."""
    if key == "defaults":
        return None
    if key in ("auto", "defaults-la4"):
        return key
    # "start": the count auto chose at start in this round, held fixed.
    return starts[-1] if key == "start" else int(key)


def halves(root, first):
    src = os.path.join(root, f"src-{first}")
    for name in ("fast", "slow"):
        os.makedirs(os.path.join(src, name))
    order = (first, "slow" if first == "fast" else "fast")
    with open(os.path.join(src, MANIFEST), "w") as out:
        for name in order:
            out.writelines(f"{name}/{line}" for line in open(os.path.join(root, name, MANIFEST)))
    return src


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--parts", default="halves,phases,schedule", help="which parts to run (default: all)")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    root = tempfile.mkdtemp(prefix="stager-counts-")
    out = {"halves": {}, "phases": {}, "schedule": {}}
    try:
        for seed, name in ((1, "fast"), (2, "slow")):
            make_dataset(os.path.join(root, name), HALF, nbytes=16384, seed=seed, progress=False)
        for first in ("fast", "slow") if "halves" in parts else ():
            src = halves(root, first)
            with SlowFS(os.path.join(root, "fast"), os.path.join(src, "fast"), open_ms=1.0), \
                    SlowFS(os.path.join(root, "slow"), os.path.join(src, "slow"), open_ms=40.0):
                runs = {p: [] for p in ("auto",) + SWEEP}
                for _ in range(args.repeats):
                    for p in runs:
                        local = os.path.join(root, "local")
                        runs[p].append(one_epoch(src, local, p))
                        shutil.rmtree(local, ignore_errors=True)
            out["halves"][first] = {str(p): {"wall_s": statistics.median(w for w, _ in r),
                                             "most_prefetchers": max(m for _, m in r)} for p, r in runs.items()}
        if "phases" in parts:
            out["phases"] = phase_runs(root, args.repeats)
        if "schedule" in parts:
            out["schedule"] = schedule_runs(root, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_tables(out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


def schedule_runs(root, repeats):
    """Four ranks of one node, rank 0's share slow: ``deadline`` against ``arrival``."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    import test_node_schedule as sched  # the test's layout: rank 0's share behind the slow mount

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    backing = os.path.join(root, "sched")
    make_dataset(os.path.join(backing, "slow"), sched.PER_RANK, nbytes=4096, seed=1, progress=False)
    make_dataset(os.path.join(backing, "fast"), sched.PER_RANK * 3, nbytes=4096, seed=2, progress=False)
    from pathlib import Path

    results = {"deadline": [], "arrival": []}
    for _ in range(repeats):
        for schedule in results:
            work = Path(tempfile.mkdtemp(dir=root))
            src, job, _ = sched._write(work, Path(backing), schedule)
            with SlowFS(os.path.join(backing, "slow"), str(src / "slow"), open_ms=40.0), \
                    SlowFS(os.path.join(backing, "fast"), str(src / "fast"), open_ms=1.0):
                report = work / "r.json"
                subprocess.run([mpiexec, "-n", "4", "-env", "STAGER_NODE_ID", "a", sys.executable, "-m", "stager",
                                "run", job, "--quiet", "--report", str(report)], check=True, timeout=300,
                               env=dict(os.environ, TMPDIR=str(work)), capture_output=True)
            r = json.loads(report.read_text())
            stalls = [x["stall_s"] for x in r["ranks"]]
            results[schedule].append({"wall_s": r["wall_s"], "max_stall_s": max(stalls),
                                      "mean_stall_s": statistics.fmean(stalls)})
    return {k: {key: statistics.median(x[key] for x in v) for key in v[0]} for k, v in results.items()}


def print_tables(out):
    if out["halves"]:
        halves_table(out)
    if out["phases"]:
        phases_table(out["phases"])
    if out["schedule"]:
        schedule_table(out["schedule"])


def halves_table(out):
    print("| first half | auto (the defaults) | " + " | ".join(f"{p} fixed" for p in SWEEP) + " | auto / best fixed |")
    print("|---" * (len(SWEEP) + 3) + "|")
    for first, row in out["halves"].items():
        best = min(row[str(p)]["wall_s"] for p in SWEEP)
        cells = " | ".join(f"{row[str(p)]['wall_s']:.2f} s" for p in SWEEP)
        print(f"| {first} | {row['auto']['wall_s']:.2f} s (up to {row['auto']['most_prefetchers']}) | {cells} | "
              f"{row['auto']['wall_s'] / best:.2f}x |")
    print()


def phases_table(ph):
    print(f"| prefetchers | epoch 1 ({PHASES_MS[0]:g} ms) | epoch 2 ({PHASES_MS[1]:g} ms) | "
          f"epoch 3 ({PHASES_MS[2]:g} ms) | total | epochs 2 / 3: minibatches staged before each began |")
    print("|---|---|---|---|---|---|")
    for key in [k for k in ("defaults", "defaults-la4") if k in ph] + ["auto", "start"] + [str(p) for p in PHASE_SWEEP]:
        name = {"defaults": "defaults (nothing set)", "defaults-la4": "defaults, look-ahead 4", "auto": "auto",
                "start": f"auto's start ({ph['start_counts']}) held fixed"}.get(key, key)
        staged = " / ".join(f"{statistics.median(col):g}" for col in zip(*ph["ahead"][key]))
        print(f"| {name} | " + " | ".join(f"{v:.2f} s" for v in ph[key]) + f" | {staged} |")
    fixed = [ph[str(p)] for p in PHASE_SWEEP]
    best = [min(col) for col in zip(*fixed)]
    for key in [k for k in ("defaults", "defaults-la4", "auto") if k in ph]:
        print(f"| {key} / best fixed | " + " | ".join(f"{a / b:.2f}x" for a, b in zip(ph[key], best)) + " | |")
    print(f"\nauto against its start held fixed, in total: {ph['start'][-1] / ph['auto'][-1]:.2f}x faster")
    print()


def schedule_table(schedule):
    print("| node_schedule | wall | max-rank stall | mean stall | max / mean |")
    print("|---|---|---|---|---|")
    for k, v in schedule.items():
        print(f"| {k} | {v['wall_s']:.2f} s | {v['max_stall_s']:.2f} s | {v['mean_stall_s']:.2f} s | "
              f"{v['max_stall_s'] / max(v['mean_stall_s'], 1e-9):.2f} |")


if __name__ == "__main__":
    main()
