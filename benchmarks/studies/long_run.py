"""A node service over many epochs: every process's memory and open files, the staging directory.

``stager run`` under ``mpiexec``, 4 ranks as 2 emulated nodes, ``--samples``
files of 3 KB, batch 8, ``staging.peers: partition`` and a bounded cache
(``--capacity`` bytes a node: less than its ranks read, so it evicts every
epoch), on the slow file system emulator at 1 ms an open. Every process below
mpiexec is sampled from outside (``tests/helpers/procwatch.py``) twice a
second: resident memory, open descriptors, and the bytes under the staging
directory.

    .venv/bin/python benchmarks/studies/long_run.py --json docs/long-run.json --plot docs/long-run.png

Prints a Markdown table for docs/benchmarks.md.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "helpers"))

from procwatch import ProcWatch  # noqa: E402
from stager.config import load_config  # noqa: E402
from stager.job import write_synthetic  # noqa: E402

RANKS, BATCH = 4, 8


def kind(name, pid, leaders, parents):
    if name.startswith("stager-prefetch"):
        return "prefetcher"
    if name.startswith("stager-read"):
        return "reader"
    if name.startswith("python") and parents.get(pid) == "hydra_pmi_proxy":
        return "rank (node leader)" if pid in leaders else "rank"
    if name.startswith("python"):
        return "janitor"  # the process that clears a node's job directory after its rank
    return name  # the emulator's daemon, mpiexec, hydra's proxies


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=400)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--capacity", type=int, default=240_000)
    ap.add_argument("--json", help="write the samples here")
    ap.add_argument("--plot", help="write the figure here (PNG)")
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-long-run-")
    try:
        job = os.path.join(work, "job.yaml")
        with open(job, "w") as fh:
            fh.write(f"""
dataset: {{source: data, manifest: manifest.tsv, loader: npy}}
synthetic: {{samples: {opts.samples}, bytes: 3000}}
slowfs: {{enabled: true, open_ms: 1}}
plan: {{batch_size: {BATCH}, epochs: {opts.epochs}, seed: 5}}
staging: {{local_dir: local, peers: partition, prefetchers: 2, capacity: {opts.capacity}}}
reader: {{workers: 1}}
""")
        write_synthetic(load_config(job), progress=False)
        rec = os.path.join(work, "rec")
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        args = [sys.executable, "-m", "stager", "run", job, "--quiet", "--record", rec]
        cmd = [mpiexec, "-n", "2", "-env", "STAGER_NODE_ID", "a", *args, ":", "-n", "2", "-env", "STAGER_NODE_ID",
               "b", *args]
        begin = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=work, env=dict(os.environ, TMPDIR=work), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        steps = opts.samples // BATCH // RANKS
        with ProcWatch(proc.pid, os.path.join(rec, "rank-0.jsonl"), steps, os.path.join(work, "local")) as watch:
            _, err = proc.communicate()
        wall = time.perf_counter() - begin
        if proc.returncode:
            raise SystemExit(err[-3000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # The node leaders: the ranks with prefetchers below them, told apart by their larger memory at start.
    ranks = {pid for s in watch.samples for pid, p in s["procs"].items()
             if p[0].startswith("python") and watch.parents.get(pid) == "hydra_pmi_proxy"}
    first = next(s for s in watch.samples if s["epoch"] >= 5)
    leaders = set(sorted((pid for pid in ranks if pid in first["procs"]), key=lambda pid: -first["procs"][pid][1])[:2])
    marks = [e for e in (10, opts.epochs // 4, opts.epochs // 2, 3 * opts.epochs // 4, opts.epochs - 5)]
    rows = {}
    for pid in sorted({pid for s in watch.samples for pid in s["procs"]}):
        name = next(s["procs"][pid][0] for s in watch.samples if pid in s["procs"])
        label = kind(name, pid, leaders, watch.parents)
        if label not in ("rank (node leader)", "rank", "prefetcher", "reader", "janitor"):
            continue
        at = [watch.per_process(m, m + 5).get(pid) for m in marks]
        if all(at):
            rows.setdefault(label, []).append([a[1] for a in at] + [max(a[2] for a in at)])
    print(f"{opts.epochs} epochs in {wall:.0f} s; RSS (MiB) at epochs {marks} (median over 5 epochs); most fds")
    print("| process | " + " | ".join(f"epoch {m}" for m in marks) + " | growth, 2nd half | open fds |")
    print("|---|" + "---|" * (len(marks) + 2))
    for label, procs in sorted(rows.items()):
        for r in procs:
            print(f"| {label} | " + " | ".join(f"{v / 1024:.1f}" for v in r[:-1]) +
                  f" | {(r[-2] - r[2]) / 1024:+.2f} | {r[-1]} |")
    most = max(s["local_bytes"] for s in watch.samples)
    print(f"staging directory: at most {most / 1e3:.0f} KB (capacity {2 * opts.capacity / 1e3:.0f} KB for the 2 nodes)")
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump({"epochs": opts.epochs, "samples": opts.samples, "capacity": opts.capacity, "wall_s": wall,
                       "leaders": sorted(leaders), "series": [
                           {"epoch": s["epoch"], "local_bytes": s["local_bytes"],
                            "procs": {str(pid): [kind(p[0], pid, leaders, watch.parents), p[1], p[2]]
                                     for pid, p in s["procs"].items()}}
                           for s in watch.samples]}, fh)
    if opts.plot:
        plot(watch.samples, leaders, watch.parents, opts.plot)


def plot(samples, leaders, parents, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, fds) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = {"rank (node leader)": "C3", "rank": "C0", "prefetcher": "C2", "reader": "C1"}
    drawn = set()
    for pid in sorted({pid for s in samples for pid in s["procs"]}):
        points = [(s["epoch"], s["procs"][pid]) for s in samples if pid in s["procs"] and s["epoch"] >= 0]
        label = kind(points[0][1][0], pid, leaders, parents) if points else ""
        if label not in colors:
            continue
        epochs = [e for e, _ in points]
        mem.plot(epochs, [p[1] / 1024 for _, p in points], color=colors[label],
                 label=None if label in drawn else label, linewidth=1)
        fds.plot(epochs, [p[2] for _, p in points], color=colors[label], linewidth=1)
        drawn.add(label)
    mem.set_xlabel("epoch")
    mem.set_ylabel("resident memory (MiB)")
    mem.legend(fontsize=8)
    fds.set_xlabel("epoch")
    fds.set_ylabel("open descriptors")
    fig.suptitle("4 ranks as 2 nodes, peers, a bounded cache: every process over the epochs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
