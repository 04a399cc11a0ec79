"""A rank's share from positions alone: the same plan as the materialised split, at any scale."""

import tracemalloc

import numpy as np
import pytest

from stager import plan
from stager.config import PlanConfig
from stager.plan import shuffles


def materialised(n, cfg, epoch, rank, size, start=0):
    """The reference: the whole epoch drawn, fitted and cut (the plan before positions)."""
    order = plan.epoch_order(n, cfg.seed, epoch, cfg.shuffle, size, cfg.remainder, start, cfg.shuffle_algorithm)
    return plan.rank_share(order, cfg.batch_size, cfg.drop_last, rank, size, cfg.split)


@pytest.mark.parametrize("algorithm,split", [("pcg64", "contiguous"), ("feistel", "contiguous"),
                                             ("feistel", "strided"), ("torch", "strided")])
@pytest.mark.parametrize("n,batch,size,drop_last,remainder,start", [
    (100, 4, 1, False, "pad", 0), (103, 4, 4, False, "pad", 0), (103, 4, 4, True, "pad", 0),
    (103, 3, 4, False, "drop", 0), (103, 3, 4, True, "drop", 24), (97, 5, 3, False, "pad", 45),
    (10, 4, 16, False, "pad", 0), (1000, 7, 13, False, "pad", 7 * 13 * 5 + 2)])
def test_the_per_position_share_is_the_materialised_split(algorithm, split, n, batch, size, drop_last, remainder,
                                                          start):
    cfg = PlanConfig(batch_size=batch, epochs=2, seed=3, drop_last=drop_last, remainder=remainder,
                     shuffle_algorithm=algorithm, split=split)
    for rank in range(size):
        got = list(plan.iterate(n, cfg, start_epoch=1, start_sample=start, rank=rank, size=size))
        first_epoch = [m for m in got if m.epoch == 1]
        expected = materialised(n, cfg, 1, rank, size, start)
        assert len(first_epoch) == len(expected)
        for m, want in zip(first_epoch, expected):
            assert np.array_equal(m.indices, want)
        assert [m.step for m in first_epoch] == list(range(start // (batch * size),
                                                          start // (batch * size) + len(expected)))
        assert first_epoch[-1].last and not any(m.last for m in first_epoch[:-1])


def test_a_small_block_gives_the_same_minibatches(monkeypatch):
    cfg = PlanConfig(batch_size=5, epochs=1, seed=1, shuffle_algorithm="feistel")
    whole = list(plan.iterate(997, cfg, rank=2, size=3))
    monkeypatch.setattr(plan.shares, "BLOCK", 7)  # a block of one minibatch: the seams between blocks
    assert list(plan.iterate(997, cfg, rank=2, size=3)) == whole


@pytest.mark.parametrize("n,remainder", [(10**6, "pad"), (10**6 + 337, "pad"), (10**6 + 337, "drop")])
def test_every_rank_of_a_thousand_together_read_the_epoch_exactly_once(n, remainder):
    size = 1000
    cfg = PlanConfig(batch_size=32, epochs=1, seed=11, remainder=remainder, shuffle_algorithm="feistel")
    reads = np.zeros(n, np.int64)
    steps = set()
    for rank in range(size):
        batches = list(plan.iterate(n, cfg, rank=rank, size=size))
        steps.add(len(batches))
        np.add.at(reads, np.concatenate([m.indices for m in batches]), 1)
    assert len(steps) == 1  # every rank takes as many steps
    extra = n % size
    if extra == 0:
        assert (reads == 1).all()
    elif remainder == "pad":  # the permutation's first samples are read a second time, nothing else
        first = shuffles.at(n, 11, 0, np.arange(size - extra), "feistel")
        twice = np.flatnonzero(reads == 2)
        assert (reads >= 1).all() and reads.max() == 2 and np.array_equal(np.sort(first), twice)
    else:  # the permutation's last samples are left out, nothing else
        last = shuffles.at(n, 11, 0, np.arange(n - extra, n), "feistel")
        assert np.array_equal(np.sort(last), np.flatnonzero(reads == 0)) and reads.max() == 1


def test_a_billion_samples_on_ten_thousand_ranks_by_sampling():
    n, size = 10**9, 10_000
    cfg = PlanConfig(batch_size=32, epochs=1, seed=5, shuffle_algorithm="feistel")
    spec = plan.PlanSpec.from_config(n, cfg, size)
    ranks = [0, 1, 4_999, 9_998, 9_999]
    tracemalloc.start()
    shares = {r: list(plan.iterate(n, cfg, rank=r, size=size)) for r in ranks[:1]}
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20  # one rank's epoch: its share only, not the permutation
    shares.update({r: list(plan.iterate(n, cfg, rank=r, size=size)) for r in ranks[1:]})
    span = 32 * size
    for r, batches in shares.items():
        indices = np.concatenate([m.indices for m in batches])
        assert len(indices) == n // size
        # The inverse puts every index back at exactly the positions this rank reads: no other rank has them.
        positions = shuffles.position_of(n, 5, 0, indices, "feistel")
        expected = plan.shares.ranges(np.arange(len(batches)) * span + r * 32, np.full(len(batches), 32))
        assert np.array_equal(positions, expected)
    # Any sample, asked where it is read, is found in that rank's minibatch of that step.
    for i in np.random.default_rng(0).integers(0, n, 20):
        where = plan.read_at(spec, 0, [i])
        step, rank = int(where.step[0]), int(where.rank[0])
        m = next(b for s, b in enumerate(plan.iterate(n, cfg, rank=rank, size=size)) if s == step)
        assert i in m.indices


@pytest.mark.parametrize("algorithm,split", [("pcg64", "contiguous"), ("feistel", "contiguous"),
                                             ("feistel", "strided"), ("torch", "strided")])
@pytest.mark.parametrize("n,batch,size,drop_last,remainder,start", [
    (103, 4, 4, False, "pad", 0), (103, 4, 4, True, "pad", 16), (103, 3, 4, False, "drop", 24),
    (10, 4, 16, False, "pad", 0), (100, 5, 3, True, "pad", 31)])
def test_read_at_inverts_the_plan(algorithm, split, n, batch, size, drop_last, remainder, start):
    cfg = PlanConfig(batch_size=batch, epochs=3, seed=9, drop_last=drop_last, remainder=remainder,
                     shuffle_algorithm=algorithm, split=split)
    begin = plan.Position(1, start)
    spec = plan.PlanSpec.from_config(n, cfg, size, begin)
    first = {}
    for rank in range(size):
        for m in spec.minibatches(rank):
            for i in m.indices.tolist():
                key = (m.epoch, i)
                first[key] = min(first.get(key, (m.step, rank)), (m.step, rank))
    for epoch in range(4):
        reads = plan.read_at(spec, epoch, np.arange(n))
        got = {(epoch, i): (int(s), int(r)) for i, (s, r) in enumerate(zip(reads.step, reads.rank)) if s >= 0}
        assert got == {k: v for k, v in first.items() if k[0] == epoch}


@pytest.mark.parametrize("algorithm,split", [("pcg64", "contiguous"), ("feistel", "strided"), ("torch", "strided")])
def test_next_uses_is_what_the_node_reads_over_the_horizon(algorithm, split):
    n, size, batch = 211, 6, 4
    cfg = PlanConfig(batch_size=batch, epochs=0, seed=2, shuffle_algorithm=algorithm, split=split)
    spec = plan.PlanSpec.from_config(n, cfg, size)
    node, position, horizon = [2, 3], plan.Position(0, 5 * batch * size), 12  # crosses into epoch 1
    first = {}
    for rank in node:
        batches = plan.iterate(n, cfg, position.epoch, position.consumed, rank, size)
        for distance, m in zip(range(horizon), batches):
            for i in m.indices.tolist():
                first[i] = min(first.get(i, distance), distance)
    indices, distance = plan.next_uses(spec, node, position, horizon)
    assert dict(zip(indices.tolist(), distance.tolist())) == first
    assert distance.max() == horizon - 1 and np.all(np.diff(indices) > 0)
