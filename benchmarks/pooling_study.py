"""How far keeping each file on the node that read it last is from the job-wide optimum, and what forwarding would win.

A design study for the nodes' caches as one (issue 39), over stager's own
plan (``plan.job_reads``) with files of one size and every step taken by all
nodes at once (no timing). Each node asks for its step ``t + depth - 1`` at
step ``t`` and pins its files until it has read step ``t`` (a window of
``depth`` steps, as ``job_optimum`` counts it). Three rules:

- ``per-node``: the engine's rule. A file is held for the job by the last
  node to ask for it (a node that asks for a file another node holds copies
  it from there, and the other's copy goes once unpinned); a node short of
  room drops its unpinned file that any node reads latest.
- ``forwarding``: the same, but a file a node must drop goes to another node
  that has room, or whose own farthest unpinned file is read later (that
  node drops that one instead). Not built in the engine: the node that drops
  a file would have to know the others' farthest files and tell the next
  reader where the file went.
- ``in turn``: ``per-node``, but each node makes room as soon as it has
  asked for a step, before the nodes after it have taken from it what they
  read at that step.
- ``optimum``: ``simulate.optimum.job_optimum``, the nodes' capacities
  pooled (the bound ``stager simulate`` reports).

Beside them, ``stager``: the engine's own cache and holders replayed over the
same plan (``simulate.node_demand``, what ``stager simulate`` reports).

    .venv/bin/python benchmarks/pooling_study.py --files 2048 --batch 32 --nodes 4 --share 0.2

Prints source reads over the dataset per rule and depth.
"""

import argparse
import math

import numpy as np

from stager.config import PlanConfig
from stager.plan import PlanSpec, job_reads
from stager.simulate import node_demand
from stager.simulate.optimum import job_optimum, next_reads


def replay(steps, nodes, files, count, capacity, depth, forward, in_turn=False):
    """Source reads of ``per-node`` (``forward`` False) or ``forwarding`` with ``capacity`` files a node.

    ``in_turn``: each node makes room as soon as it has asked for its step,
    before the nodes after it take from it what they need at that step (as
    the engine's nodes, each asking when it gets there); otherwise every
    node's asks of a step come first.
    """
    following = next_reads(steps, files)
    bounds = np.searchsorted(steps, np.arange(int(steps.max()) + 2))
    n_nodes = int(nodes.max()) + 1
    has = [dict() for _ in range(n_nodes)]   # per node: file -> step it is read next (inf while pinned)
    pins = [dict() for _ in range(n_nodes)]
    holder = np.full(count, -1)
    reads = 0

    def unpinned(n):
        return [(v, f) for f, v in has[n].items() if not pins[n].get(f)]

    def make_room(n):
        while len(has[n]) > capacity:
            free = unpinned(n)
            if not free:
                return  # everything pinned: the window itself overflows
            v, f = max(free)
            del has[n][f]
            if holder[f] == n:
                holder[f] = -1
            if not forward:
                continue
            best, best_v = None, v
            for k in range(n_nodes):
                if k == n:
                    continue
                if len(has[k]) < capacity:
                    best = k
                    break
                others = unpinned(k)
                if others and max(others)[0] > best_v:
                    best, best_v = k, max(others)[0]
            if best is not None:
                if len(has[best]) >= capacity:
                    _, g = max(unpinned(best))
                    del has[best][g]
                    holder[g] = -1 if holder[g] == best else holder[g]
                has[best][f] = v
                holder[f] = best

    last = len(bounds) - 1
    for t in range(1 - depth, last):
        r = t + depth - 1
        if r < last:  # step r enters the windows
            asked = None
            for i in range(bounds[r], bounds[r + 1]):
                f, n = int(files[i]), int(nodes[i])
                if in_turn and asked is not None and n != asked:
                    make_room(asked)
                asked = n
                h = holder[f]
                if h < 0:
                    reads += 1
                elif h != n and not pins[h].get(f):
                    del has[h][f]  # the copy moves: the asker holds it for the job from now on
                holder[f] = n
                has[n][f] = math.inf
                pins[n][f] = pins[n].get(f, 0) + 1
            for n in range(n_nodes):
                make_room(n)
        if t >= 0:  # step t has been read
            for i in range(bounds[t], bounds[t + 1]):
                f, n = int(files[i]), int(nodes[i])
                pins[n][f] -= 1
                if pins[n][f]:
                    continue
                del pins[n][f]
                if holder[f] != n or math.isinf(following[i]):
                    has[n].pop(f, None)
                    holder[f] = -1 if holder[f] == n else holder[f]
                else:
                    has[n][f] = following[i]
    return reads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--share", type=float, default=0.2, help="each node's capacity, a share of the dataset")
    ap.add_argument("--depths", default="1,2,4")
    ap.add_argument("--seeds", default="7,8,9")
    opts = ap.parse_args()
    capacity = int(opts.share * opts.files)
    node_of_rank = np.arange(opts.nodes)
    print(f"{opts.files} files, batch {opts.batch}, {opts.nodes} nodes of one rank, {opts.epochs} epochs, "
          f"{capacity} files a node ({opts.share * opts.nodes:.2g}x the dataset together)\n")
    print("| depth | seed | stager | in turn | per-node | forwarding | optimum | stager / optimum | "
          "per-node / optimum | forwarding / optimum |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for depth in (int(x) for x in opts.depths.split(",")):
        for seed in (int(x) for x in opts.seeds.split(",")):
            spec = PlanSpec.from_config(opts.files, PlanConfig(batch_size=opts.batch, epochs=opts.epochs, seed=seed),
                                        opts.nodes)
            steps, nodes, files, _ = job_reads(spec, node_of_rank, None, opts.files)
            per_node = replay(steps, nodes, files, opts.files, capacity, depth, False)
            in_turn = replay(steps, nodes, files, opts.files, capacity, depth, False, True)
            forwarding = replay(steps, nodes, files, opts.files, capacity, depth, True)
            best = job_optimum(np.ones(opts.files), spec, node_of_rank, [capacity] * opts.nodes, depth)["files"]
            demand = node_demand(np.ones(opts.files), spec, opts.nodes, 1, None, capacity, "auto", depth, True)
            engine = sum(int(d.source_files.sum()) for d in demand.tracked)
            shares = " | ".join(f"{x / opts.files:.3f}" for x in (engine, in_turn, per_node, forwarding, best))
            print(f"| {depth} | {seed} | {shares} | {engine / best:.3f} | {per_node / best:.3f} | {forwarding / best:.3f} |")


if __name__ == "__main__":
    main()
