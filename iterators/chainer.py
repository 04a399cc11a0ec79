"""A drop-in for ``chainer.iterators.MultiprocessIterator`` that stages files.

``StagingIterator`` keeps Chainer's iterator protocol and semantics (epoch,
epoch_detail, previous_epoch_detail, is_new_epoch, current_position, repeat,
reset, finalize, serialize, minibatches that cross an epoch boundary when
repeating), while stager's prefetchers copy each upcoming minibatch's files to
node-local storage and its readers decode them. Under MPI each rank's
iterator reads that rank's share of every global minibatch, so ChainerMN
users need no ``scatter_dataset``.
"""

import sys
import warnings

import numpy

from stager import plan as planlib
from stager.pipeline import Pipeline

from ._source import resolve


def _import_chainer():
    # Chainer 7 imports numpy.distutils, which needs the standard library's
    # distutils rather than the shim that setuptools installs at start-up.
    if "distutils" not in sys.modules:
        try:
            import _distutils_hack
            _distutils_hack.remove_shim()
        except ImportError:
            pass
    with warnings.catch_warnings():
        # Chainer 7 imports pkg_resources, which setuptools marks deprecated.
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import chainer
    return chainer


_chainer = _import_chainer()


class StagingIterator(_chainer.dataset.Iterator):
    """Chainer iterator over a stager dataset, staged minibatch by minibatch.

    Args:
        dataset_or_config: A stager ``Config`` (or a dict of its values)
            describing the dataset and the staging, or a ``stager.Catalog``
            (its files, staged with the default settings).
        batch_size: Examples per minibatch (on this rank).
        repeat: Repeat epochs without end; False stops after one epoch, the
            last minibatch short.
        shuffle: Shuffle each epoch (default True); must stay None when
            ``order_sampler`` is given, as in Chainer.
        order_sampler: Chainer order sampler, called as
            ``order_sampler(current_order, current_position)`` at each epoch.
        n_processes: Reader processes (``reader.workers``); None keeps the
            config's.
        world: A ``stager.world.World``; default: detected.
        catalog: A ``stager.Catalog``; default: built on rank 0 and broadcast.
        **ignored: MultiprocessIterator's tuning arguments (n_prefetch,
            shared_mem, dataset_timeout, maxtasksperchild) are accepted and
            ignored: stager's own settings govern prefetching.
    """

    _IGNORED = {"n_prefetch", "shared_mem", "dataset_timeout", "maxtasksperchild"}

    def __init__(self, dataset_or_config, batch_size, repeat=True, shuffle=None, order_sampler=None,
                 n_processes=None, world=None, catalog=None, **ignored):
        self._pipe = None
        self._finalized = False
        unknown = set(ignored) - self._IGNORED
        if unknown:
            raise TypeError(f"unexpected argument(s) {sorted(unknown)}")
        if shuffle is not None and order_sampler is not None:
            raise ValueError("`shuffle` is not `None` and a custom `order_sampler` is set. Please set "
                             "`shuffle` to `None` to use the custom order sampler.")
        overrides = {"plan": {"batch_size": batch_size, "epochs": 0}}  # `repeat` decides
        if n_processes is not None:
            overrides["reader"] = {"workers": n_processes}
        self.config, self.world, self.catalog = resolve(dataset_or_config, world, catalog, overrides)
        self.batch_size = batch_size
        self.repeat = repeat
        self.shuffle = True if shuffle is None else shuffle
        self.order_sampler = order_sampler
        self.reset()

    # Orders ---------------------------------------------------------------

    def _global_length(self):
        return len(self._epoch_order(0)) if self.order_sampler is None else len(self._orders[-1])

    def _epoch_order(self, epoch):
        p = self.config.plan
        return planlib.epoch_order(len(self.catalog), p.seed, epoch, self.shuffle, self.world.size, p.remainder,
                                   algorithm=p.shuffle_algorithm)

    def _sampled_order(self, epoch):
        # A custom sampler is stateful: call it once per epoch, in order.
        while len(self._orders) <= epoch:
            nxt = numpy.asarray(self.order_sampler(self._orders[-1], 0), dtype=numpy.int64)
            self._orders.append(self._fit(nxt))
        return self._orders[epoch]

    def _fit(self, order):
        extra = len(order) % self.world.size
        if extra == 0:
            return order
        if self.config.plan.remainder == "pad":
            return numpy.concatenate([order, numpy.resize(order, self.world.size - extra)])
        return order[:len(order) - extra]

    # Protocol -------------------------------------------------------------

    def reset(self):
        """Restarts from the first minibatch of epoch 0."""
        if self._finalized:
            raise NotImplementedError("reset of a finalized StagingIterator is not supported")
        if self.order_sampler is not None:
            first = self.order_sampler(numpy.arange(len(self.catalog)), 0)
            self._orders = [self._fit(numpy.asarray(first, dtype=numpy.int64))]
        self._restart(0, False, -1.0)

    def _restart(self, position, is_new_epoch, previous_epoch_detail):
        self._close_pipe()
        self._position = position
        self._length = self._global_length()
        self.is_new_epoch = is_new_epoch
        self._previous_epoch_detail = previous_epoch_detail
        self._done = not self.repeat and position >= self._length

    def _open_pipe(self):
        orders = self._epoch_order if self.order_sampler is None else self._sampled_order
        stream = planlib.stream(orders, self.batch_size, self._position, self.world.rank, self.world.size,
                                self.repeat)
        self._pipe = Pipeline(self.config, self.catalog, world=self.world, plan=stream).start()

    def _close_pipe(self):
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    def __next__(self):
        if self._done:
            raise StopIteration
        if self._pipe is None or self._pipe.closed:  # closed by an error: retry from the position
            self._close_pipe()
            self._open_pipe()
        batch = next(self._pipe)
        self._previous_epoch_detail = self.epoch_detail
        before = self.epoch
        self._position = batch.end
        self.is_new_epoch = self.epoch > before
        if batch.last:
            self._done = True
            self._close_pipe()
        return list(batch.samples)

    @property
    def epoch(self):
        return self._position // self._length

    @property
    def current_position(self):
        """Position in the current epoch, counted on this rank's share."""
        return (self._position % self._length) // self.world.size

    @property
    def epoch_detail(self):
        # Chainer's own formula, so that the floats compare equal too.
        return self.epoch + self.current_position / (self._length // self.world.size)

    @property
    def previous_epoch_detail(self):
        return None if self._previous_epoch_detail < 0 else self._previous_epoch_detail

    def serialize(self, serializer):
        """Saves or restores the position (Chainer's serializer protocol)."""
        current_position = serializer("current_position", self.current_position)
        epoch = serializer("epoch", self.epoch)
        is_new_epoch = serializer("is_new_epoch", self.is_new_epoch)
        previous = serializer("previous_epoch_detail", self._previous_epoch_detail)
        if self.order_sampler is not None:
            order = serializer("order", self._orders[min(self.epoch, len(self._orders) - 1)].copy())
        position = int(epoch) * self._length + int(current_position) * self.world.size
        if position != self._position:
            if self.order_sampler is not None:
                self._orders = [None] * int(epoch) + [numpy.asarray(order, dtype=numpy.int64)]
            self._restart(position, False, -1.0)
        self.is_new_epoch = bool(is_new_epoch)
        self._previous_epoch_detail = float(previous)

    def finalize(self):
        """Stops the pipeline's processes; safe to call twice."""
        self._close_pipe()
        self._finalized = True
