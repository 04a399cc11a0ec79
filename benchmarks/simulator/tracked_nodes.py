"""How well a few tracked nodes stand for all of them in ``stager simulate``'s replay with peers.

``node_demand`` replays ``tracked`` nodes' caches file by file and estimates
whether an untracked holder still has a file (``simulate.held.HeldShare``).
This replays the same jobs with every node tracked (nothing estimated) and
with a few, files of one size, batch 8 a rank, 3 epochs, a look-ahead of
2, ``staging.peers: partition``, and prints the source reads of each beside
the job-wide optimum.

    .venv/bin/python benchmarks/simulator/tracked_nodes.py
"""

import argparse

import numpy as np

from stager.config import PlanConfig
from stager.plan import PlanSpec
from stager.simulate import node_demand
from stager.simulate.optimum import job_optimum

# (nodes, ranks a node, steps an epoch, tracked)
JOBS = ((32, 2, 10, 4), (32, 2, 32, 4), (128, 4, 8, 8))
CAPACITIES = (("1/8 of the share", 1 / 8), ("0.25x", 0.25), ("0.5x", 0.5), ("1.0x", 1.0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    opts = ap.parse_args()
    print("| nodes | steps an epoch | tracked | capacity | all replayed | tracked | tracked / all | optimum |")
    print("|---|---|---|---|---|---|---|---|")
    for nodes, ranks, steps, tracked in JOBS:
        files = nodes * ranks * opts.batch * steps
        spec = PlanSpec.from_config(files, PlanConfig(batch_size=opts.batch, epochs=3, seed=1), nodes * ranks)
        sizes = np.ones(files, dtype=np.int64)
        share = files // nodes
        for label, part in CAPACITIES:
            # An eighth of the share leaves no room for the window: add it, as a node must have.
            capacity = int(part * share) + (ranks * 2 * opts.batch if part < 0.25 else 0)
            full = node_demand(sizes, spec, nodes, ranks, None, capacity, "auto", 2, True).totals("source_files")
            some = node_demand(sizes, spec, nodes, ranks, tracked, capacity, "auto", 2, True).totals("source_files")
            best = job_optimum(sizes, spec, np.repeat(np.arange(nodes), ranks), [capacity] * nodes, 2)["files"]
            print(f"| {nodes} x {ranks} | {steps} | {tracked} | {label} | {int(full.sum()):,} | {int(some.sum()):,} | "
                  f"{some.sum() / full.sum() - 1:+.1%} | {best:,} |", flush=True)


if __name__ == "__main__":
    main()
