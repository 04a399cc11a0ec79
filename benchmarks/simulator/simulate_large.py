"""``stager simulate`` at 1,024 to 4,096 nodes of 8 ranks over ImageNet-1k and ImageNet-22k sized datasets.

Each row is ``stager simulate configs/example.yaml`` as a user types it
(``--profile configs/profiles/cluster.yaml``, 8 tracked nodes, 3 epochs,
``staging.peers: partition`` with ``--baseline no-peers``), in a process of
its own: its wall time and peak resident memory are the simulation's cost.
Prints the epoch times, the shared file system's peak opens per second
against its metadata limit, the files and bytes read from it, against the
job-wide optimum (each file once: the nodes' caches hold the dataset).

    .venv/bin/python benchmarks/simulator/simulate_large.py --json docs/simulate-large.json

Prints a Markdown section for docs/simulate.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def simulate(nodes, files, opts, work):
    """One ``stager simulate`` in a process of its own: ``(result, wall s, peak resident bytes)``."""
    out = os.path.join(work, f"{nodes}-{files}.json")
    cmd = [sys.executable, "-m", "stager", "simulate", os.path.join(REPO, "configs", "example.yaml"),
           "--profile", opts.profile, "--nodes", str(nodes), "--ranks-per-node", str(opts.ranks_per_node),
           "--files", str(files), "--tracked", str(opts.tracked), "--set", f"plan.epochs={opts.epochs}",
           "--set", "staging.peers=partition", "--baseline", "no-peers", "--json", out]
    begin = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - begin
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{stdout}\n{stderr}")
    with open(out) as fh:
        return json.load(fh), wall, usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--files", type=int, nargs="+", default=[1_281_167, 14_000_000])
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--tracked", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--profile", default=os.path.join(REPO, "configs", "profiles", "cluster.yaml"))
    ap.add_argument("--json", help="write the results here")
    opts = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="stager-sim-large-") as work:
        for files in opts.files:
            for nodes in opts.nodes:
                result, wall, rss = simulate(nodes, files, opts, work)
                fs = result["profile"]["filesystem"]
                limit = fs["mds_ops_per_s"] * (1 - fs["other_load"])
                for method, m in result["methods"].items():
                    rows.append({"nodes": nodes, "files": files, "method": method, "seconds": m["seconds"],
                                 "epochs_s": [e["seconds"] for e in m["epochs"]], "stall": m["stall"],
                                 "source_files": m["source_files"], "source_bytes": m["source_bytes"],
                                 "per_epoch": [e["source_files"] for e in m["epochs"]],
                                 "peak_opens_per_s": m["peak_opens_per_s"], "opens_limit": limit,
                                 "optimum_files": result["files"], "wall_s": wall, "peak_rss": rss})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = {"options": vars(opts), "rows": rows}
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    print(markdown(out, " ".join(sys.argv[1:])))


def markdown(out, args):
    o = out["options"]
    lines = [f"Command: `.venv/bin/python benchmarks/simulator/simulate_large.py {args}`", "",
             f"`configs/example.yaml` ({o['epochs']} epochs, batch 32, 12 prefetchers, look-ahead 32, capacity "
             f"auto), {o['ranks_per_node']} ranks a node, {o['tracked']} nodes tracked, files of 110 KB, "
             "`configs/profiles/cluster.yaml`. Each row pair is one `stager simulate` (peers, and "
             "`--baseline no-peers`); its wall time and peak memory are for both.", "",
             "| files | nodes | peers | epochs s | stall | files read from the file system (per epoch) | "
             "x optimum | TB read | peak opens/s (limit) | simulated in s | peak memory GB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        peers = "partition" if r["method"] == "stager" else "off"
        lines.append(f"| {r['files']:,} | {r['nodes']:,} | {peers} | {' / '.join(f'{x:.1f}' for x in r['epochs_s'])} | "
                     f"{r['stall']:.0%} | {r['source_files']:,} ({' / '.join(f'{x:,}' for x in r['per_epoch'])}) | "
                     f"{r['source_files'] / r['optimum_files']:.2f} | {r['source_bytes'] / 1e12:.2f} | "
                     f"{r['peak_opens_per_s']:,.0f} ({r['opens_limit']:,.0f}) | {r['wall_s']:.0f} | "
                     f"{r['peak_rss'] / 1e9:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
