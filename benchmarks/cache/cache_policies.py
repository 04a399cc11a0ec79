"""The node cache's policies against its capacity, on two emulated nodes, with Belady's optimum.

For capacities of 10% to 100% of a node's share and every policy, runs
``stager run`` for several epochs under ``mpiexec`` as two emulated nodes of
one rank each (``STAGER_NODE_ID``) on the slow file system emulator, and
records the bytes each epoch read from the source and the total time. The
optimum is Belady's rule simulated offline on each node's access trace (the
plan: every epoch's order is known). Then, on one node, stager at 100%
capacity against PyTorch's DataLoader reading the source directly with as
many worker processes as stager runs (prefetchers + readers), both for all
epochs, beside the ratio of their bounds.

    .venv/bin/python benchmarks/cache/cache_policies.py --json docs/cache.json --plot docs/bench-cache.png

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import heapq
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


from stager import plan as planlib
from stager.bench import methods
from stager.catalog import Catalog
from stager.config import PlanConfig
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS

POLICIES = ("clairvoyant", "lru", "fifo", "minio")
SHARES = (0.10, 0.25, 0.50, 0.75, 1.00)


def belady_misses(trace, capacity):
    """Misses of Belady's rule on ``trace`` (minibatches of file indices) with room for ``capacity`` files.

    The files of the current minibatch are resident together; when room is
    needed, the resident file whose next use is farthest ahead goes.
    """
    uses = {}
    for k, batch in enumerate(trace):
        for f in batch:
            uses.setdefault(f, []).append(k)
    pointer = {f: 0 for f in uses}
    resident, heap, misses = set(), [], []
    for k, batch in enumerate(trace):
        for f in batch:
            pointer[f] += 1
        missing = [f for f in set(batch) if f not in resident]
        misses.append(len(missing))
        for f in set(batch):
            nxt = uses[f][pointer[f]] if pointer[f] < len(uses[f]) else float("inf")
            heapq.heappush(heap, (-nxt, -f, f))
            resident.add(f)
        pinned = set(batch)
        keep = []
        while len(resident) > capacity:
            entry = heapq.heappop(heap)
            f = entry[2]
            current = uses[f][pointer[f]] if pointer[f] < len(uses[f]) else float("inf")
            if f not in resident or -entry[0] != current:
                continue  # a stale entry: the file was used or evicted since
            if f in pinned:
                keep.append(entry)  # needed by the current minibatch: it stays
                continue
            resident.discard(f)
        for entry in keep:
            heapq.heappush(heap, entry)
    return misses


def run_nodes(cfg_path, local, sets, tmp):
    """``stager run`` as two emulated nodes of one rank; returns the report."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    report = os.path.join(tmp, "r.json")
    args = ["run", cfg_path, "--quiet", "--report", report] + [a for s in sets for a in ("--set", s)]
    cmd = [mpiexec]
    for i, node in enumerate(("a", "b")):
        cmd += ([":"] if i else []) + ["-n", "1", "-env", "STAGER_NODE_ID", node, sys.executable, "-m", "stager"]
        cmd += args
    begin = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TMPDIR=tmp))
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    with open(report) as fh:
        out = json.load(fh)
    out["outside_wall_s"] = time.perf_counter() - begin
    shutil.rmtree(local, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1600)
    ap.add_argument("--bytes", type=int, default=20_000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--open-ms", type=float, default=10.0)
    ap.add_argument("--prefetchers", type=int, default=8)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--single-node-only", action="store_true",
                    help="only stager against the DataLoader on one node (no policy sweep)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-cache-bench-")
    try:
        data = os.path.join(work, "data")
        make_dataset(data, opts.samples, opts.bytes, progress=False)
        catalog = Catalog.from_manifest(data, MANIFEST)
        size = int(catalog.sizes.max())
        share_files = opts.samples // 2
        os.mkdir(os.path.join(work, "mnt"))
        with SlowFS(data, os.path.join(work, "mnt"), open_ms=opts.open_ms) as mnt:
            cfg_path = os.path.join(work, "job.yaml")
            local = os.path.join(work, "local")
            with open(cfg_path, "w") as fh:
                json.dump({"dataset": {"source": mnt, "manifest": MANIFEST},
                           "plan": {"batch_size": opts.batch_size, "epochs": opts.epochs, "seed": 1},
                           "staging": {"local_dir": local, "prefetchers": opts.prefetchers, "lookahead": 2},
                           "reader": {"workers": opts.readers, "ahead": 2}}, fh)
            plan_cfg = PlanConfig(batch_size=opts.batch_size, epochs=opts.epochs, seed=1)
            rows = []
            for share in () if opts.single_node_only else SHARES:
                capacity = int(share * share_files) * size
                optimum = 0
                for rank in (0, 1):
                    trace = [m.indices.tolist() for m in planlib.iterate(opts.samples, plan_cfg, rank=rank, size=2)]
                    optimum += sum(belady_misses(trace, capacity // size))
                for policy in POLICIES:
                    r = run_nodes(cfg_path, local, [f"staging.capacity={capacity}",
                                                    f"staging.cache_policy={policy}"], work)
                    per_epoch = [e["bytes_from_source"] for e in r["cache"]]
                    rows.append({"share": share, "policy": policy, "capacity": capacity,
                                 "bytes_from_source": per_epoch, "files_from_source": sum(
                                     e["files_from_source"] for e in r["cache"]),
                                 "belady_files": optimum, "wall_s": r["wall_s"]})
                    print(f"{share:4.0%} {policy:12s} files from source {rows[-1]['files_from_source']:6d} "
                          f"(Belady {optimum}) wall {r['wall_s']:.2f} s", file=sys.stderr)
            # One node: stager at 100% against DataLoader with as many processes.
            processes = opts.prefetchers + opts.readers
            w = methods.Workload(catalog.rooted(mnt), mnt, local, opts.batch_size, opts.epochs, 0.0, seed=1)
            baseline = methods.direct_torch(w, processes)
            ours = methods.stager(w, opts.prefetchers, opts.readers, capacity=opts.samples * size)
            shutil.rmtree(local, ignore_errors=True)
            # The floor of a local epoch: the same readers over a copy already local.
            copy = os.path.join(work, "copy")
            methods.copy_all(mnt, copy, catalog, opts.prefetchers)
            one = methods.Workload(catalog.rooted(copy), copy, local, opts.batch_size, 1, 0.0, seed=1)
            local_epoch_s = methods.ideal(one, opts.readers, copy).wall_s
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # The bounds: every epoch's opens from the source at the DataLoader's
    # concurrency, against one epoch's at the prefetchers' and the rest at
    # the speed of reading a local copy (measured above).
    o = opts.open_ms / 1000
    bound_direct = opts.epochs * opts.samples * o / processes
    bound_stager = opts.samples * o / opts.prefetchers + (opts.epochs - 1) * local_epoch_s
    result = {"options": vars(opts), "file_bytes": size, "rows": rows, "single_node": {
        "direct_torch_wall_s": baseline.wall_s, "stager_wall_s": ours.wall_s,
        "local_epoch_s": local_epoch_s, "speedup": baseline.wall_s / ours.wall_s,
        "bound_ratio": bound_direct / bound_stager}}
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(result, fh, indent=1)
    if opts.plot and rows:
        plot(result, opts.plot)
    print(markdown(result, " ".join(sys.argv[1:])))


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = result["rows"]
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        ax.plot([100 * r["share"] for r in mine], [sum(r["bytes_from_source"]) / 1e6 for r in mine], marker="o",
                label=policy)
    best = [r for r in rows if r["policy"] == POLICIES[0]]
    size = result["file_bytes"]  # every synthetic file has the same size
    ax.plot([100 * r["share"] for r in best], [r["belady_files"] * size / 1e6 for r in best], "k--",
            label="Belady optimum")
    ax.set_xlabel("capacity, % of a node's share")
    ax.set_ylabel(f"MB read from the source over {result['options']['epochs']} epochs")
    ax.set_title("bytes from the shared file system against cache capacity (2 nodes)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result, args):
    opts, rows, one = result["options"], result["rows"], result["single_node"]
    lines = [f"Command: `.venv/bin/python benchmarks/cache/cache_policies.py {args}`", "",
             f"{opts['samples']} samples of {opts['bytes']} bytes, {opts['epochs']} epochs, 2 emulated nodes of "
             f"one rank, {opts['open_ms']:g} ms per open, {opts['prefetchers']} prefetchers and "
             f"{opts['readers']} readers per node, batch {opts['batch_size']}.", "",
             "| capacity | policy | MB from the source per epoch | files from the source | Belady optimum | "
             "wall (s) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['share']:.0%} | {r['policy']} | "
                     f"{' / '.join(f'{b / 1e6:.1f}' for b in r['bytes_from_source'])} | {r['files_from_source']} | "
                     f"{r['belady_files']} | {r['wall_s']:.2f} |")
    lines += ["", f"One node, {opts['epochs']} epochs: DataLoader with {opts['prefetchers'] + opts['readers']} "
                  f"workers {one['direct_torch_wall_s']:.2f} s, stager (100% capacity) {one['stager_wall_s']:.2f} s: "
                  f"{one['speedup']:.2f}x; the ratio of their bounds is {one['bound_ratio']:.2f}x, so stager "
                  f"reaches {one['speedup'] / one['bound_ratio']:.2f} of it."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
