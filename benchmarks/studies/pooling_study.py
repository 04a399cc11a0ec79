"""How far keeping each file on the node that read it last is from the job-wide optimum, and what forwarding would win.

A design study for the nodes' caches as one (issue 39), over stager's own
plan (``plan.job_reads``) with files of one size and every step taken by all
nodes alike (no timing). Each node asks for its step ``t + depth - 1`` at
step ``t`` and pins its files until it has read step ``t`` (a window of
``depth`` steps, as ``job_optimum`` counts it). A file is held for the job
by the last node to ask for it (a node that asks for a file another node
holds copies it from there, and the other's copy goes once unpinned); a node
short of room drops its unpinned file that any node reads latest. Rules:

- ``hard``: the nodes take their step in turn, each making room for what it
  takes before taking it: a node never holds more than its capacity, as the
  engine's nodes (``Cache.room_for``).
- ``hard, forwarding``: the same, but a file a node must drop goes to
  another node that has room at that moment. Not built in the engine: the
  node that drops a file would have to know which node has room and tell
  the next reader where the file went.
- ``hard, swap``: the same hard bound, and a node that must drop a file to
  take one from its holder gives the holder its dropped file in exchange:
  it takes the place of the one handed on, so neither node ever holds more
  than its capacity. The holder is the one node sure to have that room.
  Not built in the engine: the dropped file's next reader asks the node
  that read it last, which would have to tell it where the file went.
- ``per-node``: every node's asks of a step come before any node makes room:
  within a step a node may hold more than its capacity.
- ``forwarding``: ``per-node``, and a file a node must drop goes to a node
  that has room, or whose own farthest unpinned file is read later (that
  node drops that one instead).
- ``optimum``: ``simulate.optimum.job_optimum``, the nodes' capacities
  pooled (the bound ``stager simulate`` reports).

Beside them, ``stager``: the engine's own cache and holders replayed over the
same plan (``simulate.node_demand``, what ``stager simulate`` reports).

    .venv/bin/python benchmarks/studies/pooling_study.py --files 2048 --batch 32 --nodes 4 --share 0.2
    .venv/bin/python benchmarks/studies/pooling_study.py --files 1024 4096 16384 --batch 16 --share 0.25 --depths 2 --seeds 7

Prints source reads over the dataset per rule, dataset size and depth, and
the files ``hard, forwarding`` and ``hard, swap`` move between nodes
(over the dataset).
"""

import argparse
import math

import numpy as np

from stager.config import PlanConfig
from stager.plan import PlanSpec, job_reads
from stager.simulate import node_demand
from stager.simulate.optimum import job_optimum, next_reads


def replay(steps, nodes, files, count, capacity, depth, forward, hard=False, swap=False):
    """Source reads of one rule with ``capacity`` files a node.

    ``hard``: each node in turn makes room for the files of its step it does
    not have before it takes them, so it never holds more than
    ``capacity`` (as the engine's nodes); otherwise every node's asks of a
    step come first and each node then makes room (it may hold more within
    the step). ``forward``: a file a node must drop goes to another node:
    with ``hard``, only to one with room at that moment; otherwise to one
    with room or whose own farthest unpinned file is read later (that node
    drops that one instead). ``swap`` (with ``hard``): a node short of room
    for a file it takes from its holder makes room one file at a time, and
    the file it drops takes the place of that one on the holder.
    """
    following = next_reads(steps, files)
    bounds = np.searchsorted(steps, np.arange(int(steps.max()) + 2))
    n_nodes = int(nodes.max()) + 1
    has = [dict() for _ in range(n_nodes)]   # per node: file -> step it is read next (inf while pinned)
    pins = [dict() for _ in range(n_nodes)]
    holder = np.full(count, -1)
    reads = forwarded = 0

    def unpinned(n):
        return [(v, f) for f, v in has[n].items() if not pins[n].get(f)]

    def target(n, v):
        """The node a file read next at ``v`` that ``n`` drops goes to, or None."""
        best, best_v = None, v
        for k in range(n_nodes):
            if k == n:
                continue
            if len(has[k]) < capacity:
                return k
            others = [] if hard else unpinned(k)
            if others and max(others)[0] > best_v:
                best, best_v = k, max(others)[0]
        return best

    def make_room(n, limit):
        nonlocal forwarded
        while len(has[n]) > limit:
            free = unpinned(n)
            if not free:
                return  # everything pinned: the window itself overflows
            v, f = max(free)
            del has[n][f]
            if holder[f] == n:
                holder[f] = -1
            to = target(n, v) if forward and not math.isinf(v) else None
            if to is not None:
                if len(has[to]) >= capacity:
                    _, g = max(unpinned(to))
                    del has[to][g]
                    holder[g] = -1 if holder[g] == to else holder[g]
                has[to][f] = v
                holder[f] = to
                forwarded += 1

    def take(n, f):
        nonlocal reads, forwarded
        h = holder[f]
        moving = h >= 0 and h != n and not pins[h].get(f)
        if swap and f not in has[n] and len(has[n]) >= capacity and unpinned(n):
            v, g = max(unpinned(n))
            del has[n][g]
            holder[g] = -1 if holder[g] == n else holder[g]
            if moving and not math.isinf(v):  # the holder's copy of f goes: g takes its place there
                del has[h][f]
                has[h][g], holder[g] = v, h
                forwarded += 1
                moving = False
        if h < 0:
            reads += 1
        elif moving:
            del has[h][f]  # the copy moves: the asker holds it for the job from now on
        holder[f] = n
        has[n][f] = math.inf
        pins[n][f] = pins[n].get(f, 0) + 1

    last = len(bounds) - 1
    for t in range(1 - depth, last):
        r = t + depth - 1
        if r < last:  # step r enters the windows
            asks = {}
            for i in range(bounds[r], bounds[r + 1]):
                asks.setdefault(int(nodes[i]), []).append(int(files[i]))
            for n in sorted(asks):
                if hard and not swap:
                    make_room(n, capacity - len(set(asks[n]) - set(has[n])))
                for f in asks[n]:
                    take(n, f)
            if not hard:
                for n in range(n_nodes):
                    make_room(n, capacity)
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
    return reads, forwarded


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, nargs="+", default=[2048])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--share", type=float, default=0.2, help="each node's capacity, a share of the dataset")
    ap.add_argument("--depths", default="1,2,4")
    ap.add_argument("--seeds", default="7,8,9")
    opts = ap.parse_args()
    node_of_rank = np.arange(opts.nodes)
    print(f"batch {opts.batch}, {opts.nodes} nodes of one rank, {opts.epochs} epochs, each node "
          f"{opts.share:.0%} of the dataset ({opts.share * opts.nodes:.2g}x together)\n")
    print("| files | a node | depth | seed | stager | hard | hard, forwarding | hard, swap | per-node | forwarding | "
          "optimum | stager / optimum | hard, forwarding / optimum | hard, swap / optimum | per-node / optimum | "
          "forwarded | swapped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for count in opts.files:
        capacity = int(opts.share * count)
        for depth in (int(x) for x in opts.depths.split(",")):
            for seed in (int(x) for x in opts.seeds.split(",")):
                spec = PlanSpec.from_config(count, PlanConfig(batch_size=opts.batch, epochs=opts.epochs, seed=seed),
                                            opts.nodes)
                steps, nodes, files, _ = job_reads(spec, node_of_rank, None, count)
                rule = {name: replay(steps, nodes, files, count, capacity, depth, forward, hard, swap)
                        for name, forward, hard, swap in (
                            ("hard", False, True, False), ("hard, forwarding", True, True, False),
                            ("hard, swap", False, True, True), ("per-node", False, False, False),
                            ("forwarding", True, False, False))}
                best = job_optimum(np.ones(count), spec, node_of_rank, [capacity] * opts.nodes, depth)["files"]
                demand = node_demand(np.ones(count), spec, opts.nodes, 1, None, capacity, "auto", depth, True)
                engine = sum(int(d.source_files.sum()) for d in demand.tracked)
                reads = (engine, rule["hard"][0], rule["hard, forwarding"][0], rule["hard, swap"][0],
                         rule["per-node"][0], rule["forwarding"][0], best)
                shares = " | ".join(f"{x / count:.3f}" for x in reads)
                ratios = " | ".join(f"{rule[name][0] / best:.3f}" for name in ("hard, forwarding", "hard, swap", "per-node"))
                print(f"| {count} | {capacity} | {depth} | {seed} | {shares} | {engine / best:.3f} | {ratios} | "
                      f"{rule['hard, forwarding'][1] / count:.2f} | {rule['hard, swap'][1] / count:.2f} |")


if __name__ == "__main__":
    main()
