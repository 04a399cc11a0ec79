"""Epoch orders for the Chainer front end, kept apart from the iterator.

The coordinator thread of stager's pipeline walks the plan ahead of the
consumer and so asks for epoch orders from another thread. Everything it
needs lives in an ``OrderBook``, which holds no reference to the iterator:
an iterator dropped without ``finalize()`` can then be collected, and its
pipeline closed with it.

An order is validated where it is produced (the ``order_sampler`` call, or a
snapshot being loaded), so a malformed one is an error at that call instead
of a plan that never advances.
"""

import dataclasses
import pickle
import threading

import numpy

from stager import plan as planlib


def check_order(order, n, source, length=None, permutation=False):
    """Returns ``order`` as a fresh int64 array, or raises on a malformed one.

    Args:
        order: What the sampler returned or the snapshot held.
        n: Examples in the dataset; indices must lie in ``[0, n)``.
        source: Who produced it, for the message.
        length: Required length (that of the previous order), or None.
        permutation: Require each of ``0..n-1`` exactly once.

    Raises:
        TypeError: If the indices are not integers.
        ValueError: If it is not 1-D, empty, of another length than
            required, out of range, or not a permutation where one is required.
    """
    arr = numpy.asarray(order)
    if arr.ndim != 1:
        raise ValueError(f"{source} gave an order of shape {arr.shape}; an order is a 1-D array of dataset indices")
    if length is not None and len(arr) != length:
        # Chainer's own words first, so that code matching its message still works.
        raise ValueError(f"The size of order does not match the size of the previous order. ({source} gave "
                         f"{len(arr)} indices, the previous order has {length}.)")
    if len(arr) == 0:
        raise ValueError(f"{source} gave an empty order; an epoch needs at least one example")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{source} gave an order of dtype {arr.dtype}; an order holds integer dataset indices")
    low, high = arr.min(), arr.max()
    if low < 0 or high >= n:
        bad = low if low < 0 else high
        raise ValueError(f"{source} gave index {bad}, outside the dataset's {n} examples")
    if permutation:
        if len(arr) != n:
            raise ValueError(f"{source} has {len(arr)} indices; a shuffled epoch of this dataset has {n}")
        counts = numpy.bincount(arr, minlength=n)
        if (counts != 1).any():
            missing = int(numpy.flatnonzero(counts == 0)[0])
            raise ValueError(f"{source} is not a permutation of the dataset's {n} indices: index {missing} "
                             "is missing and another one repeats")
    return arr.astype(numpy.int64, copy=True)


class OrderBook:
    """Each epoch's order over the whole dataset, shared by the iterator and its plan.

    Without a sampler, epoch ``e``'s order is stager's seeded permutation (or
    ``0..n-1`` unshuffled) unless a snapshot supplied it. With a sampler,
    orders are drawn once per epoch, in epoch order, as Chainer draws them;
    only the current epoch's and later ones are kept.

    Args:
        n: Examples in the dataset.
        batch_size: Examples per minibatch on one rank.
        shuffle: Shuffle epochs (ignored with a sampler).
        sampler: Chainer order sampler, or None.
        seed: stager's plan seed, for the unsampled permutations.
        size: Number of ranks.
        remainder: ``plan.remainder``, for orders that ranks cannot share equally.
        algorithm: ``plan.shuffle_algorithm``, for the unsampled permutations.
    """

    def __init__(self, n, batch_size, shuffle, sampler, seed, size, remainder, algorithm="pcg64"):
        self.algorithm = algorithm
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.sampler = sampler
        self.seed = seed
        self.size = size
        self.remainder = remainder
        self.raw_length = n
        self.anchor = 0           # a stream position that minibatches start at
        self._orders = {}         # epoch -> order (sampled, or loaded from a snapshot)
        self._failures = {}       # epoch -> the error of its last draw, until the consumer is told
        self._lock = threading.Lock()

    @property
    def recorded(self):
        """Whether snapshots carry the order (Chainer's iterators write it when they shuffle)."""
        return self.sampler is not None or self.shuffle

    @property
    def length(self):
        """Samples per epoch once made divisible by the number of ranks."""
        extra = self.raw_length % self.size
        if extra == 0:
            return self.raw_length
        return self.raw_length + self.size - extra if self.remainder == "pad" else self.raw_length - extra

    def reset(self):
        """Back to epoch 0; a sampler draws it as Chainer's ``reset()`` does."""
        with self._lock:
            self._orders = {}
            self.anchor = 0
            if self.sampler is not None:
                first = check_order(self.sampler(numpy.arange(self.n), 0), self.n, "order_sampler")
                self._orders[0] = first
                self.raw_length = len(first)
            if self.length == 0:
                raise ValueError(f"an epoch of {self.raw_length} examples cannot be shared by {self.size} ranks")

    def load(self, epoch, order):
        """Takes a snapshot's order for ``epoch``; later epochs are drawn afresh."""
        source = "the snapshot's 'order'"
        if self.sampler is not None:
            # Chainer copies the saved order into its own, so the lengths must agree.
            order = check_order(order, self.n, source, length=self.raw_length)
        else:
            order = check_order(order, self.n, source, permutation=True)
        with self._lock:
            self._orders = {epoch: order}

    def raw(self, epoch):
        """Epoch ``epoch``'s order over the dataset, as a snapshot records it."""
        with self._lock:
            if self.sampler is None:
                if epoch in self._orders:
                    return self._orders[epoch]
                return planlib.permutation(self.n, self.seed, epoch, self.shuffle, algorithm=self.algorithm)
            known = [e for e in self._orders if e <= epoch]
            if not known:
                raise ValueError(f"no order is known for epoch {epoch} (the earliest kept is "
                                 f"{min(self._orders)}); the order_sampler draws epochs in sequence")
            at = max(known)
            while at < epoch:
                at += 1
                try:
                    drawn = check_order(self.sampler(self._orders[at - 1], self._sampler_position(at)), self.n,
                                        "order_sampler", length=self.raw_length)
                except Exception as exc:
                    self._failures[at] = exc
                    raise
                self._failures.pop(at, None)
                self._orders[at] = drawn
            return self._orders[epoch]

    def drawn(self, epoch):
        """Makes sure epoch ``epoch``'s order was drawn, raising the error of its draw if it failed.

        Chainer draws an epoch's order in the ``next()`` call whose minibatch
        reaches the end of the previous epoch; the consumer calls this there,
        so a bad order fails that call, whether the plan's thread drew it
        already (its error is raised, the sampler is not asked twice) or not.
        """
        with self._lock:
            failure = self._failures.pop(epoch, None)
        if failure is not None:
            raise failure
        self.raw(epoch)

    def fitted(self, epoch):
        """Epoch ``epoch``'s order as the ranks share it."""
        return planlib.fit_to_ranks(self.raw(epoch), self.size, self.remainder)

    def forget_before(self, epoch):
        """Drops the orders no longer needed once the consumer is in ``epoch``."""
        with self._lock:
            known = [e for e in self._orders if e <= epoch]
            if known:
                keep = max(known)
                self._orders = {e: o for e, o in self._orders.items() if e >= keep}

    def _sampler_position(self, epoch):
        # Chainer calls the sampler while cutting the minibatch that reaches the
        # end of the previous epoch, passing that minibatch's start within the
        # epoch (0 if it began earlier still). Minibatches start on a grid of
        # one global minibatch from the anchor.
        span, length = self.batch_size * self.size, self.length
        boundary = epoch * length
        begin = boundary - ((boundary - self.anchor) % span or span)
        return max(0, begin - (epoch - 1) * length) // self.size

    def copy(self):
        """An independent book at the same place, as ``copy.copy`` of a Chainer iterator would give.

        The sampler is copied (through pickle) so that the copy draws its own
        orders; one that cannot be pickled (a lambda, a closure) is shared,
        as Chainer's iterators share theirs when copied.
        """
        with self._lock:
            state = dict(self.__dict__)
            state["_orders"] = {epoch: order.copy() for epoch, order in self._orders.items()}
            try:
                state["sampler"] = pickle.loads(pickle.dumps(self.sampler))
            except (pickle.PicklingError, AttributeError, TypeError):
                pass  # shared: Chainer's copy.copy shares it too
        other = OrderBook.__new__(OrderBook)
        other.__dict__.update(state)
        other._lock = threading.Lock()
        return other

    def __getstate__(self):
        with self._lock:
            state = dict(self.__dict__)
            # Pickled now, under the lock, so that the coordinator cannot draw
            # from the sampler halfway through.
            state["sampler"] = pickle.dumps(self.sampler)
            state["_orders"] = dict(self._orders)
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.sampler = pickle.loads(state["sampler"])
        self._lock = threading.Lock()


def minibatches(book, start, batch_size, rank, size, repeat, failures):
    """This rank's minibatches from stream position ``start``, for ``Pipeline(plan=...)``.

    An exception from the orders (a sampler that fails or returns a malformed
    order) ends the plan instead of killing the coordinator: the minibatches
    before it are still delivered, and the iterator raises the exception,
    kept in ``failures``, at the call that needed the next one.

    Args:
        book: The ``OrderBook``.
        start: Samples of the stream consumed by all ranks together.
        batch_size: Examples per minibatch on one rank.
        rank: This rank.
        size: Number of ranks.
        repeat: Repeat epochs; False reads epoch 0 only.
        failures: A list that receives the exception that ended the plan.
    """
    length = book.length
    # stream() counts epochs from its first one; starting it at the current
    # epoch lets the book forget the epochs already read.
    base = start // length if repeat else 0
    shift = base * length
    try:
        for mb in planlib.stream(lambda epoch: book.fitted(base + epoch), batch_size, start - shift, rank, size,
                                 repeat):
            yield dataclasses.replace(mb, epoch=mb.epoch + base, end=mb.end + shift)
    except Exception as exc:  # noqa: BLE001 - handed to the consumer, see above
        failures.append(exc)
