"""StagingIterator's life as Chainer's iterators live it: malformed orders are
errors at the call that made them (never a hang)."""

import os
import threading

import numpy as np
import pytest

from conftest import load_catalog, make_config

chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
chainer = chainer_front._chainer
StagingIterator = chainer_front.StagingIterator


@pytest.fixture
def cfg(slow_source, tmp_path):
    return make_config(slow_source, tmp_path / "local", reader={"workers": 2})


@pytest.fixture
def examples(cfg):
    catalog = load_catalog(cfg)
    return [(np.load(os.path.join(catalog.root, catalog.path(i))), catalog.label(i)) for i in range(len(catalog))]


def same_batch(a, b):
    return len(a) == len(b) and all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))


def state(it):
    return (it.epoch, it.current_position, it.is_new_epoch, it.previous_epoch_detail, it.epoch_detail)


def within(seconds, fn):
    """Returns ``fn()``, run on a thread; fails if it has not returned after ``seconds`` (a hang)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again below
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer after {seconds} s: the iterator hangs"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def batches_until_error(it, limit=50):
    """(minibatches delivered before the first exception, that exception)."""
    for count in range(limit):
        try:
            it.next()
        except Exception as exc:  # noqa: BLE001 - compared by the caller
            return count, exc
    return limit, None


# Orders (issue point 2) ----------------------------------------------------

class Shrinking:
    """Returns a permutation one epoch, a shorter one the next: Chainer refuses the second."""

    def __init__(self):
        self.calls = 0

    def __call__(self, current_order, current_position):
        self.calls += 1
        return np.random.RandomState(self.calls).permutation(100 if self.calls == 1 else 90)


def test_an_order_of_another_length_is_chainers_error_at_the_same_call(cfg, examples):
    theirs = chainer.iterators.SerialIterator(examples, 16, order_sampler=Shrinking())
    expected_count, expected = batches_until_error(theirs)
    assert isinstance(expected, ValueError) and expected_count == 6
    with StagingIterator(cfg, 16, order_sampler=Shrinking()) as ours:
        count, error = within(60, lambda: batches_until_error(ours))
        assert count == expected_count and type(error) is ValueError
        assert str(expected) in str(error)
        # As in Chainer, asking again asks the sampler again, and fails again.
        assert isinstance(within(60, lambda: batches_until_error(ours, 1))[1], ValueError)
        assert ours.epoch == theirs.epoch and ours.current_position == theirs.current_position


class Constant:
    """Always 60 of the 100 examples, reshuffled: Chainer accepts a constant length."""

    def __init__(self):
        self.random = np.random.RandomState(4)

    def __call__(self, current_order, current_position):
        return self.random.permutation(100)[:60]


def test_a_constant_order_length_other_than_the_dataset_is_accepted_as_by_chainer(cfg, examples):
    theirs = chainer.iterators.SerialIterator(examples, 16, order_sampler=Constant())
    with StagingIterator(cfg, 16, order_sampler=Constant()) as ours:
        for step in range(12):  # three epochs of 60
            assert same_batch(within(60, ours.next), theirs.next()), f"batch {step}"
            assert state(ours) == state(theirs)


MALFORMED = {
    "out of range": (lambda n: np.arange(n) + 1, ValueError),
    "negative": (lambda n: np.arange(n) - 1, ValueError),
    "float": (lambda n: np.arange(n) * 1.0, TypeError),
    "bool": (lambda n: np.ones(n, dtype=bool), TypeError),
    "2-D": (lambda n: np.arange(n).reshape(2, -1), ValueError),
    "empty": (lambda n: np.arange(0), ValueError),
}


class FailsLater:
    def __init__(self, bad, at_call):
        self.bad, self.at_call, self.calls = bad, at_call, 0

    def __call__(self, current_order, current_position):
        self.calls += 1
        n = len(current_order)
        return self.bad(n) if self.calls == self.at_call else np.random.RandomState(self.calls).permutation(n)


@pytest.mark.parametrize("bad", sorted(MALFORMED))
def test_a_malformed_first_order_is_an_error_at_construction(cfg, bad):
    make_order, error = MALFORMED[bad]
    with pytest.raises(error, match="order_sampler"):
        within(60, lambda: StagingIterator(cfg, 16, order_sampler=FailsLater(make_order, 1)))


@pytest.mark.parametrize("bad", sorted(MALFORMED))
def test_a_malformed_later_order_is_an_error_at_the_call_that_needs_it(cfg, bad):
    make_order, error = MALFORMED[bad]
    with StagingIterator(cfg, 16, order_sampler=FailsLater(make_order, 3)) as it:
        count, raised = within(60, lambda: batches_until_error(it))
    # Epoch 1 is read from minibatch 6 (96..112) on; epoch 2 from minibatch 12 (192..208).
    assert count == 12 and type(raised) is error and "order_sampler" in str(raised)


class Recording:
    """A shuffling sampler that records the current_position it is called with."""

    def __init__(self):
        self.random = np.random.RandomState(1)
        self.positions = []

    def __call__(self, current_order, current_position):
        self.positions.append(current_position)
        return self.random.permutation(len(current_order))


@pytest.mark.parametrize("batch_size,resume_at", [(7, None), (16, None), (150, None), (7, 5), (16, 9)])
def test_the_sampler_gets_chainers_arguments(cfg, examples, tmp_path, batch_size, resume_at):
    theirs = chainer.iterators.SerialIterator(examples, batch_size, order_sampler=Recording())
    with StagingIterator(cfg, batch_size, order_sampler=Recording()) as ours:
        if resume_at:
            for _ in range(resume_at):
                theirs.next()
            chainer.serializers.save_npz(str(tmp_path / "snap.npz"), theirs)
            theirs = chainer.iterators.SerialIterator(examples, batch_size, order_sampler=Recording())
            for it in (theirs, ours):
                chainer.serializers.load_npz(str(tmp_path / "snap.npz"), it)
        for step in range(12):
            assert same_batch(within(60, ours.next), theirs.next()), f"batch {step}"
            assert state(ours) == state(theirs)
        expected = theirs.order_sampler.positions
        assert ours.order_sampler.positions[:len(expected)] == expected
