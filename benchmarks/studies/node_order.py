"""How much of the real runs' distance from the replay is the order the nodes' requests meet within a step.

``stager simulate``'s replay (``simulate.node_demand``) takes each step's
requests in the nodes' order: node 0 makes room and takes from its holders
before node 1 asks it for anything, and so on. Real nodes are not in step
within a step. This replays the jobs of ``benchmarks/cache/job_cache.py`` (its
saved real runs: 1,024 files, batch 16, 3 epochs, ``staging.peers:
partition``) both ways, ``order="node"`` and ``order="shuffled"`` (an order
drawn per step), and prints them beside the real source reads and the
job-wide optimum, all over the dataset.

    .venv/bin/python benchmarks/studies/node_order.py --default docs/job-cache.json --swaps docs/job-cache-swaps.json
"""

import argparse
import json

import numpy as np

from stager.config import PlanConfig
from stager.plan import PlanSpec
from stager.simulate import node_demand


def reads(sizes, spec, nodes, capacity, depth, swaps, order):
    demand = node_demand(sizes, spec, nodes, 1, None, capacity, "auto", depth, True, None, swaps, order)
    return sum(int(d.source_files.sum()) for d in demand.tracked)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--default", help="benchmarks/cache/job_cache.py's JSON")
    ap.add_argument("--swaps", help="benchmarks/cache/job_cache.py --swaps's JSON")
    opts = ap.parse_args()
    print("| runs | nodes | aggregate | look-ahead | real | replay, node order | replay, shuffled | optimum | "
          "real / node order | real / shuffled |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path, swaps in ((opts.default, False), (opts.swaps, True)):
        if path is None:
            continue
        with open(path) as fh:
            saved = json.load(fh)
        o = saved["options"]
        files = o["samples"]
        sizes = np.full(files, saved["dataset_bytes"] // files, dtype=np.int64)
        for row in saved["real"]:
            if "real" not in row:
                continue
            nodes = row["nodes"]
            job = PlanSpec.from_config(files, PlanConfig(batch_size=o["batch_size"], epochs=3, seed=1), nodes)
            by_node, shuffled = (reads(sizes, job, nodes, row["capacity"], row["depth"], swaps, order)
                                 for order in ("node", "shuffled"))
            real, best = sum(row["real"]), sum(row["optimum"])
            print(f"| {'swaps' if swaps else 'default'} | {nodes} | {row['aggregate']}x | {row['lookahead']} "
                  f"({row['depth']}) | {real / files:.3f} | {by_node / files:.3f} | {shuffled / files:.3f} | "
                  f"{best / files:.3f} | {real / by_node:.3f} | {real / shuffled:.3f} |", flush=True)


if __name__ == "__main__":
    main()
