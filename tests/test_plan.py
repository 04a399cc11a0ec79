import numpy as np
import pytest

from stager import plan
from stager.config import PlanConfig


def test_permutation_is_a_pure_function_of_seed_and_epoch():
    a = plan.permutation(1000, seed=7, epoch=3)
    assert np.array_equal(a, plan.permutation(1000, seed=7, epoch=3))
    assert sorted(a.tolist()) == list(range(1000))
    assert not np.array_equal(a, plan.permutation(1000, seed=7, epoch=4))
    assert not np.array_equal(a, plan.permutation(1000, seed=8, epoch=3))


def test_no_shuffle_reads_catalog_order():
    assert plan.permutation(5, seed=1, epoch=9, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n,bs,drop_last,expected_steps,last_size", [
    (100, 32, False, 4, 4), (100, 32, True, 3, 32), (96, 32, False, 3, 32), (96, 32, True, 3, 32)])
def test_epoch_minibatches_cover_the_epoch(n, bs, drop_last, expected_steps, last_size):
    batches = plan.epoch_minibatches(n, bs, seed=0, epoch=0, drop_last=drop_last)
    assert len(batches) == expected_steps == plan.steps_per_epoch(n, bs, drop_last)
    assert len(batches[-1]) == last_size
    flat = np.concatenate(batches)
    assert len(set(flat.tolist())) == len(flat)
    if not drop_last:
        assert sorted(flat.tolist()) == list(range(n))
    assert np.array_equal(flat, plan.permutation(n, 0, 0)[:len(flat)])


def test_iterate_spans_epochs_and_resumes_mid_epoch():
    cfg = PlanConfig(batch_size=4, epochs=3, seed=5)
    full = list(plan.iterate(10, cfg))
    assert [(m.epoch, m.step) for m in full] == [(e, s) for e in range(3) for s in range(3)]
    resumed = list(plan.iterate(10, cfg, start_epoch=1, start_sample=2 * 4))
    assert resumed == full[5:]
    assert [(m.end, m.last) for m in full[:3]] == [(4, False), (8, False), (10, True)]


@pytest.mark.parametrize("n,remainder", [(100, "pad"), (103, "pad"), (103, "drop"), (97, "pad")])
def test_resume_on_another_world_size_continues_the_global_order(n, remainder):
    cfg = PlanConfig(batch_size=3, epochs=1, seed=2, remainder=remainder)
    before = [list(plan.iterate(n, cfg, rank=r, size=4)) for r in range(4)]
    cut = 5  # every rank has done 5 steps when the job stops
    done = [i for step in range(cut) for r in range(4) for i in before[r][step].indices.tolist()]
    position = before[0][cut - 1].end
    assert position == len(done) == cut * 3 * 4
    after = [list(plan.iterate(n, cfg, start_sample=position, rank=r, size=2)) for r in range(2)]
    rest = [i for step in range(len(after[0])) for r in range(2) for i in after[r][step].indices.tolist()]
    order = plan.permutation(n, 2, 0).tolist()
    if remainder == "pad":
        assert done + rest[:n - len(done)] == order
    else:
        assert done + rest == order[:len(done + rest)]
    if remainder == "pad":
        assert sorted(set(done + rest)) == list(range(n))
        assert len(rest) - (n - len(done)) < 2  # the new world pads at most size - 1 samples
    assert after[0][-1].last and after[0][0].step == position // (3 * 2)


def test_iterate_repeats_without_end_when_epochs_is_zero():
    it = plan.iterate(10, PlanConfig(batch_size=5, epochs=0))
    taken = [next(it) for _ in range(50)]
    assert taken[-1].epoch == 24 and taken[-1].step == 1


def test_epoch_with_no_full_minibatch_is_an_error():
    with pytest.raises(ValueError, match="no minibatch"):
        next(plan.iterate(3, PlanConfig(batch_size=4, drop_last=True)))


def rank_epoch(n, bs, epoch, rank, size, remainder="pad", drop_last=False):
    return plan.epoch_minibatches(n, bs, seed=4, epoch=epoch, drop_last=drop_last, rank=rank, size=size,
                                  remainder=remainder)


@pytest.mark.parametrize("n,size", [(96, 4), (100, 4), (7, 3), (1000, 8)])
def test_ranks_split_each_epoch_with_equal_steps(n, size):
    per_rank = [rank_epoch(n, 5, 1, r, size) for r in range(size)]
    assert len({len(b) for b in per_rank}) == 1, "every rank must take the same number of steps"
    for step in range(len(per_rank[0])):
        assert len({len(b[step]) for b in per_rank}) == 1
    flat = np.concatenate([np.concatenate(b) for b in per_rank])
    counts = np.bincount(flat, minlength=n)
    assert counts.min() >= 1, "pad: every sample is read"
    assert counts.sum() == n + (-n) % size and counts.max() <= 2


@pytest.mark.parametrize("n,size", [(100, 4), (103, 4), (7, 3)])
def test_drop_remainder_reads_each_sample_at_most_once(n, size):
    flat = np.concatenate([np.concatenate(rank_epoch(n, 5, 0, r, size, remainder="drop")) for r in range(size)])
    assert len(flat) == n - n % size and len(set(flat.tolist())) == len(flat)


def test_rank_shares_interleave_global_minibatches():
    order = plan.permutation(40, seed=4, epoch=0)
    r0, r1 = rank_epoch(40, 5, 0, 0, 2), rank_epoch(40, 5, 0, 1, 2)
    assert np.array_equal(np.concatenate([r0[0], r1[0], r0[1], r1[1]]), order[:20])


def test_drop_last_drops_the_short_global_minibatch():
    batches = [rank_epoch(100, 8, 0, r, 4, drop_last=True) for r in range(4)]
    assert all(len(b) == 3 and all(len(x) == 8 for x in b) for b in batches)


def test_rank_outside_the_world_is_rejected():
    with pytest.raises(ValueError, match="rank 4 outside a world of size 4"):
        next(plan.iterate(10, PlanConfig(), rank=4, size=4))


def test_1024_ranks_of_a_1_28m_catalog_read_every_sample_once_per_epoch():
    n, size, bs = 1_281_024, 1024, 32  # ImageNet-1k scale, a multiple of 1,024 ranks
    for epoch in (0, 1):
        # Each rank computes the same order from (seed, epoch) alone; computed
        # once here to keep the test fast, then cut for every rank.
        order = plan.epoch_order(n, 4, epoch, size=size)
        seen = np.zeros(n, dtype=np.int32)
        steps = {len(plan.rank_share(order, bs, False, r, size)) for r in range(size)}
        for rank in range(size):
            np.add.at(seen, np.concatenate(plan.rank_share(order, bs, False, rank, size)), 1)
        assert steps == {plan.steps_per_epoch(n, bs, False, size)}
        assert seen.min() == 1 and seen.max() == 1
    for rank in (0, 1023):
        direct = plan.epoch_minibatches(n, bs, 4, 1, rank=rank, size=size)
        assert all(np.array_equal(a, b) for a, b in zip(direct, plan.rank_share(order, bs, False, rank, size)))


@pytest.mark.parametrize("n,batch,size,drop_last,remainder,start", [
    (100, 4, 4, False, "pad", 0), (103, 4, 4, True, "pad", 0), (103, 3, 4, False, "drop", 36), (97, 5, 3, False,
                                                                                                 "pad", 45)])
def test_every_rank_stands_at_the_same_global_position_after_each_step(n, batch, size, drop_last, remainder, start):
    # What makes a checkpoint taken by one rank (StagedLoader.state_dict, the
    # state file) hold for all: after its k-th step every rank is at the same
    # Position, so the ranks of a loop that steps together agree without talking.
    cfg = PlanConfig(batch_size=batch, epochs=2, seed=4, drop_last=drop_last, remainder=remainder)
    walks = []
    for rank in range(size):
        position, walk = plan.Position(0, start), []
        for m in plan.iterate(n, cfg, 0, start, rank=rank, size=size):
            position = position.after(m)
            walk.append(position)
        walks.append(walk)
    assert all(walk == walks[0] for walk in walks) and walks[0][-1] == plan.Position(2, 0)
