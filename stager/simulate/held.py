"""Whether an untracked node still has a file it holds for the job: estimated from the tracked nodes.

``demand.node_demand`` replays only its tracked nodes; the others are
exchangeable with them. ``HeldShare`` (holders that read a file last,
``LatestReaders``) and ``OwnersHeld`` (first-epoch owners, ``FirstReaders``)
estimate what an untracked holder still has from what the tracked ones had.
"""

import numpy as np

from ..cache import ABSENT


class OwnersHeld:
    """Whether a file's owner still holds it, for owners that are tracked (exactly) or not (estimated)."""

    def __init__(self, owner, replays):
        self.owner, self.replays = owner, replays
        self.gone_share = 0.0
        files = len(owner)
        order = np.lexsort((np.arange(files), owner))  # by owner, then by index
        counts = np.bincount(owner[owner >= 0], minlength=max(int(owner.max()) + 1, 1)) if files else np.zeros(1, int)
        starts = np.concatenate([[0], np.cumsum(counts)])
        rank = np.empty(files, dtype=np.float64)
        valid = order[owner[order] >= 0]
        pos = np.arange(len(valid)) - starts[owner[valid]]
        rank[valid] = (pos + 0.5) / counts[owner[valid]]  # place among its owner's files, by index, in (0, 1)
        self.place = rank

    def update(self):
        """The share of their owned files that the tracked nodes have dropped by now."""
        owned = gone = 0
        for node, replay in self.replays.items():
            cache = replay.cache
            mine = self.owner == node
            owned += int(mine.sum())
            gone += int((mine & (cache.admitted_at > 0) & (cache.state == ABSENT)).sum())
        self.gone_share = gone / owned if owned else 0.0

    def held(self, files):
        """Per file, whether its owner holds it (or will: it has not staged it yet)."""
        out = np.empty(len(files), dtype=bool)
        for i, f in enumerate(files.tolist()):
            replay = self.replays.get(int(self.owner[f]))
            if replay is None:
                out[i] = self.place[f] < 1.0 - self.gone_share
            else:
                cache = replay.cache
                out[i] = cache.state[f] != ABSENT or cache.admitted_at[f] == 0
        return out


class HeldShare:
    """Whether an untracked node still has a file it holds for the job (``LatestReaders``), estimated.

    Nodes are exchangeable, so the untracked holders keep what the tracked
    ones keep. What a holder still has when asked depends on how long ago it
    read the file: the clairvoyant policy keeps what the job reads again
    soonest, so a file asked for two steps after its holder read it is
    likelier there than one asked for an epoch after. So every ask of a
    tracked holder (by a tracked node, or handed on to an untracked one) is
    counted by that age (quarter octaves of steps), with whether the holder
    had the file; the share at each age stands for every holder's, and a
    fixed pseudo-random place per file says which files that share is. (One
    share for all ages, from the files the tracked nodes hold, put 1,024
    nodes at a quarter of their share below the job-wide optimum.)

    The share at an age changes within an epoch: early in one, a holder
    still has much of what it read late in the last, and less as the
    epoch goes on. So each step's asks weigh ``1 / RECENT`` times the
    step before's: counted over the whole run, the early asks held the
    share up, and 1,024 nodes of 32 steps an epoch at a quarter of their
    share read 19% less than the optimum in their second epoch.

    Args:
        rules: Per tracked node, its ``LatestReaders``.
        files: Files in the catalog.
    """

    BINS = 4  # age bins per octave of steps
    RECENT = 0.5  # weight of a step's asks in the next step's share

    def __init__(self, rules, files):
        self.rule = rules[0]
        self.place = (np.arange(files) * 0.6180339887498949) % 1.0
        self.asks = np.zeros(1)  # per age bin: asks of tracked holders, recent steps weighing more
        self.hits = np.zeros(1)  # ... that found the file there
        self.share = np.ones(1)

    def _age_bin(self, file, holder, seq):
        """The bin of the steps since ``holder`` read ``file`` before ``seq`` (0: it has not)."""
        keys, nodes = self.rule.keys, self.rule.nodes
        pos = int(np.searchsorted(keys, (file << 32) | (seq + 1))) - 1
        while pos >= 0 and keys[pos] >> 32 == file and nodes[pos] != holder:
            pos -= 1
        if pos < 0 or keys[pos] >> 32 != file:
            return 0
        return int(np.log2(max(seq - int(keys[pos] & 0xFFFFFFFF), 0) + 1.0) * self.BINS)

    def asked(self, file, holder, seq, held):
        """Tracked ``holder`` was asked for ``file`` at step ``seq``; ``held``: it had it (or will)."""
        b = self._age_bin(file, holder, seq)
        if b >= len(self.asks):
            grow = np.zeros(b + 1 - len(self.asks))
            self.asks, self.hits = np.concatenate([self.asks, grow]), np.concatenate([self.hits, grow])
        self.asks[b] += 1
        self.hits[b] += bool(held)

    def update(self):
        # An age no tracked holder was asked at yet takes the share of the nearest younger one that was.
        share, last = np.ones(len(self.asks)), 1.0
        for b, (n, h) in enumerate(zip(self.asks.tolist(), self.hits.tolist())):
            last = share[b] = h / n if n else last
        self.share = share
        self.asks *= self.RECENT
        self.hits *= self.RECENT

    def held(self, file, holder, seq):
        """Whether untracked ``holder`` still has ``file`` for step ``seq``."""
        b = self._age_bin(file, holder, seq)
        return bool(self.place[file] < self.share[min(b, len(self.share) - 1)])
