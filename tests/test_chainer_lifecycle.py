"""StagingIterator's life as Chainer's iterators live it: malformed orders are
errors at the call that made them (never a hang), an iterator dropped without
finalize() ends its processes, it pickles at any point, and a stalled
minibatch issues MultiprocessIterator.TimeoutWarning."""

import copy
import gc
import json
import os
import pickle
import threading
import warnings
import weakref

import numpy as np
import pytest

from conftest import child_pids, live_children, same_batch
from exit_check import run_to_exit

chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
chainer = chainer_front._chainer
StagingIterator = chainer_front.StagingIterator
HELPERS = os.path.join(os.path.dirname(__file__), "helpers")


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


@pytest.mark.parametrize("batch_size,before_error", [(16, 6), (20, 4), (25, 3)])
def test_an_order_of_another_length_is_chainers_error_at_the_same_call(cfg, examples, batch_size, before_error):
    # 16 crosses the end of the first epoch; 20 and 25 reach it exactly, and Chainer draws the next order there.
    theirs = chainer.iterators.SerialIterator(examples, batch_size, order_sampler=Shrinking())
    expected_count, expected = batches_until_error(theirs)
    assert isinstance(expected, ValueError) and expected_count == before_error
    with StagingIterator(cfg, batch_size, order_sampler=Shrinking()) as ours:
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


# Dropping without finalize() (issue point 3) -------------------------------

@pytest.mark.parametrize("args", [{}, {"repeat": False}, {"shuffle": False},
                                  {"order_sampler": chainer.iterators.ShuffleOrderSampler(np.random.RandomState(0))}],
                         ids=["shuffle", "no-repeat", "no-shuffle", "sampler"])
def test_an_iterator_dropped_without_finalize_ends_its_processes(cfg, args):
    before = child_pids()
    it = StagingIterator(cfg, 8, **args)
    it.next()
    mine = live_children(child_pids() - before)
    assert mine, "the iterator runs prefetchers and readers"
    collected = weakref.ref(it)
    del it
    gc.collect()
    assert collected() is None
    assert not live_children(mine)


@pytest.mark.parametrize("ending", ["alive", "dropped"])
def test_an_iterator_at_interpreter_exit_ends_quietly(dataset, tmp_path, ending):
    root, _ = dataset
    config = {"dataset": {"source": root, "manifest": "manifest.tsv"},
              "staging": {"local_dir": str(tmp_path / "local")}, "reader": {"workers": 2}}
    rc, out, err, left = run_to_exit(
        "import gc, json\n"
        "from iterators.chainer import StagingIterator\n"
        "it = StagingIterator(json.loads(sys.argv[1]), 8)\n"
        "it.next()\n"
        "report_children()\n"
        "if sys.argv[2] == 'dropped':\n"
        "    del it\n"
        "    gc.collect()\n", json.dumps(config), ending)
    assert rc == 0, err
    assert "CHILDREN" in out and not err.strip(), err  # e.g. OSError: Bad file descriptor from __del__
    assert not left, "workers outlived the interpreter"


# Pickling (issue point 4) --------------------------------------------------

MODES = {
    "shuffle": lambda: {},
    "no-shuffle": lambda: {"shuffle": False},
    "sampler": lambda: {"order_sampler": chainer.iterators.ShuffleOrderSampler(np.random.RandomState(7))},
}


@pytest.mark.parametrize("taken", [0, 5, 13])  # 13 minibatches of 8: in epoch 1
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_pickled_iterator_continues_with_the_same_minibatches(cfg, mode, taken):
    it = StagingIterator(cfg, 8, **MODES[mode]())
    clone = None
    try:
        for _ in range(taken):
            it.next()
        clone = pickle.loads(pickle.dumps(it))
        assert state(clone) == state(it)
        for step in range(20):  # across the next epoch boundary
            assert same_batch(clone.next(), it.next()), f"minibatch {step} after unpickling"
            assert state(clone) == state(it)
    finally:
        it.finalize()
        if clone is not None:
            clone.finalize()


def test_a_copy_is_an_independent_iterator_at_the_same_position(cfg):
    sampler = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(7))
    with StagingIterator(cfg, 8, order_sampler=sampler) as it:
        for _ in range(5):
            it.next()
        other = copy.copy(it)
        with other:
            ahead = [other.next() for _ in range(20)]
            assert all(same_batch(it.next(), batch) for batch in ahead)


def test_a_copy_with_a_lambda_sampler_works_as_chainers_does(cfg, examples):
    # Chainer's iterators copy whatever callable samples their order; a lambda cannot be pickled.
    draw = np.random.RandomState(3)
    theirs = copy.copy(chainer.iterators.SerialIterator(examples, 8, order_sampler=lambda o, p: draw.permutation(len(o))))
    assert theirs.next()
    with StagingIterator(cfg, 8, order_sampler=lambda order, position: np.random.permutation(len(order))) as it:
        it.next()
        other = copy.copy(it)
        with other:
            assert other.current_position == it.current_position == 8
            assert len(other.next()) == 8 and len(it.next()) == 8


class SlowImages(chainer.datasets.LabeledImageDataset):
    """Chainer's own image dataset whose ``get_example`` stalls (a slow decode), for ``dataset_timeout``."""

    def get_example(self, i):
        import time
        time.sleep(0.5)  # stands in for a stalled decode, not a wait for an event
        return super().get_example(i)


def test_a_dataset_whose_get_example_stalls_warns_as_multiprocess_iterator_does(tmp_path):
    from PIL import Image

    pairs, images = [], tmp_path / "images"
    images.mkdir()
    for i in range(4):
        Image.fromarray(np.full((6, 6, 3), i * 40, np.uint8)).save(images / f"{i}.png")
        pairs.append((f"{i}.png", i))
    dataset = SlowImages(pairs, str(images))
    with StagingIterator(dataset, 4, shuffle=False, dataset_timeout=0.1, n_processes=1,
                         config={"staging": {"local_dir": str(tmp_path / "local")}}) as it:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batch = it.next()
    assert [int(label) for _, label in batch] == [0, 1, 2, 3]
    assert [w for w in caught if issubclass(w.category, chainer.iterators.MultiprocessIterator.TimeoutWarning)]


# TimeoutWarning (issue point 6) --------------------------------------------

@pytest.fixture
def gate(monkeypatch):
    monkeypatch.syspath_prepend(HELPERS)
    import gate as module

    module.GATE.clear()
    # Never leave readers waiting, whatever the test does.
    safety = threading.Timer(60, module.GATE.set)
    safety.start()
    yield module.GATE
    safety.cancel()
    module.GATE.set()


def test_timeout_warning_is_multiprocess_iterators():
    assert StagingIterator.TimeoutWarning is chainer.iterators.MultiprocessIterator.TimeoutWarning


def test_a_stalled_minibatch_warns_in_the_consumers_thread_and_is_still_delivered(cfg, examples, gate):
    stalled = cfg.replace(dataset={"loader": "gate:npy_after_gate"})
    with StagingIterator(stalled, 8, shuffle=False, dataset_timeout=0.05) as it:
        with warnings.catch_warnings():
            warnings.simplefilter("error", chainer.iterators.MultiprocessIterator.TimeoutWarning)
            with pytest.raises(StagingIterator.TimeoutWarning, match="Stalled dataset"):
                it.next()
        assert it.current_position == 0
        gate.set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StagingIterator.TimeoutWarning)  # 0.05 s is short on a busy machine
            assert same_batch(it.next(), examples[:8])
            assert same_batch(it.next(), examples[8:16])


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_no_warning_without_a_timeout_or_within_it(cfg, examples, gate, timeout):
    stalled = cfg.replace(dataset={"loader": "gate:npy_after_gate"})
    with StagingIterator(stalled, 8, shuffle=False, dataset_timeout=timeout) as it:
        opener = threading.Timer(0.3, gate.set)  # a stall of 0.3 s
        opener.start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert same_batch(it.next(), examples[:8])
        opener.join()
    assert not [w for w in caught if issubclass(w.category, chainer.iterators.MultiprocessIterator.TimeoutWarning)]
