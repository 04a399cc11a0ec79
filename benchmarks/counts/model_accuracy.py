"""The what-if model's predictions against measured runs at settings it was not calibrated on.

Makes a synthetic dataset, mounts it through the slow file system emulator,
calibrates the model once (a probe of a few files, then three runs at the
calibration setting: the median of their prefetcher, reader and rank-process
costs, since one run's cost per file moves by several per cent from run to
run with the machine, and every fetch-bound prediction scales with it), and then,
for six other settings (prefetchers, readers, latency, bandwidth, compute,
a bounded cache over two epochs), runs stager and compares the measured
throughput with the model's. Throughput is steady: samples after the first
minibatch over the time after it (start-up is not what the model predicts).

    .venv/bin/python benchmarks/counts/model_accuracy.py

Prints a Markdown table for docs/benchmarks.md (about 2 minutes on 2 cores).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

from stager import plan as planlib
from stager.catalog import Catalog
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.job.synth import MANIFEST, make_dataset
from stager.model import Settings, from_summary, predict, predict_run, probe
from stager.model.calibrate import available_cores, cores_note
from stager.model.misses import step_misses
from stager.model.whatif import capacity_bytes
from stager.slowfs import SlowFS
from stager.sources import PosixSource


@dataclass(frozen=True)
class Case:
    """One setting: what differs from the calibration run."""

    name: str
    prefetchers: int
    readers: int
    open_ms: float = 10.0
    mbps: float = 0.0
    compute_ms: float = 20.0
    capacity: str = None
    epochs: int = 1
    extra: dict = field(default_factory=dict)


LOOKAHEAD = 8
CALIBRATION = Case("calibration", prefetchers=2, readers=1)
CALIBRATION_RUNS = 3
CASES = [
    Case("1 prefetcher", prefetchers=1, readers=1),
    Case("6 prefetchers, 2 readers", prefetchers=6, readers=2),
    Case("20 ms opens", prefetchers=4, readers=2, open_ms=20.0),
    Case("20 MB/s shared", prefetchers=8, readers=2, open_ms=5.0, mbps=20.0),
    Case("compute-bound", prefetchers=16, readers=2, compute_ms=30.0),
    Case("cache 50%, 2 epochs", prefetchers=3, readers=1, capacity="50%", epochs=2),
]


def measure(slow, case, root, local, batch_size, samples):
    """Runs ``case`` on the mounted emulator; returns its totals with steady throughput."""
    slow.set(open_ms=case.open_ms, mbps=case.mbps)
    cfg = config_from_dict({
        "dataset": {"source": slow.mountpoint, "manifest": MANIFEST, "loader": "npy"},
        "plan": {"batch_size": batch_size, "epochs": case.epochs, "seed": 7},
        "staging": {"local_dir": local, "prefetchers": case.prefetchers, "lookahead": LOOKAHEAD,
                    "capacity": str(capacity_bytes(case.capacity, _sizes(root))) if case.capacity else None},
        "reader": {"workers": case.readers}})
    compute_s = case.compute_ms / 1000.0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with Pipeline(cfg) as pipe:
        first = None
        for batch in pipe:
            if first is None:
                first, after, stalled = time.perf_counter(), 0, 0.0
            else:
                after += len(batch.samples)
                stalled += batch.times.stall
            time.sleep(compute_s)
        end = time.perf_counter()
        summary = pipe.stats.summary()
    done = resource.getrusage(resource.RUSAGE_SELF)
    summary["main_cpu_s"] = (done.ru_utime + done.ru_stime) - (usage.ru_utime + usage.ru_stime)
    summary["compute_s"] = compute_s * summary["batches"]
    summary["config"] = {"plan": {"batch_size": batch_size}}
    summary["steady_samples_per_s"] = after / (end - first) if end > first else 0.0
    summary["steady_stall"] = stalled / (end - first) if end > first else 0.0
    return summary, cfg


def median_rates(runs):
    """One ``Rates`` from several calibrations: each measured cost the median of its values."""
    fields = runs[0].to_dict()
    return type(runs[0]).from_dict({k: statistics.median(r.to_dict()[k] for r in runs) for k in fields})


def _sizes(root):
    return Catalog.load(config_from_dict({"dataset": {"source": root, "manifest": MANIFEST}}).dataset).sizes


def predicted(rates, case, cfg):
    # The probe measured the emulator's latency as a client sees it (the FUSE round
    # trip on top of the sleep): another setting moves it by the difference.
    open_s = rates.open_s + (case.open_ms - CALIBRATION.open_ms) / 1000.0
    settings = Settings(prefetchers=case.prefetchers, readers=case.readers, open_s=open_s,
                        bandwidth=case.mbps * 1e6, compute_s=case.compute_ms / 1000.0)
    catalog_n = len(_sizes(cfg.dataset.source))
    spec = planlib.PlanSpec.from_config(catalog_n, cfg.plan, 1)
    capacity = capacity_bytes(case.capacity, _sizes(cfg.dataset.source)) if case.capacity else None
    misses = step_misses(_sizes(cfg.dataset.source), spec, capacity=capacity, ahead=LOOKAHEAD)
    rate, stall, _ = predict_run(rates, settings, misses, LOOKAHEAD)
    worst = max(e.sum() / (len(e) * cfg.plan.batch_size) for e in misses)
    return rate, stall, predict(rates, replace(settings, miss=worst)).bottleneck


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048, help="samples in the dataset (default 2048)")
    parser.add_argument("--bytes", type=int, default=65536, help="bytes per sample (default 64 KiB)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="stager-model-bench-")
    try:
        root = os.path.join(tmp, "data")
        make_dataset(root, args.samples, args.bytes, 10, 0, progress=False)
        local = os.path.join(tmp, "local")
        os.mkdir(local)
        slow = SlowFS(root, open_ms=CALIBRATION.open_ms, mbps=CALIBRATION.mbps)
        with slow:
            catalog = Catalog.load(config_from_dict({"dataset": {"source": slow.mountpoint,
                                                                 "manifest": MANIFEST}}).dataset)
            free_before = available_cores()
            base = probe(PosixSource(slow.mountpoint), catalog, "npy", batch_size=args.batch_size,
                         compute_s=CALIBRATION.compute_ms / 1000.0)
            # The runs' costs per file are wall times, waiting for a core included: the cores
            # are the machine's, not those free now, or a busy machine's waits would count twice.
            calibrations = [from_summary(measure(slow, CALIBRATION, root, local, args.batch_size, args.samples)[0],
                                         base) for _ in range(CALIBRATION_RUNS)]
            rates = median_rates(calibrations)
            rows = []
            for case in CASES:
                summary, cfg = measure(slow, case, root, local, args.batch_size, args.samples)
                rate, stall, bottleneck = predicted(rates, case, cfg)
                measured = summary["steady_samples_per_s"]
                rows.append({"case": case.name, "prefetchers": case.prefetchers, "readers": case.readers,
                             "open_ms": case.open_ms, "mbps": case.mbps, "compute_ms": case.compute_ms,
                             "capacity": case.capacity or "unbounded", "epochs": case.epochs,
                             "predicted": round(rate, 1), "measured": round(measured, 1),
                             "error": round((rate - measured) / measured, 4) if measured else None,
                             "predicted_stall": round(stall, 3), "measured_stall": round(summary["steady_stall"], 3),
                             "bottleneck": bottleneck})
            free_after = available_cores()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"calibration (median of {CALIBRATION_RUNS} runs at {CALIBRATION.prefetchers} prefetchers, "
          f"{CALIBRATION.readers} reader, "
          f"{CALIBRATION.open_ms:g} ms opens, {CALIBRATION.compute_ms:g} ms compute): open "
          f"{rates.open_s * 1000:.2f} ms, prefetcher {rates.copy_s * 1000:.2f} ms/file, reader "
          f"{rates.read_s * 1000:.3f} ms/file, rank process {rates.main_s * 1000:.3f} ms/sample, "
          f"{rates.cores:g} cores; "
          f"{args.samples} samples of {args.bytes // 1024} KiB, batch {args.batch_size}")
    print("prefetcher ms/file in each calibration run: "
          + ", ".join(f"{c.copy_s * 1000:.2f}" for c in calibrations) + "\n")
    print("| setting | prefetchers | readers | open ms | MB/s | compute ms | cache | predicted samples/s | "
          "measured samples/s | error | predicted stall | measured stall | bottleneck |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['case']} | {r['prefetchers']} | {r['readers']} | {r['open_ms']:g} | "
              f"{r['mbps'] or 'unlimited'} | {r['compute_ms']:g} | {r['capacity']}"
              f"{', %d epochs' % r['epochs'] if r['epochs'] > 1 else ''} | {r['predicted']:.0f} | "
              f"{r['measured']:.0f} | "
              f"{r['error']:+.1%} | {r['predicted_stall']:.0%} | {r['measured_stall']:.0%} | {r['bottleneck']} |")
    worst = max(abs(r["error"]) for r in rows)
    print(f"\nlargest error: {worst:.1%} (target: within 15% at each setting)")
    print(cores_note(free_before, free_after))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rates": rates.to_dict(), "calibrations": [c.to_dict() for c in calibrations], "rows": rows},
                      fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
