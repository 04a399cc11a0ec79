"""``auto`` counts against the best fixed counts of a sweep, on the slow file system emulator.

For two sources (a low and a high latency per open), runs stager with every
fixed combination of a small sweep of prefetchers and readers, and once with
``staging.prefetchers: auto`` and ``reader.workers: auto``, on the same
synthetic dataset and simulated training step. Throughput is over the whole
run, start-up included (``auto``'s probe and its pools' growth are part of
its cost). The sweep is what a user would otherwise have to run.

    .venv/bin/python benchmarks/auto_counts.py

Prints a Markdown table for docs/benchmarks.md (about 3 minutes on 2 cores).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from stager import telemetry as tm
from stager.config import config_from_dict
from stager.model.calibrate import available_cores, cores_note
from stager.job.synth import MANIFEST, make_dataset
from stager.pipeline import Pipeline
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048, help="samples in the dataset (default 2048)")
    parser.add_argument("--bytes", type=int, default=65536, help="bytes per sample (default 64 KiB)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--compute-ms", type=float, default=15.0, help="simulated step (default 15 ms)")
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
            with SlowFS(root, open_ms=open_ms, mbps=0) as mnt:
                fixed = []
                for p in PREFETCHERS:
                    for r in READERS:
                        rate, stall, _, _ = run(mnt, local, p, r, args.batch_size, args.compute_ms / 1000)
                        fixed.append({"prefetchers": p, "readers": r, "samples_per_s": rate, "stall": stall})
                rate, stall, p_end, r_end = run(mnt, local, "auto", "auto", args.batch_size, args.compute_ms / 1000)
            best = max(fixed, key=lambda f: f["samples_per_s"])
            worst = min(fixed, key=lambda f: f["samples_per_s"])
            results.append({"source": name, "open_ms": open_ms, "fixed": fixed, "best": best, "worst": worst,
                            "auto": {"samples_per_s": rate, "stall": stall, "prefetchers_at_end": p_end,
                                     "readers_at_end": r_end}})
        free_after = available_cores()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bound = 1000 / args.compute_ms * args.batch_size
    print(f"{args.samples} samples of {args.bytes // 1024} KiB, batch {args.batch_size}, {args.compute_ms:g} ms "
          f"compute a step (at most {bound:.0f} samples/s); sweep: prefetchers {PREFETCHERS} x readers {READERS}\n")
    print("| source | best fixed (prefetchers, readers) | best samples/s | worst fixed samples/s | auto samples/s | "
          "auto / best | auto's counts at the end | auto stall |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for res in results:
        a, b = res["auto"], res["best"]
        print(f"| {res['source']} | {b['prefetchers']}, {b['readers']} | {b['samples_per_s']:.0f} | "
              f"{res['worst']['samples_per_s']:.0f} | {a['samples_per_s']:.0f} | "
              f"{a['samples_per_s'] / b['samples_per_s']:.2f} | {a['prefetchers_at_end']} prefetchers, "
              f"{a['readers_at_end']} readers | {a['stall']:.0%} |")
    print("\nEvery fixed setting (samples/s):\n")
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
