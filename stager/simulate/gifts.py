"""Swaps in the replay: files a node short of room gives to the holders it asks (``engine.peers.swaps``).

The replay (``demand.node_demand``) gives a tracked node's dropped files to
the holders it takes from as the engine does (``give``, ``adopt``), and
asks for a file where it was given (``asked_of``). A file given to an
untracked node is estimated to be there by the share of the files given to
tracked holders that were still there when next read (``GivenShare``).
What untracked nodes would give tracked holders is left out: taken as what
their tracked twins dropped, it put the estimate 7% below replaying every
node (below the optimum) at half of each node's share; left out, 1.8% above.
"""

import numpy as np

from ..cache import ABSENT
from ..engine.peers.fetcher import MAX_HOPS
from ..engine.peers.ownership import NO_OWNER
from ..engine.peers.protocol import OFFER_MAX
from ..engine.peers.swaps import keep_given, stage_given


def asked_of(rules, n, files, owner):
    """The node each file is asked of: its holder, or where a tracked holder (or ``n`` itself) gave it.

    ``n``: the asking node, or None (an untracked one).

    Returns:
        ``(owner, given)``: ``given`` marks files given to an untracked
        node (whether it still has them is estimated).
    """
    gone = rules[n].moved[files] if n is not None else np.full(len(files), -1)
    given = gone >= len(rules)
    owner = np.where(gone >= 0, gone, owner)
    for i in np.flatnonzero((owner >= 0) & (owner < len(rules))).tolist():
        f, o = int(files[i]), int(owner[i])
        for _ in range(MAX_HOPS):
            to = int(rules[o].moved[f])
            if to < 0 or to == n:
                owner[i] = NO_OWNER if to == n else o
                break
            o = owner[i] = to
            if o >= len(rules):
                given[i] = True
                break
    return owner, given


class GivenShare:
    """The share of the files given to tracked holders that were still there when next read.

    Stands for what untracked nodes keep of what they are given, at a fixed
    pseudo-random place per file (1 until a gift to a tracked holder is
    due). A gift the holder had no room for counts as lost at once.
    """

    def __init__(self, files):
        self.place = (np.arange(files) * 0.7548776662466927) % 1.0
        self.asks = self.hits = 0
        self._due = {}  # step -> [(cache, file)]: gifts kept, to be looked at when next read

    def gave(self, cache, rule, file, kept):
        if not kept:
            self.asks += 1
            return
        self._due.setdefault(int(rule.given_until[file]), []).append((cache, file))

    def check(self, seq):
        """The gifts next read at ``seq``: still there?"""
        for cache, file in self._due.pop(seq, ()):
            self.asks += 1
            self.hits += bool(cache.state[file] != ABSENT)

    def held(self, file):
        return bool(self.place[file] < (self.hits / self.asks if self.asks else 1.0))


def adopt(cache, rule, files, kept_given):
    """A tracked holder keeps the files given to it where it has room that costs nothing sooner (``swaps.adopt``)."""
    absent = [g for g in files if cache.state[g] == ABSENT]
    for g in files:
        if cache.state[g] != ABSENT:
            rule.took(g)
    kept, victims = keep_given(cache, absent)
    for index in victims.tolist():
        cache.removed(index)
    for g in absent:
        if g in kept:
            stage_given(cache, g)
    for g in files:
        kept_given.gave(cache, rule, g, cache.state[g] != ABSENT)  # there before, or kept


def give(replays, rules, n, dropped, owner, sizes, kept_given):
    """Node ``n`` gives what it dropped for its step to the holders it asked (``swaps.pair``)."""
    pending = dropped[sizes[dropped] <= OFFER_MAX].tolist()
    for o in np.unique(owner[(owner >= 0) & (owner != n)]).tolist():
        count = int((owner == o).sum())
        take, pending = pending[:count], pending[count:]
        for g in take:
            rules[n].gave(g, o)
        if o in replays:  # an untracked holder: whether it keeps it is estimated (``asked_of``)
            adopt(replays[o].cache, rules[o], take, kept_given)
