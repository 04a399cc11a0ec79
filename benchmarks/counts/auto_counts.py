"""``auto`` counts against the best fixed counts of a sweep, on the slow file system emulator.

For two sources (a low and a high latency per open), runs stager with every
fixed combination of a small sweep of prefetchers and readers, and once with
``staging.prefetchers: auto`` and ``reader.workers: auto``, on the same
synthetic dataset and simulated training step. Throughput is over the whole
run, start-up included (``auto``'s probe and its pools' growth are part of
its cost). The sweep is what a user would otherwise have to run.

Each setting runs ``--repeats`` times, in rounds (every setting once a round,
so a change in the machine's load falls on all of them alike), and its
median counts: the best of eight single runs would be the luckiest draw of
eight, against one draw of ``auto``.

    .venv/bin/python benchmarks/counts/auto_counts.py

Prints a Markdown table for docs/benchmarks.md (about 1.5 minutes a round on 2 cores).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from stager import telemetry as tm
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.job.synth import MANIFEST, make_dataset
from stager.model.calibrate import available_cores, cores_note
from stager.slowfs import SlowFS

SOURCES = (("10 ms opens", 10.0), ("30 ms opens", 30.0))
PREFETCHERS = (4, 8, 16, 32)
READERS = (1, 2)


def run(mnt, local, prefetchers, readers, batch_size, compute_s):
    """One run; returns ``(samples/s, stall fraction, final prefetchers, final readers)``."""
    cfg = config_from_dict({"dataset": {"source": mnt, "manifest": MANIFEST, "loader": "npy"},
                            "plan": {"batch_size": batch_size, "epochs": 1, "seed": 3},
                            "staging": {"local_dir": local, "prefetchers": prefetchers, "lookahead": 16},
                            "reader": {"workers": readers}})
    begin = time.perf_counter()
    stall = 0.0
    samples = 0
    with Pipeline(cfg) as pipe:
        for batch in pipe:
            stall += batch.times.stall
            samples += len(batch.samples)
            time.sleep(compute_s)
        wall = time.perf_counter() - begin
        sizes = {0: pipe.counts[0], 1: pipe.counts[1]}
        for _, _, stage, size, _ in pipe.stats.telemetry.events([tm.RESIZED]):
            sizes[stage] = size
    # The start (probe included) counts as waiting, as it does in training.
    return samples / wall, (wall - samples / batch_size * compute_s) / wall, sizes[0], sizes[1]


def medians(figures):
    """``(samples/s, stall fraction)``, each the median over ``run``'s results ``figures``."""
    return statistics.median(f[0] for f in figures), statistics.median(f[1] for f in figures)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048, help="samples in the dataset (default 2048)")
    parser.add_argument("--bytes", type=int, default=65536, help="bytes per sample (default 64 KiB)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--compute-ms", type=float, default=15.0, help="simulated step (default 15 ms)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting, in rounds (default 3)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="stager-auto-bench-")
    results = []
    free_before = available_cores()
    try:
        root = os.path.join(tmp, "data")
        make_dataset(root, args.samples, args.bytes, 10, 0, progress=False)
        local = os.path.join(tmp, "local")
        os.mkdir(local)
        for name, open_ms in SOURCES:
            settings = [(p, r) for p in PREFETCHERS for r in READERS] + [("auto", "auto")]
            runs = {setting: [] for setting in settings}
            with SlowFS(root, open_ms=open_ms, mbps=0) as mnt:
                for _ in range(args.repeats):
                    for p, r in settings:
                        runs[p, r].append(run(mnt, local, p, r, args.batch_size, args.compute_ms / 1000))
            fixed = [dict(zip(("prefetchers", "readers", "samples_per_s", "stall"), (p, r, *medians(runs[p, r]))))
                     for p, r in settings[:-1]]
            rate, stall = medians(runs["auto", "auto"])
            best = max(fixed, key=lambda f: f["samples_per_s"])
            worst = min(fixed, key=lambda f: f["samples_per_s"])
            results.append({"source": name, "open_ms": open_ms, "fixed": fixed, "best": best, "worst": worst,
                            "auto": {"samples_per_s": rate, "stall": stall,
                                     "runs": [{"samples_per_s": f[0], "prefetchers_at_end": f[2],
                                               "readers_at_end": f[3]} for f in runs["auto", "auto"]]}})
        free_after = available_cores()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bound = 1000 / args.compute_ms * args.batch_size
    print(f"{args.samples} samples of {args.bytes // 1024} KiB, batch {args.batch_size}, {args.compute_ms:g} ms "
          f"compute a step (at most {bound:.0f} samples/s); sweep: prefetchers {PREFETCHERS} x readers {READERS}\n")
    print(f"Medians of {args.repeats} runs a setting.\n")
    print("| source | best fixed (prefetchers, readers) | best samples/s | worst fixed samples/s | auto samples/s | "
          "auto / best | auto's runs: samples/s (prefetchers, readers at the end) | auto stall |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for res in results:
        a, b = res["auto"], res["best"]
        each = "; ".join(f"{r['samples_per_s']:.0f} ({r['prefetchers_at_end']}, {r['readers_at_end']})"
                         for r in a["runs"])
        print(f"| {res['source']} | {b['prefetchers']}, {b['readers']} | {b['samples_per_s']:.0f} | "
              f"{res['worst']['samples_per_s']:.0f} | {a['samples_per_s']:.0f} | "
              f"{a['samples_per_s'] / b['samples_per_s']:.2f} | {each} | {a['stall']:.0%} |")
    print("\nEvery fixed setting (samples/s, medians):\n")
    print("| source | " + " | ".join(f"{p}p {r}r" for p in PREFETCHERS for r in READERS) + " |")
    print("|---|" + "---:|" * (len(PREFETCHERS) * len(READERS)))
    for res in results:
        print(f"| {res['source']} | " + " | ".join(f"{f['samples_per_s']:.0f}" for f in res["fixed"]) + " |")
    print("\n" + cores_note(free_before, free_after))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
