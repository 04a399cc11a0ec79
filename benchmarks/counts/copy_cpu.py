"""CPU a staged file costs with files in flight in threads against the same files in prefetcher processes.

One source of ``.npy`` files of about 2 MB (unet3d_npz's sizes in
configs/dlio: 2 MB, stdev 1 MB, at least 1 MB) behind the emulated slow file
system; one shuffled epoch through ``Pipeline``, no training step, each
setting of prefetcher processes x files in flight once a round, the settings
alternating, ``--rounds`` rounds (medians and ranges). For each run: wall
seconds and the CPU milliseconds per staged file of the prefetchers and of
the emulator's daemon (the two processes that move the bytes), and of the
readers. ``auto`` is the defaults (``staging.prefetchers`` and
``dataset.requests_in_flight`` unset).

    .venv/bin/python benchmarks/counts/copy_cpu.py --rounds 5 --json docs/copy-cpu.json
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from stager.bench.cpu import CpuMeter
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.slowfs import SlowFS

SETTINGS = ("auto", "4x1", "1x16", "2x8")


def write_dataset(root, files, seed=0):
    """``files`` .npy files of int32, about 2 MB each (normal, stdev 1 MB, at least 1 MB)."""
    rng = np.random.default_rng(seed)
    for i in range(files):
        nbytes = int(max(1 << 20, rng.normal(2 << 20, 1 << 20)))
        np.save(os.path.join(root, f"v{i:05d}.npy"), rng.integers(0, 1 << 30, nbytes // 4, dtype=np.int32))


def one_epoch(mnt, setting, files):
    dataset = {"source": mnt, "loader": "npy"}
    staging = {}
    if setting != "auto":
        processes, in_flight = (int(x) for x in setting.split("x"))
        staging["prefetchers"], dataset["requests_in_flight"] = processes, in_flight
    with tempfile.TemporaryDirectory(prefix="stager-copy-cpu-") as local:
        cfg = config_from_dict({"dataset": dataset, "plan": {"batch_size": 4, "epochs": 1, "seed": 3},
                                "staging": {"local_dir": local, **staging}, "reader": {"workers": 2}})
        begin = time.perf_counter()
        with CpuMeter() as meter, Pipeline(cfg) as pipe:
            for _ in pipe:
                pass
            start = pipe.counts_timeline()[0]
        wall = time.perf_counter() - begin
    cpu = meter.seconds()
    return {"wall_s": wall, "start": f"{start['prefetchers']}x{start['in_flight']}",
            **{f"{kind}_ms_per_file": cpu[kind] * 1e3 / files for kind in ("prefetchers", "emulator", "readers")}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=336)
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="processes x files in flight, or auto")
    parser.add_argument("--json")
    args = parser.parse_args()
    settings = args.settings.split(",")
    runs = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="stager-copy-cpu-src-") as root:
        write_dataset(root, args.files)
        with SlowFS(root, open_ms=args.open_ms) as mnt:
            for r in range(args.rounds):
                for setting in settings:
                    run = one_epoch(str(mnt), setting, args.files)
                    runs[setting].append(run)
                    print(f"round {r + 1} {setting} (started {run['start']}): {run['wall_s']:.2f} s, ms a file: "
                          f"prefetchers {run['prefetchers_ms_per_file']:.2f}, emulator "
                          f"{run['emulator_ms_per_file']:.2f}, readers {run['readers_ms_per_file']:.2f}", flush=True)
    keys = ("wall_s", "prefetchers_ms_per_file", "emulator_ms_per_file", "readers_ms_per_file")
    print(f"\n{args.files} .npy files of about 2 MB, {args.open_ms:g} ms an open; medians (min-max) of "
          f"{args.rounds} rounds, {os.cpu_count()} cores")
    print("| setting | epoch s | prefetchers ms a file | emulator ms a file | readers ms a file |")
    print("|---|---:|---:|---:|---:|")
    for setting in settings:
        cells = []
        for key in keys:
            values = [run[key] for run in runs[setting]]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {setting} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"files": args.files, "open_ms": args.open_ms, "rounds": args.rounds, "runs": runs}, fh,
                      indent=2)


if __name__ == "__main__":
    main()
