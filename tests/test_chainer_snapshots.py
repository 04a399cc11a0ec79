"""Snapshots interchangeable with Chainer's own iterators, in both directions.

Every snapshot is written with ``chainer.serializers.save_npz`` by one of
SerialIterator, MultiprocessIterator and StagingIterator in the middle of an
epoch, and loaded with ``load_npz`` by another. After loading, the iterator
under test must deliver exactly the samples that Chainer's SerialIterator
delivers from the same snapshot until the end of that epoch (the orders of
later epochs are each iterator's own: Chainer's default shuffle draws them
from numpy's global generator).
"""


import numpy as np
import pytest


chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
chainer = chainer_front._chainer
StagingIterator = chainer_front.StagingIterator

BATCH = 7
STEPS = 17  # 119 examples: epoch 1, 19 examples into it


class WithReplacement:
    """A custom sampler whose orders are not permutations (Chainer accepts any indices)."""

    def __init__(self, seed):
        self.random = np.random.RandomState(seed)

    def __call__(self, current_order, current_position):
        return self.random.randint(0, len(current_order), size=len(current_order))


MODES = {
    "shuffle": lambda: {},
    "no-shuffle": lambda: {"shuffle": False},
    "sampler": lambda: {"order_sampler": chainer.iterators.ShuffleOrderSampler(np.random.RandomState(11))},
    "custom-sampler": lambda: {"order_sampler": WithReplacement(12)},
}


def make(kind, cfg, examples, mode, batch_size=BATCH):
    args = MODES[mode]()
    if kind == "serial":
        return chainer.iterators.SerialIterator(examples, batch_size, **args)
    if kind == "multiprocess":
        return chainer.iterators.MultiprocessIterator(examples, batch_size, n_processes=2, **args)
    return StagingIterator(cfg, batch_size, **args)


def write_snapshot(kind, cfg, examples, mode, path, steps=STEPS):
    it = make(kind, cfg, examples, mode)
    try:
        for _ in range(steps):
            it.next()
        chainer.serializers.save_npz(str(path), it)
    finally:
        it.finalize()


def state(it):
    return (it.epoch, it.current_position, it.is_new_epoch, it.previous_epoch_detail, it.epoch_detail)


def rest_of_epoch(it):
    """The samples an iterator delivers from its position to the end of its epoch."""
    samples = []
    epoch = it.epoch
    while it.epoch == epoch:
        samples.extend(it.next())
    # The last minibatch reaches into the next epoch by current_position samples.
    return samples[:len(samples) - it.current_position]


def same_samples(a, b):
    return len(a) == len(b) and all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))


PAIRS = [(w, r) for w in ("serial", "multiprocess", "staging") for r in ("serial", "multiprocess", "staging")
         if "staging" in (w, r)]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("writer,reader", PAIRS)
def test_a_snapshot_resumes_the_same_samples_across_iterators(cfg, examples, tmp_path, mode, writer, reader):
    if mode == "no-shuffle" and "multiprocess" in (writer, reader):
        # Chainer's MultiprocessIterator cannot serialize without an order at
        # all ('NoneType' object has no attribute 'copy'): nothing to match.
        pytest.skip("MultiprocessIterator(shuffle=False) cannot serialize")
    snap = tmp_path / "snap.npz"
    write_snapshot(writer, cfg, examples, mode, snap)
    reference = make("serial", cfg, examples, mode)
    chainer.serializers.load_npz(str(snap), reference)
    it = make(reader, cfg, examples, mode)
    try:
        chainer.serializers.load_npz(str(snap), it)
        assert state(it) == state(reference)
        assert it.epoch == 1 and it.current_position == STEPS * BATCH - 100
        expected = rest_of_epoch(reference)
        assert len(expected) == 100 - it.current_position
        assert same_samples(rest_of_epoch(it), expected)
    finally:
        it.finalize()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_snapshots_have_chainers_keys(cfg, examples, tmp_path, mode):
    keys = {}
    kinds = ("serial", "staging") if mode == "no-shuffle" else ("serial", "multiprocess", "staging")
    for kind in kinds:
        write_snapshot(kind, cfg, examples, mode, tmp_path / f"{kind}.npz", steps=3)
        with np.load(tmp_path / f"{kind}.npz") as f:
            keys[kind] = {k: (f[k].shape, f[k].dtype.kind) for k in f.files}
    assert all(k == keys["serial"] for k in keys.values()), keys
    assert ("order" in keys["serial"]) == (mode != "no-shuffle")


def rewrite(path, drop=(), rename=(), **arrays):
    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    for key in drop:
        del data[key]
    for old, new in rename:
        data[new] = data.pop(old)
    data.update(arrays)
    np.savez(path, **data)


@pytest.mark.parametrize("steps", [0, 1, 5, STEPS])
@pytest.mark.parametrize("writer", ["serial", "staging"])
def test_an_old_snapshot_without_previous_epoch_detail_is_estimated_as_chainer_does(cfg, examples, tmp_path,
                                                                                     steps, writer):
    snap = tmp_path / "snap.npz"
    write_snapshot(writer, cfg, examples, "shuffle", snap, steps=steps)
    rewrite(snap, drop=["previous_epoch_detail"])
    reference = make("serial", cfg, examples, "shuffle")
    chainer.serializers.load_npz(str(snap), reference)
    with StagingIterator(cfg, BATCH) as it:
        chainer.serializers.load_npz(str(snap), it)
        assert state(it) == state(reference)


@pytest.mark.parametrize("writer", ["serial", "staging"])
def test_an_old_snapshot_with_underscore_order_resumes_the_same_samples(cfg, examples, tmp_path, writer):
    snap = tmp_path / "snap.npz"
    write_snapshot(writer, cfg, examples, "shuffle", snap)
    rewrite(snap, rename=[("order", "_order")])
    reference = make("serial", cfg, examples, "shuffle")
    chainer.serializers.load_npz(str(snap), reference)
    with StagingIterator(cfg, BATCH) as it:
        chainer.serializers.load_npz(str(snap), it)
        assert same_samples(rest_of_epoch(it), rest_of_epoch(reference))


def test_a_snapshot_without_order_is_refused_by_a_shuffling_iterator_as_by_chainer(cfg, examples, tmp_path):
    snap = tmp_path / "snap.npz"
    write_snapshot("serial", cfg, examples, "no-shuffle", snap)
    with pytest.raises(KeyError):
        chainer.serializers.load_npz(str(snap), make("serial", cfg, examples, "shuffle"))
    with StagingIterator(cfg, BATCH) as it:
        with pytest.raises(KeyError, match="order"):
            chainer.serializers.load_npz(str(snap), it)


def test_a_snapshot_without_order_loads_with_ignore_names_keeping_stagers_order(cfg, tmp_path):
    # How a snapshot of a stager version that did not record the order resumes.
    snap = tmp_path / "snap.npz"
    with StagingIterator(cfg, BATCH) as it:
        full = [it.next() for _ in range(STEPS + 5)]
    write_snapshot("staging", cfg, None, "shuffle", snap)
    rewrite(snap, drop=["order"])
    with StagingIterator(cfg, BATCH) as it:
        chainer.serializers.load_npz(str(snap), it, ignore_names="order")
        assert all(same_samples(it.next(), batch) for batch in full[STEPS:])


BAD_ORDERS = {
    "short": (lambda n: np.random.RandomState(0).permutation(n)[:-1], ValueError, "100"),
    "out of range": (lambda n: np.arange(1, n + 1), ValueError, "outside"),
    "negative": (lambda n: np.arange(n) - 1, ValueError, "outside"),
    "float": (lambda n: np.arange(n, dtype=np.float64), TypeError, "dtype"),
    "2-D": (lambda n: np.arange(n).reshape(10, -1), ValueError, "1-D"),
    "repeats": (lambda n: np.arange(n) // 2 * 2, ValueError, "permutation"),
}


@pytest.mark.parametrize("bad", sorted(BAD_ORDERS))
def test_a_malformed_order_in_a_snapshot_is_an_error_at_load(cfg, examples, tmp_path, bad):
    make_order, error, words = BAD_ORDERS[bad]
    snap = tmp_path / "snap.npz"
    write_snapshot("serial", cfg, examples, "shuffle", snap, steps=3)
    rewrite(snap, order=make_order(100))
    with StagingIterator(cfg, BATCH) as it:
        with pytest.raises(error, match=words):
            chainer.serializers.load_npz(str(snap), it)


def test_a_sampler_snapshot_of_another_length_is_refused_as_by_chainer(cfg, examples, tmp_path):
    snap = tmp_path / "snap.npz"
    write_snapshot("serial", cfg, examples, "sampler", snap, steps=3)
    rewrite(snap, order=np.arange(50))
    with pytest.raises(ValueError):  # Chainer cannot copy it into its own order
        chainer.serializers.load_npz(str(snap), make("serial", cfg, examples, "sampler"))
    it = make("staging", cfg, examples, "sampler")
    with it, pytest.raises(ValueError, match="size of order"):
        chainer.serializers.load_npz(str(snap), it)


@pytest.mark.parametrize("position", [-1, 100, 1000])
def test_a_position_outside_the_epoch_is_an_error_at_load(cfg, examples, tmp_path, position):
    snap = tmp_path / "snap.npz"
    write_snapshot("staging", cfg, examples, "no-shuffle", snap, steps=3)
    rewrite(snap, current_position=np.array(position))
    with StagingIterator(cfg, BATCH, shuffle=False) as it:
        with pytest.raises(ValueError, match="outside"):
            chainer.serializers.load_npz(str(snap), it)
