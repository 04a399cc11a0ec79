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
    resumed = list(plan.iterate(10, cfg, start_epoch=1, start_step=2))
    assert resumed == full[5:]


def test_iterate_repeats_without_end_when_epochs_is_zero():
    it = plan.iterate(10, PlanConfig(batch_size=5, epochs=0))
    taken = [next(it) for _ in range(50)]
    assert taken[-1].epoch == 24 and taken[-1].step == 1


def test_epoch_with_no_full_minibatch_is_an_error():
    with pytest.raises(ValueError, match="no minibatch"):
        next(plan.iterate(3, PlanConfig(batch_size=4, drop_last=True)))
