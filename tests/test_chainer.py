"""The Chainer front end against real Chainer 7.8.1: the same protocol as
MultiprocessIterator, batch by batch, and exact resume from a snapshot."""

import os

import numpy as np
import pytest

from conftest import load_catalog, same_batch

chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
chainer = chainer_front._chainer
StagingIterator = chainer_front.StagingIterator

ATTRS = ("epoch", "epoch_detail", "previous_epoch_detail", "is_new_epoch", "current_position", "batch_size",
         "repeat")


def compare(ours, theirs, steps):
    for attr in ATTRS:
        assert getattr(ours, attr) == getattr(theirs, attr), f"before any batch: {attr}"
    count = 0
    for _ in range(steps):
        try:
            mine = ours.next()
        except StopIteration:
            with pytest.raises(StopIteration):
                theirs.next()
            break
        reference = theirs.next()
        count += 1
        assert same_batch(mine, reference), f"batch {count} differs"
        for attr in ATTRS:
            assert getattr(ours, attr) == getattr(theirs, attr), f"after batch {count}: {attr}"
    return count


@pytest.mark.parametrize("repeat", [True, False])
@pytest.mark.parametrize("batch_size", [7, 10])
def test_protocol_matches_multiprocess_iterator_batch_by_batch(cfg, examples, repeat, batch_size):
    sampler = chainer.iterators.ShuffleOrderSampler
    ours = StagingIterator(cfg, batch_size, repeat=repeat,
                           order_sampler=sampler(np.random.RandomState(3)))
    theirs = chainer.iterators.MultiprocessIterator(examples, batch_size, repeat=repeat, n_processes=2,
                                                   order_sampler=sampler(np.random.RandomState(3)))
    try:
        count = compare(ours, theirs, 35)
    finally:
        ours.finalize()
        theirs.finalize()
    assert count == (35 if repeat else -(-100 // batch_size))
    ours.finalize()  # safe twice


def test_unshuffled_order_and_reset_match(cfg, examples):
    ours = StagingIterator(cfg, 8, shuffle=False)
    theirs = chainer.iterators.MultiprocessIterator(examples, 8, shuffle=False, n_processes=2)
    try:
        compare(ours, theirs, 15)
        ours.reset()
        theirs.reset()
        compare(ours, theirs, 3)
    finally:
        ours.finalize()
        theirs.finalize()


def test_default_shuffle_reports_the_same_protocol(cfg, examples):
    ours = StagingIterator(cfg, 16)
    theirs = chainer.iterators.MultiprocessIterator(examples, 16, n_processes=2)
    try:
        for _ in range(20):
            mine, reference = ours.next(), theirs.next()
            assert len(mine) == len(reference)
            for attr in ATTRS:
                assert getattr(ours, attr) == getattr(theirs, attr)
    finally:
        ours.finalize()
        theirs.finalize()


def test_shuffle_with_order_sampler_raises_chainers_error(cfg, examples):
    sampler = chainer.iterators.ShuffleOrderSampler()
    with pytest.raises(ValueError) as ours:
        StagingIterator(cfg, 4, shuffle=True, order_sampler=sampler)
    with pytest.raises(ValueError) as theirs:
        chainer.iterators.MultiprocessIterator(examples, 4, shuffle=True, order_sampler=sampler)
    assert str(ours.value) == str(theirs.value)


def test_concat_examples_works_on_its_minibatches(cfg):
    with StagingIterator(cfg, 5) as it:
        x, t = chainer.dataset.concat_examples(it.next())
    assert x.shape == (5, 5, 256, 3) and t.shape == (5,)


def test_serialize_mid_epoch_resumes_the_remaining_sequence(cfg, tmp_path):
    with StagingIterator(cfg, 8, shuffle=False) as it:
        full = [it.next() for _ in range(20)]
    with StagingIterator(cfg, 8, shuffle=False) as it:
        head = [it.next() for _ in range(9)]
        chainer.serializers.save_npz(str(tmp_path / "it.npz"), it)
        state = (it.epoch, it.current_position, it.is_new_epoch, it.previous_epoch_detail)
    with StagingIterator(cfg, 8, shuffle=False) as it:
        chainer.serializers.load_npz(str(tmp_path / "it.npz"), it)
        assert (it.epoch, it.current_position, it.is_new_epoch, it.previous_epoch_detail) == state
        tail = [it.next() for _ in range(11)]
    assert all(same_batch(a, b) for a, b in zip(head + tail, full))


class Recorder:
    """A converter that remembers every batch it is given."""

    def __init__(self):
        self.batches = []

    def __call__(self, batch, device=None):
        self.batches.append(batch)
        x, t = chainer.dataset.concat_examples(batch)
        return x.reshape(len(x), -1).astype(np.float32) / 255.0, t.astype(np.int32)


def make_trainer(cfg, out, stop, snapshot_at=None):
    chainer.global_config.train = True
    np.random.seed(0)
    model = chainer.links.Classifier(chainer.links.Linear(5 * 256 * 3, 5, initialW=chainer.initializers.Zero()))
    optimizer = chainer.optimizers.SGD(lr=0.01)
    optimizer.setup(model)
    iterator = StagingIterator(cfg, 8)
    recorder = Recorder()
    updater = chainer.training.updaters.StandardUpdater(iterator, optimizer, converter=recorder)
    trainer = chainer.training.Trainer(updater, (stop, "iteration"), out=str(out))
    if snapshot_at:
        trainer.extend(chainer.training.extensions.snapshot(filename="snap"), trigger=(snapshot_at, "iteration"))
    return trainer, iterator, recorder, model


def test_trainer_snapshot_mid_epoch_resumes_exactly(cfg, tmp_path):
    trainer, it, full, model_full = make_trainer(cfg, tmp_path / "a", 20)
    trainer.run()
    it.finalize()
    trainer, it, head, _ = make_trainer(cfg, tmp_path / "b", 9, snapshot_at=9)
    trainer.run()
    it.finalize()
    trainer, it, tail, model = make_trainer(cfg, tmp_path / "c", 20)
    chainer.serializers.load_npz(str(tmp_path / "b" / "snap"), trainer)
    assert trainer.updater.iteration == 9 and it.epoch == 0 and it.current_position == 72
    trainer.run()
    it.finalize()
    assert len(head.batches) == 9 and len(tail.batches) == 11
    assert all(same_batch(a, b) for a, b in zip(head.batches + tail.batches, full.batches))
    assert np.allclose(model.predictor.W.array, model_full.predictor.W.array)


def test_a_catalog_is_accepted_as_the_dataset(cfg, examples):
    catalog = load_catalog(cfg)
    with StagingIterator(catalog, 10, repeat=False, shuffle=False) as it:
        batches = list(it)
    flat = [x for batch in batches for x in batch]
    assert len(batches) == 10 and all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(flat, examples))


def test_an_error_is_raised_again_by_the_next_call(cfg, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "helpers"))
    from stager.errors import StageError

    with StagingIterator(cfg.replace(dataset={"loader": "faults:fail_on_class_2"}), 10) as it:
        for _ in range(2):
            with pytest.raises(StageError, match="unreadable sample"):
                while True:
                    it.next()
