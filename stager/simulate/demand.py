"""What each node reads at each step, and from where: the plan through the engine's own cache, exactly.

Which files a node fetches does not depend on timing: its ranks' minibatches
follow from the plan, and a clairvoyant cache decides from the plan alone.
So the demand is computed before any time is simulated, by replaying each
node's requests through ``model.misses.NodeReplay`` (the engine's
``cache.Cache`` and policy). With peers, a file a node misses is asked of
its holder (``engine.peers.holders``, the engine's own rule): it comes from
the holder while the holder has it or will (the fetcher then waits for it,
as the engine's does), and from the source once the holder has dropped it.

Only ``tracked`` nodes are replayed; the others are exchangeable with them
(every node's share of a random permutation looks alike), so node ``n`` is
simulated with the demand of tracked node ``n mod K``. With every node
tracked, nothing is estimated and holders follow the engine's rule (and,
with ``staging.peer_swaps``, its swaps: ``gifts.py``). With fewer, whether
an untracked holder still has a file is estimated from what the tracked
holders had when asked, by how long before they had read it
(``held.HeldShare``). Where the job's reads are too many to list, files are
held by their first-epoch readers (``FirstReaders``), and an untracked owner
is taken to have dropped the share of its files the tracked owners dropped,
from the highest indices down, as the clairvoyant policy's tie rule does.

At each step the tracked nodes' requests meet in the order of their numbers:
the lowest-numbered node makes room and takes from its holders before the
others ask it for anything. Real nodes are not in step within a step: with
``order="shuffled"`` each step's nodes take their turn in an order drawn from
the plan's seed and the step (``pooling_study.py`` compares the two).
"""

from dataclasses import dataclass

import numpy as np

from ..cache import ABSENT
from ..engine.peers.holders import BUDGET, FirstReaders, LatestReaders
from ..engine.peers.ownership import NO_OWNER, first_epoch_owners
from ..model.misses import NodeReplay
from ..plan import job_reads, read_at, steps_per_epoch
from .gifts import GivenShare, asked_of, give
from .held import HeldShare, OwnersHeld

# Ownership is evaluated rank by rank (the engine's own function) up to this
# many ranks; beyond it, from the inverse of the first epoch's permutation in
# one pass (``plan.read_at``), which gives the same owners except for the
# few samples read twice as padding.
EXACT_OWNERS_RANKS = 256


@dataclass
class NodeDemand:
    """One tracked node's reads, one entry per step of the job (every rank's minibatch of it).

    Attributes:
        node: The node's index.
        source_files, source_bytes: Fetched from the shared file system.
        peer_files, peer_bytes: Fetched from other nodes' caches.
        local_files, local_bytes: Already in the node's cache.
        samples: Samples of each of the node's ranks at the step.
    """

    node: int
    source_files: np.ndarray
    source_bytes: np.ndarray
    peer_files: np.ndarray
    peer_bytes: np.ndarray
    local_files: np.ndarray
    local_bytes: np.ndarray
    samples: np.ndarray


@dataclass
class Demand:
    """Every tracked node's reads, and the steps' epochs.

    Attributes:
        nodes: Nodes in the job.
        ranks_per_node: Ranks of each node.
        epochs: Per step, its epoch.
        tracked: A ``NodeDemand`` per tracked node (node ``n`` reads as ``tracked[n % len(tracked)]``).
    """

    nodes: int
    ranks_per_node: int
    epochs: np.ndarray
    tracked: list

    def of(self, node):
        return self.tracked[node % len(self.tracked)]

    def totals(self, key):
        """``key`` (``source_files``...) summed over every node, per epoch (estimated where nodes are untracked)."""
        out = np.zeros(int(self.epochs.max()) + 1 if len(self.epochs) else 0)
        for node in range(self.nodes):
            np.add.at(out, self.epochs, getattr(self.of(node), key))
        return out


def owners(spec, files, nodes, ranks_per_node, to_files=None, exact_ranks=EXACT_OWNERS_RANKS):
    """Per file, the node that owns it with peers: the node of the first rank to read it in the first epoch.

    Up to ``exact_ranks`` ranks, by the engine's own function; beyond, in one pass.
    """
    node_of_rank = np.repeat(np.arange(nodes, dtype=np.int32), ranks_per_node)
    if spec.size <= exact_ranks:
        return first_epoch_owners(spec, files, spec.size, node_of_rank, to_files)
    reads = read_at(spec, spec.start.epoch, np.arange(spec.samples, dtype=np.int64))
    read = reads.rank >= 0
    samples = np.flatnonzero(read)
    target = samples if to_files is None else to_files(samples)
    first = np.full(files, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, target, reads.rank[read])
    out = np.full(files, NO_OWNER, dtype=np.int32)
    found = first != np.iinfo(np.int64).max
    out[found] = node_of_rank[first[found]]
    return out


def _rules(spec, files, nodes, ranks_per_node, to_files, tracked):
    """Per tracked node, its holders' rule: the engine's (``LatestReaders``) where the job's reads can be listed.

    Only the tracked nodes have one: a node's rule keeps arrays over the
    whole catalog, and 1,024 of them for 1.28M files took 30 GB.
    """
    node_of_rank = np.repeat(np.arange(nodes, dtype=np.int32), ranks_per_node)
    if spec.epochs and spec.samples * (spec.epochs - spec.start.epoch) <= BUDGET:
        steps, node, read, _ = job_reads(spec, node_of_rank, to_files, files)
        rule = LatestReaders(steps, node, read, 0, files)
        return [rule.for_node(n) for n in range(tracked)], (steps, node, read)
    owner = owners(spec, files, nodes, ranks_per_node, to_files)
    return [FirstReaders(owner, n) for n in range(tracked)], None


def _hand_on(rules, listed, seq, tracked, replays, holders, kept_given):
    """Untracked nodes read their step ``seq``: tracked holders hand them what they hold for them.

    Whether each holder still had the file (or the node it gave it to, as
    ``kept_given`` estimates) is counted by ``holders`` (``held.HeldShare``):
    the untracked holders' estimate. What untracked nodes would give is
    left out (``gifts.py`` says why).
    """
    steps, node, read = listed
    lo, hi = np.searchsorted(steps, [seq, seq + 1])
    away = node[lo:hi] >= tracked
    files = read[lo:hi][away]
    plan = rules[0].holder(files, seq)
    holder, given = asked_of(rules, None, files, plan)
    for i in np.flatnonzero((plan >= 0) & (plan < tracked)).tolist():
        f, h = int(files[i]), int(holder[i])
        if 0 <= h < tracked:
            cache = replays[h].cache
            held = cache.state[f] != ABSENT or rules[h].to_come(f, cache, seq)
        else:
            held = given[i] and kept_given.held(f)
        holders.asked(f, int(plan[i]), seq, held)  # the file there, or where it was given
    inside = (holder >= 0) & (holder < tracked)
    for h in np.unique(holder[inside]).tolist():
        rules[h].served(files[holder == h], seq)


ORDERS = ("node", "shuffled")  # how the tracked nodes' requests of one step meet each other


def node_demand(sizes, spec, nodes, ranks_per_node, tracked=None, capacity=None, policy="auto", ahead=16,
                peers=False, to_files=None, swaps=False, order="node", progress=None):
    """Each tracked node's reads per step, from the plan and the engine's cache.

    Args:
        sizes: File sizes in bytes.
        spec: The job's ``plan.PlanSpec`` (``spec.size`` is ``nodes * ranks_per_node``).
        nodes: Nodes in the job.
        ranks_per_node: Ranks on each node (ranks ``n * R .. n * R + R - 1`` on node ``n``).
        tracked: How many nodes to replay (the first ones); None: all.
        capacity: Bytes each node's cache may hold, or None (unbounded).
        policy: ``staging.cache_policy``.
        ahead: Minibatches each rank asks for past its reading.
        peers: ``staging.peers: partition``.
        to_files: Maps samples to the files holding them, or None.
        swaps: ``staging.peer_swaps``.
        order: ``node``: each step's requests meet in the nodes' order;
            ``shuffled``: in an order drawn per step from the plan's seed.
        progress: A ``progress.Progress`` told of each step, or None.

    Returns:
        A ``Demand``.
    """
    if order not in ORDERS:
        raise ValueError(f"node_demand: unknown order {order!r}; known: {', '.join(ORDERS)}")
    sizes = np.asarray(sizes, dtype=np.int64)
    tracked = nodes if tracked is None else max(1, min(tracked, nodes))
    rules, listed = _rules(spec, len(sizes), nodes, ranks_per_node, to_files, tracked) if peers else (None, None)
    replays = {n: NodeReplay(sizes, spec, range(n * ranks_per_node, (n + 1) * ranks_per_node), capacity, policy,
                             ahead, to_files, None if rules is None else rules[n]) for n in range(tracked)}
    latest = rules is not None and isinstance(rules[0], LatestReaders)
    for rule in rules or ():
        rule.swaps = rule.swaps and swaps
    swapping = latest and swaps
    holders = None
    if rules is not None:
        holders = HeldShare(rules, len(sizes)) if latest else OwnersHeld(rules[0].owners, replays)
    by_age = latest and tracked < nodes
    kept_given = GivenShare(len(sizes))
    rows = {n: [] for n in range(tracked)}
    epochs = []
    streams = {n: zip(*(spec.minibatches(r) for r in range(n * ranks_per_node, (n + 1) * ranks_per_node)))
               for n in range(tracked)}
    total = steps_per_epoch(spec.samples, spec.batch_size, spec.drop_last, spec.size, spec.remainder) * \
        (spec.epochs - spec.start.epoch)
    for seq, step in enumerate(zip(*streams.values())):
        if progress is not None:
            progress.update(f"replaying {tracked:,} of {nodes:,} nodes' caches", seq, total, "step")
        epochs.append(step[0][0].epoch)
        this_step = []
        kept_given.check(seq)
        turns = list(zip(range(tracked), step))
        if order == "shuffled":
            turns = [turns[i] for i in np.random.default_rng((spec.seed, seq)).permutation(tracked)]
        for n, minibatches in turns:
            fetched, local, dropped = [], [], []
            for offset, mb in enumerate(minibatches):
                missing, files = replays[n].request(n * ranks_per_node + offset, seq, mb.indices)
                fetched.append(missing)
                local.append(np.setdiff1d(files, missing, assume_unique=True))
                dropped.append(replays[n].dropped)
            fetched, local = np.concatenate(fetched), np.concatenate(local)
            from_peer, untracked = np.zeros(len(fetched), dtype=bool), []
            if rules is not None and len(fetched):
                plan = owner = rules[n].holder(fetched, seq, n)
                given = mine = np.zeros(len(fetched), dtype=bool)
                if swapping:
                    mine = rules[n].moved[fetched] >= 0  # given away by this node itself: not its holder's doing
                    owner, given = asked_of(rules, n, fetched, owner)
                    rules[n].reclaim(fetched)  # here again (the engine's ``route``)
                elsewhere = (owner != NO_OWNER) & (owner != n)
                for i, f, o in zip(np.flatnonzero(elsewhere).tolist(), fetched[elsewhere].tolist(),
                                   owner[elsewhere].tolist()):
                    if o in replays:
                        cache = replays[o].cache
                        from_peer[i] = cache.state[f] != ABSENT or rules[o].to_come(f, cache, seq)
                        if from_peer[i]:
                            rules[o].served(f, seq)
                    elif given[i]:
                        from_peer[i] = kept_given.held(f)
                    elif by_age:
                        untracked.append((i, f, o))  # estimated once this step's asks of tracked holders are in
                        continue
                    else:
                        from_peer[i] = holders.held(np.array([f]))[0]
                    if by_age and plan[i] in replays and not mine[i]:
                        holders.asked(f, int(plan[i]), seq, from_peer[i])  # the file there, or where it was given
                if swapping:
                    give(replays, rules, n, np.concatenate(dropped), owner, sizes, kept_given)
            this_step.append((n, fetched, local, from_peer, untracked, len(minibatches[0].indices)))
        if listed is not None and tracked < nodes:
            _hand_on(rules, listed, seq, tracked, replays, holders, kept_given)
        if by_age:
            holders.update()
        elif holders is not None and tracked < nodes and seq % 8 == 0:
            holders.update()
        for n, fetched, local, from_peer, untracked, samples in this_step:
            for i, f, o in untracked:
                from_peer[i] = holders.held(f, o, seq)
            source, peer = fetched[~from_peer], fetched[from_peer]
            rows[n].append((len(source), sizes[source].sum(), len(peer), sizes[peer].sum(), len(local),
                            sizes[local].sum(), samples))
    demand = []
    for n in range(tracked):
        cols = np.array(rows[n], dtype=np.int64).reshape(-1, 7).T
        demand.append(NodeDemand(n, *cols))
    return Demand(nodes, ranks_per_node, np.array(epochs, dtype=np.int64), demand)

