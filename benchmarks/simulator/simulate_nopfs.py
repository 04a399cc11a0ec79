"""``stager simulate`` set to NoPFS's Lassen: ImageNet-1k at 16 to 256 nodes of 4 GPUs, against direct reading.

NoPFS's authors gave their prefetcher Lassen's figures (``configs/profiles/lassen.yaml``
says which are theirs and which are assumed). Each node count is simulated
three ways for 3 epochs of ImageNet-1k (1,281,167 files of 110 KB, batch 32
a GPU): stager with peers, each rank's readers reading GPFS directly (as
PyTorch's DataLoader does), and every node copying the dataset first.

    .venv/bin/python benchmarks/simulator/simulate_nopfs.py --json docs/simulate-nopfs.json

Prints a Markdown table for docs/benchmarks.md.
"""

import argparse
import json
import os
import sys

import numpy as np

from stager.config import config_from_dict
from stager.simulate import Layout, load_profile, simulate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="16,64,256")
    ap.add_argument("--files", type=int, default=1_281_167)
    ap.add_argument("--tracked", type=int, default=8)
    ap.add_argument("--json")
    opts = ap.parse_args()
    profile = load_profile(os.path.join(REPO, "configs", "profiles", "lassen.yaml"))
    sizes = np.full(opts.files, 110_000, dtype=np.int64)
    cfg = config_from_dict({"dataset": {"source": "/nonexistent"}, "plan": {"batch_size": 32, "epochs": 3},
                            "staging": {"prefetchers": 16, "lookahead": 4, "peers": "partition",
                                        "capacity": "auto"},
                            "reader": {"workers": 8}})
    rows = []
    for nodes in (int(n) for n in opts.nodes.split(",")):
        result = simulate(cfg, profile, Layout(nodes, 4, opts.tracked), sizes,
                          methods=["stager", "direct", "stage-all"])
        row = {"nodes": nodes, "gpus": 4 * nodes}
        for method, m in result["methods"].items():
            row[method] = {"epochs_s": [e["seconds"] for e in m["epochs"]], "seconds": m["seconds"],
                           "stall": m["stall"], "source_files": m["source_files"]}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    out = {"options": vars(opts), "profile": profile.to_dict(), "rows": rows}
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(out, fh, indent=1)
    lines = [f"Command: `.venv/bin/python benchmarks/simulator/simulate_nopfs.py {' '.join(sys.argv[1:])}`", "",
             "| nodes (GPUs) | direct: epoch s | stage all first: epoch s | stager: epoch s | direct / stager, "
             "epochs 2-3 | direct / stager, whole run |", "|---|---|---|---|---|---|"]
    for r in rows:
        d, a, s = r["direct"], r["stage-all"], r["stager"]
        fmt = lambda m: " / ".join(f"{x:.1f}" for x in m["epochs_s"])  # noqa: E731
        lines.append(f"| {r['nodes']} ({r['gpus']}) | {fmt(d)} | {fmt(a)} | {fmt(s)} | "
                     f"{sum(d['epochs_s'][1:]) / sum(s['epochs_s'][1:]):.2f} | {d['seconds'] / s['seconds']:.2f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
