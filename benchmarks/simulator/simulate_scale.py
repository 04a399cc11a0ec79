"""``stager simulate`` at 1,024 nodes: an ImageNet-sized job on a shared parallel file system.

1,024 nodes of 4 ranks read 1,281,167 files of 110 KB for 3 epochs (batch
32 a rank, 100 ms a step) from a file system of ``--profile`` (default
``configs/profiles/cluster.yaml``), three ways: each rank's readers reading
the file system directly, stager without peers and stager with peers, with
each node's cache at 25%, 50% and 100% of its share of the dataset (plus
the look-ahead window). Prints the time of the run and of each epoch, the
stall, and the file system's load.

    .venv/bin/python benchmarks/simulator/simulate_scale.py --json docs/simulate-scale.json

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from stager.cache import window_bytes
from stager.config import config_from_dict
from stager.simulate import Layout, load_profile, simulate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ranks-per-node", type=int, default=4)
    ap.add_argument("--files", type=int, default=1_281_167)
    ap.add_argument("--file-bytes", type=int, default=110_000)
    ap.add_argument("--tracked", type=int, default=8)
    ap.add_argument("--shares", default="0.25,0.5,1.0")
    ap.add_argument("--profile", default=os.path.join(REPO, "configs", "profiles", "cluster.yaml"))
    ap.add_argument("--json")
    opts = ap.parse_args()
    sizes = np.full(opts.files, opts.file_bytes, dtype=np.int64)
    ranks = opts.ranks_per_node
    base = {"dataset": {"source": "/nonexistent"}, "plan": {"batch_size": 32, "epochs": 3, "seed": 0},
            "staging": {"prefetchers": 16, "lookahead": 4}, "reader": {"workers": 8}, "run": {"compute_ms": 100}}
    window = window_bytes(sizes, 32, max(4, 16), ranks)
    profile = load_profile(opts.profile)
    rows = []
    for share in (float(s) for s in opts.shares.split(",")):
        capacity = int(share * sizes.sum() / opts.nodes) + window
        for peers in ("off", "partition"):
            cfg = config_from_dict({**base, "staging": {**base["staging"], "capacity": str(capacity), "peers": peers}})
            methods = ["stager", "direct"] if peers == "off" and share == 1.0 else ["stager"]
            begin = time.perf_counter()
            result = simulate(cfg, profile, Layout(opts.nodes, ranks, opts.tracked), sizes, methods=methods)
            wall = time.perf_counter() - begin
            for method, m in result["methods"].items():
                name = "direct" if method == "direct" else f"stager, peers {peers}"
                rows.append({"share": share if method != "direct" else None, "method": name,
                             "seconds": m["seconds"], "epochs_s": [e["seconds"] for e in m["epochs"]],
                             "stall": m["stall"], "source_files": m["source_files"],
                             "source_files_per_epoch": [e["source_files"] for e in m["epochs"]],
                             "peak_opens_per_s": m["peak_opens_per_s"], "peak_mb_per_s": m["peak_mb_per_s"],
                             "simulation_wall_s": wall})
                print(json.dumps(rows[-1]), file=sys.stderr)
    out = {"options": vars(opts), "profile": profile.to_dict(), "rows": rows}
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print(markdown(out, " ".join(sys.argv[1:])))


def markdown(out, args):
    o = out["options"]
    lines = [f"Command: `.venv/bin/python benchmarks/simulator/simulate_scale.py {args}`", "",
             f"{o['nodes']} nodes x {o['ranks_per_node']} ranks, {o['files']:,} files of {o['file_bytes']:,} bytes, "
             f"3 epochs, batch 32 a rank, 100 ms a step, 16 prefetchers and 8 readers a rank's node; {o['tracked']} "
             "nodes replayed file by file.", "",
             "| method | cache (share of the node's part) | time s | epochs s | stall | files from the file system | "
             "per epoch | peak opens/s | peak MB/s | simulated in s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        share = "-" if r["share"] is None else f"{r['share']:.0%}"
        lines.append(f"| {r['method']} | {share} | {r['seconds']:.1f} | "
                     f"{' / '.join(f'{x:.1f}' for x in r['epochs_s'])} | {r['stall']:.0%} | {r['source_files']:,} | "
                     f"{' / '.join(f'{x:,}' for x in r['source_files_per_epoch'])} | {r['peak_opens_per_s']:,.0f} | "
                     f"{r['peak_mb_per_s']:,.0f} | {r['simulation_wall_s']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
