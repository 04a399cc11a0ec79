"""``staging.lookahead: auto`` deepening while running, against the fixed depth it starts at (16).

One source of small ``.npy`` files behind the emulated slow file system;
one shuffled epoch, a fixed training step, ``auto`` and ``16`` in
alternation, each setting ``--rounds`` times in one run (medians and
ranges). Cases: one file a minibatch and 24 prefetchers on a 400 ms open
with a 10 ms step (the latency case: 16 requests leave prefetchers idle),
as ``.npy`` files of 4 KB and as 256x256 JPEGs decoded to float32 CHW;
two files a minibatch and 4 prefetchers on a 300 ms open (every prefetcher
busy: the depth must stay); 32 files a minibatch, 8 prefetchers, 20 ms an
open, 20 ms a step (the ordinary case). Wall time, the consumer's stall,
the deepest look-ahead reached and CPU seconds per process kind. Last, the
first case in ``stager simulate`` (seconds and deepest, ``auto`` and 16).

    .venv/bin/python benchmarks/counts/deepening.py --json docs/deepening.json
"""

import argparse
import json
import statistics
import tempfile
import threading
import time

import numpy as np

from stager.bench.cpu import CpuMeter
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.job.synth import MANIFEST, make_dataset
from stager.simulate import Layout, profile_from_dict, simulate
from stager.slowfs import SlowFS

CASES = (  # name, files, batch, prefetchers, open ms, step s, format
    ("1 file a minibatch, 24 prefetchers, 400 ms open, 10 ms step", 480, 1, 24, 400.0, 0.010, "npy"),
    ("the same, JPEGs decoded to float32 CHW", 480, 1, 24, 400.0, 0.010, "jpeg"),
    ("2 files a minibatch, 4 prefetchers, 300 ms open, 5 ms step", 160, 2, 4, 300.0, 0.005, "npy"),
    ("32 files a minibatch, 8 prefetchers, 20 ms open, 20 ms step", 1024, 32, 8, 20.0, 0.020, "npy"),
)
LOADERS = {"npy": {"loader": "npy"}, "jpeg": {"loader": "image", "layout": "chw"}}


def one_epoch(mnt, batch, prefetchers, step_s, lookahead, fmt):
    with tempfile.TemporaryDirectory(prefix="stager-deep-") as local:
        cfg = config_from_dict({"dataset": {"source": mnt, "manifest": MANIFEST, **LOADERS[fmt],
                                            "requests_in_flight": 8},
                                "plan": {"batch_size": batch, "epochs": 1, "seed": 11},
                                "staging": {"local_dir": local, "prefetchers": prefetchers, "lookahead": lookahead},
                                "reader": {"workers": 2}})
        pause, stall = threading.Event(), 0.0
        begin = time.perf_counter()
        with CpuMeter() as meter, Pipeline(cfg) as pipe:
            for b in pipe:
                stall += b.times.stall
                pause.wait(step_s)  # the training step (nothing sets it)
            deepest = max(row["lookahead"] for row in pipe.counts_timeline())
        return {"wall_s": time.perf_counter() - begin, "stall_s": stall, "deepest": deepest, "cpu_s": meter.seconds()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = []
    for name, files, batch, prefetchers, open_ms, step_s, fmt in CASES:
        with tempfile.TemporaryDirectory(prefix="stager-deep-src-") as root:
            make_dataset(root, files, nbytes=4096 if fmt == "npy" else 115_000, classes=3, seed=5, progress=False,
                         fmt=fmt)
            runs = {"auto": [], 16: []}
            with SlowFS(root, open_ms=open_ms) as mnt:
                for _ in range(args.rounds):
                    for lookahead in runs:
                        runs[lookahead].append(one_epoch(mnt, batch, prefetchers, step_s, lookahead, fmt))
        row = {"case": name, "files": files, "format": fmt, "rounds": args.rounds}
        for lookahead, rs in runs.items():
            key = str(lookahead)
            row[key] = {"wall_s": [round(r["wall_s"], 2) for r in rs], "stall_s": [round(r["stall_s"], 2) for r in rs],
                        "deepest": [r["deepest"] for r in rs],
                        "cpu_s": {k: round(statistics.median(r["cpu_s"][k] for r in rs), 2) for k in rs[0]["cpu_s"]}}
        row["wall_ratio"] = round(statistics.median(row["16"]["wall_s"]) / statistics.median(row["auto"]["wall_s"]), 2)
        out.append(row)
        print(f"{name}: wall auto {statistics.median(row['auto']['wall_s']):.2f} s (deepest "
              f"{max(row['auto']['deepest'])}), 16 {statistics.median(row['16']['wall_s']):.2f} s: "
              f"{row['wall_ratio']}x; stall auto {statistics.median(row['auto']['stall_s']):.2f} s, "
              f"16 {statistics.median(row['16']['stall_s']):.2f} s; CPU auto {row['auto']['cpu_s']}, "
              f"16 {row['16']['cpu_s']}", flush=True)
    out.append({"case": "stager simulate, the first case", "simulated": simulated()})
    print(f"stager simulate, the first case: {out[-1]['simulated']}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


def simulated():
    """The first case in ``stager simulate`` (one file at a time a prefetcher): seconds and deepest, per depth."""
    _, files, batch, prefetchers, open_ms, step_s, _ = CASES[0]
    out = {}
    for lookahead in ("auto", 16):
        cfg = config_from_dict({"dataset": {"source": "/nonexistent", "manifest": MANIFEST},
                                "plan": {"batch_size": batch, "epochs": 1, "seed": 11},
                                "staging": {"prefetchers": prefetchers, "lookahead": lookahead},
                                "reader": {"workers": 2}, "run": {"compute_ms": step_s * 1000}})
        profile = profile_from_dict({"filesystem": {"open_ms": open_ms}, "node": {"cores": 16},
                                     "costs": {"read_ms": 0.5}})
        result = simulate(cfg, profile, Layout(1), np.full(files, 4096))["methods"]["stager"]
        out[str(lookahead)] = {"seconds": round(result["seconds"], 2),
                               "deepest": max(row["lookahead"] for row in result["counts_timeline"])}
    return out


if __name__ == "__main__":
    main()
