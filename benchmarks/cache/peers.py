"""Nodes sharing their caches (``staging.peers``) against each node reading its misses from the source.

Runs ``stager run`` under ``mpiexec`` as several emulated nodes of one rank
each (``STAGER_NODE_ID``) on the slow file system emulator, for several
epochs, with ``staging.peers`` off and ``partition``, at two capacities per
node: "100%" is the node's share of the dataset (its aggregate over the nodes
is the dataset) plus the look-ahead window, "50%" half that share plus the
window. ``partition`` runs with the default choice (``staging.peer_choice:
holder``) and, as ``measured``, with the rate-based one. Then the same three
at 100% beside a second job hammering the same source (``--hammer``
threads opening and reading its files in a loop, as another job's loaders
would). Records per epoch the files and bytes read from the source and from
peers, and the job's wall time.

    .venv/bin/python benchmarks/cache/peers.py --json docs/peers.json --plot docs/bench-peers.png

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from stager.cache import window_bytes
from stager.catalog import Catalog
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS

MODES = {"off": ["staging.peers='off'"], "partition": ["staging.peers=partition"],
         "measured": ["staging.peers=partition", "staging.peer_choice=measured"]}
SHARES = (1.0, 0.5)
HAMMER = """
import os, random, sys, threading, time
root, stop, done = sys.argv[1], threading.Event(), [0]
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
def loop(seed):
    rng = random.Random(seed)
    while not stop.is_set():
        with open(rng.choice(files), "rb") as fh:
            fh.read()
        done[0] += 1
threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(int(sys.argv[2]))]
begin = time.perf_counter()
for t in threads:
    t.start()
sys.stdin.read()  # until the benchmark closes our stdin
stop.set()
print(done[0] / (time.perf_counter() - begin))  # the other job's files read per second meanwhile
"""


def run_job(cfg_path, nodes, sets, tmp):
    """``stager run`` on ``nodes`` emulated nodes of one rank; returns the report and the time outside."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    report = os.path.join(tmp, "r.json")
    args = ["run", cfg_path, "--quiet", "--report", report] + [a for s in sets for a in ("--set", s)]
    cmd = [mpiexec]
    for i in range(nodes):
        cmd += ([":"] if i else []) + ["-n", "1", "-env", "STAGER_NODE_ID", f"n{i}", sys.executable, "-m", "stager"]
        cmd += args
    for attempt in (1, 2):
        begin = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TMPDIR=tmp), timeout=180)
            break
        except subprocess.TimeoutExpired:
            # MPI jobs started beside others' on a shared machine now and then
            # never leave MPI_Init: start it again, once, and say so.
            print(f"run {attempt} did not finish in 180 s; {'again' if attempt == 1 else 'giving up'}",
                  file=sys.stderr)
    else:
        raise RuntimeError("the job did not finish twice")
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    with open(report) as fh:
        out = json.load(fh)
    out["outside_wall_s"] = time.perf_counter() - begin
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = {"nodes": 4, "samples": 800, "bytes": 20_000, "epochs": 3, "open-ms": 10.0, "prefetchers": 4,
                "readers": 1, "batch-size": 16}
    for name, default in defaults.items():
        ap.add_argument(f"--{name}", type=type(default), default=default)
    ap.add_argument("--hammer", type=int, default=8, help="threads of the second job reading the source")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write the plot here (PNG)")
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-peers-bench-")
    rows = []
    try:
        data = os.path.join(work, "data")
        make_dataset(data, opts.samples, opts.bytes, progress=False)
        catalog = Catalog.from_manifest(data, MANIFEST)
        share = int(catalog.sizes.sum()) // opts.nodes
        window = window_bytes(catalog.sizes, opts.batch_size, 2, 1)
        os.mkdir(os.path.join(work, "mnt"))
        with SlowFS(data, os.path.join(work, "mnt"), open_ms=opts.open_ms) as mnt:
            cfg_path = os.path.join(work, "job.yaml")
            local = os.path.join(work, "local")
            with open(cfg_path, "w") as fh:
                json.dump({"dataset": {"source": mnt, "manifest": MANIFEST},
                           "plan": {"batch_size": opts.batch_size, "epochs": opts.epochs, "seed": 1},
                           "staging": {"local_dir": local, "prefetchers": opts.prefetchers, "lookahead": 2},
                           "reader": {"workers": opts.readers, "ahead": 2}}, fh)
            for fraction, hammer in [(s, 0) for s in SHARES] + [(1.0, opts.hammer)]:
                capacity = int(fraction * share) + window
                for mode, sets in MODES.items():
                    other = (subprocess.Popen([sys.executable, "-c", HAMMER, mnt, str(hammer)], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, text=True) if hammer else None)
                    other_rate = None
                    try:
                        r = run_job(cfg_path, opts.nodes, [f"staging.capacity={capacity}", *sets], work)
                    finally:
                        if other is not None:
                            out, _ = other.communicate("", timeout=60)
                            other_rate = float(out.split()[-1]) if out.split() else None
                    shutil.rmtree(local, ignore_errors=True)
                    rows.append({"share": fraction, "mode": mode, "capacity": capacity, "hammer": hammer,
                                 "other_files_per_s": other_rate,
                                 "files_from_source": [e["files_from_source"] for e in r["cache"]],
                                 "bytes_from_source": [e["bytes_from_source"] for e in r["cache"]],
                                 "files_from_peers": [e["files_from_peers"] for e in r["cache"]],
                                 "wall_s": r["outside_wall_s"]})
                    print(f"{fraction:4.0%} {mode:9s} hammer {hammer} files from source {rows[-1]['files_from_source']} from peers "
                          f"{rows[-1]['files_from_peers']} wall {r['outside_wall_s']:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"options": vars(opts), "dataset_bytes": int(catalog.sizes.sum()), "rows": rows}
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(result, fh, indent=1)
    if opts.plot:
        plot(result, opts.plot)
    print(markdown(result, " ".join(sys.argv[1:])))


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [f"{r['mode']}\n{r['share']:.0%}" + ("\n+job" if r.get("hammer") else "") for r in rows]
    bottom = [0.0] * len(rows)
    for epoch in range(result["options"]["epochs"]):
        mb = [r["bytes_from_source"][epoch] / 1e6 if epoch < len(r["bytes_from_source"]) else 0 for r in rows]
        left.bar(labels, mb, bottom=bottom, label=f"epoch {epoch}")
        bottom = [b + m for b, m in zip(bottom, mb)]
    left.axhline(result["dataset_bytes"] / 1e6, color="k", linestyle="--", label="dataset once")
    left.set_ylabel("MB read from the shared file system")
    left.set_title("source reads per epoch (peers, capacity)")
    left.set_ylim(top=1.45 * max(bottom))
    left.legend(loc="upper center", ncol=2, fontsize=8)
    right.bar(labels, [r["wall_s"] for r in rows], color="gray")
    right.set_ylabel("job wall time (s)")
    right.set_title(f"{result['options']['nodes']} emulated nodes, {result['options']['epochs']} epochs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result, args):
    opts, rows = result["options"], result["rows"]
    lines = [f"Command: `.venv/bin/python benchmarks/cache/peers.py {args}`", "",
             f"{opts['samples']} samples of {opts['bytes']} bytes ({result['dataset_bytes'] / 1e6:.1f} MB), "
             f"{opts['epochs']} epochs, {opts['nodes']} emulated nodes of one rank, {opts['open_ms']:g} ms per "
             f"open, {opts['prefetchers']} prefetchers and {opts['readers']} reader(s) per node, batch "
             f"{opts['batch_size']}.", "",
             "| capacity | beside | peers | files from the source per epoch | MB from the source | files from peers per "
             "epoch | wall (s) | the other job's files/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        beside = f"a job of {r['hammer']} readers" if r.get("hammer") else "-"
        other = f"{r['other_files_per_s']:.0f}" if r.get("other_files_per_s") else "-"
        lines.append(f"| {r['share']:.0%} | {beside} | {r['mode']} | {' / '.join(map(str, r['files_from_source']))} | "
                     f"{sum(r['bytes_from_source']) / 1e6:.1f} | {' / '.join(map(str, r['files_from_peers']))} | "
                     f"{r['wall_s']:.2f} | {other} |")
    for share, hammer in [(s, 0) for s in SHARES] + [(1.0, opts["hammer"])]:
        got = {m: next(r for r in rows if r["share"] == share and r.get("hammer", 0) == hammer and r["mode"] == m)
               for m in MODES}
        times = lambda m: sum(got[m]["bytes_from_source"]) / result["dataset_bytes"]  # noqa: E731
        lines.append(f"\nAt {share:.0%}{' beside the other job' if hammer else ''}: the dataset read "
                     f"{times('partition'):.2f}x from the source with partition, {times('measured'):.2f}x with "
                     f"measured, {times('off'):.2f}x off; time partition / off = "
                     f"{got['partition']['wall_s'] / got['off']['wall_s']:.2f}, measured / off = "
                     f"{got['measured']['wall_s'] / got['off']['wall_s']:.2f}.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
