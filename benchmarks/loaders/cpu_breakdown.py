"""Where the CPU goes in one stager run: emulator, prefetchers, readers, rank.

Runs one throughput epoch of ``stager bench``'s workload (one setting) and
samples ``/proc`` for the CPU time (user and system) of every process it
starts, grouped by kind (``stager.bench.cpu``, which ``stager bench`` uses
for every method): the emulator's daemon, prefetchers, readers and this
process (the rank: coordinator, service and loop).
On a 2-core machine the sum, not any one stage, is what bounds the run;
this is how the costs fixed in issue 6 were found (docs/benchmarks.md).

    .venv/bin/python benchmarks/loaders/cpu_breakdown.py --prefetchers 16 --readers 2
    .venv/bin/python benchmarks/loaders/cpu_breakdown.py --engine python --local-dir /tmp
"""

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.bench import methods as m  # noqa: E402
from stager.bench.cpu import CpuMeter  # noqa: E402
from stager.bench.sweep import default_local_dir  # noqa: E402
from stager.catalog import Catalog  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefetchers", type=int, default=12)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--open-ms", type=float, default=10.0)
    ap.add_argument("--mbps", type=float, default=500.0)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--local-dir", help="node-local storage (default as stager bench)")
    ap.add_argument("--files-per-task", type=int, default=0)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-cpu-")
    try:
        data = os.path.join(work, "data")
        make_dataset(data, args.batches * 32, 110_000, classes=10, seed=0, progress=False)
        local = tempfile.mkdtemp(prefix="stager-cpu-local-", dir=args.local_dir or default_local_dir(work, 2 * args.batches * 32 * 110_000))
        try:
            with SlowFS(data, open_ms=args.open_ms, mbps=args.mbps, engine=args.engine) as mnt:
                catalog = Catalog.from_manifest(mnt, MANIFEST)
                w = m.Workload(catalog, mnt, local, 32, epochs=1, compute_s=0.0)
                with CpuMeter(0.02) as meter:
                    result = m.stager(w, args.prefetchers, args.readers, files_per_task=args.files_per_task)
        finally:
            shutil.rmtree(local, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kinds = meter.seconds()
    print(f"{args.prefetchers} prefetchers, {args.readers} readers, {args.engine} engine: "
          f"{result.wall_s:.2f} s wall, {result.samples} samples")
    print(f"{'process kind':24s} {'CPU s':>7s}")
    for kind, seconds in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"{kind:24s} {seconds:7.2f}")
    total = sum(kinds.values())
    print(f"{'all':24s} {total:7.2f}  ({total / result.wall_s:.2f} cores busy on average)")


if __name__ == "__main__":
    main()
