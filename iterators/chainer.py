"""A drop-in for ``chainer.iterators.MultiprocessIterator`` that stages files.

``StagingIterator`` keeps Chainer's iterator protocol and semantics (epoch,
epoch_detail, previous_epoch_detail, is_new_epoch, current_position, repeat,
reset, finalize, serialize with Chainer's snapshot keys, pickling,
minibatches that cross an epoch boundary when repeating), while stager's
prefetchers copy each upcoming minibatch's files to node-local storage and
its readers decode them. Under MPI each rank's iterator reads that rank's
share of every global minibatch, so ChainerMN users need no
``scatter_dataset``.
"""

import warnings
import weakref

from stager import Catalog, Pipeline, ShardCatalog
from stager import plan as planlib
from stager.config import Config
from stager.world import detect

from ._chainer_datasets import FileDataset
from ._chainer_feed import Feed, release
from ._chainer_import import chainer as _chainer
from ._chainer_orders import OrderBook, minibatches
from ._source import resolve


def _with_source(config, root):
    """``config`` (None, a dict or a Config) reading the dataset under ``root``."""
    if config is None:
        return {"dataset": {"source": root}}
    if isinstance(config, Config):
        return config.replace(dataset={"source": root})
    if isinstance(config, dict):
        return {**config, "dataset": {**config.get("dataset", {}), "source": root}}
    raise TypeError(f"config must be a stager Config or a dict of its values, got {type(config).__name__}")


class StagingIterator(_chainer.dataset.Iterator):
    """Chainer iterator over files staged by stager, minibatch by minibatch.

    Args:
        dataset: What to iterate: a stager ``Config`` (or a dict of its
            values) describing the dataset and the staging; a
            ``stager.Catalog``; or a Chainer dataset that reads one file per
            example, such as ``LabeledImageDataset`` or ``ImageDataset``
            (also inside ``TransformDataset`` or ``SubDataset``), whose
            examples are decoded by its own ``get_example``.
        batch_size: Examples per minibatch (on this rank).
        repeat: Repeat epochs without end; False stops after one epoch, the
            last minibatch short.
        shuffle: Shuffle each epoch (default True); must stay None when
            ``order_sampler`` is given, as in Chainer.
        n_processes: Reader processes (``reader.workers``); None keeps the
            config's.
        n_prefetch: Accepted and ignored: ``staging.lookahead`` governs.
        shared_mem: Accepted and ignored: minibatches travel by pipe.
        order_sampler: Chainer order sampler, called as
            ``order_sampler(current_order, current_position)`` for each epoch.
            Under MPI it must return the same order on every rank.
        dataset_timeout: Seconds a minibatch may be waited for before
            ``TimeoutWarning`` is issued (and again after each further
            ``dataset_timeout``); None disables it.
        maxtasksperchild: Accepted and ignored.
        config: Staging settings (a ``Config`` or dict) for a Chainer dataset
            or a Catalog; its ``dataset.source`` is replaced by the files'
            root directory.
        world: A ``stager.world.World``; default: detected.
        catalog: A ``stager.Catalog``; default: built on rank 0 and broadcast.
    """

    TimeoutWarning = _chainer.iterators.MultiprocessIterator.TimeoutWarning

    def __init__(self, dataset, batch_size, repeat=True, shuffle=None, n_processes=None, n_prefetch=1,
                 shared_mem=None, order_sampler=None, dataset_timeout=30.0, maxtasksperchild=None, *,
                 config=None, world=None, catalog=None):
        self._feed = None
        self._finalizer = None
        self._finalized = False
        self._last_pipe = None  # the latest pipeline, for report()
        if shuffle is not None and order_sampler is not None:
            raise ValueError("`shuffle` is not `None` and a custom `order_sampler` is set. Please set "
                             "`shuffle` to `None` to use the custom order sampler.")
        overrides = {"plan": {"batch_size": batch_size, "epochs": 0}}  # `repeat` decides
        if n_processes is not None:
            overrides["reader"] = {"workers": n_processes}
        self._decoder, build = None, None
        if isinstance(dataset, (Config, dict)):
            if config is not None:
                raise TypeError("config= gives the staging settings of a Chainer dataset or Catalog; "
                                "here the dataset argument is itself a config")
        elif isinstance(dataset, (Catalog, ShardCatalog)):
            if config is not None:
                dataset, catalog = _with_source(config, dataset.root), dataset
        else:
            if catalog is not None:
                raise TypeError("catalog= cannot describe a Chainer dataset: its files are the catalog")
            files = FileDataset(dataset)
            dataset, build, self._decoder = _with_source(config, files.root), files.catalog, files.decoder()
        self.config, self.world, self.catalog = resolve(dataset, world, catalog, overrides, build)
        self.batch_size = batch_size
        self.repeat = repeat
        self.shuffle = True if shuffle is None else shuffle
        self.order_sampler = order_sampler
        self.dataset_timeout = dataset_timeout
        p = self.config.plan
        self._orders = OrderBook(len(self.catalog), batch_size, self.shuffle, order_sampler, p.seed,
                                 self.world.size, p.remainder, planlib.bound_shuffle(p, self.catalog.containers))
        self.reset()

    # Protocol -------------------------------------------------------------

    def reset(self):
        """Restarts from the first minibatch of epoch 0."""
        if self._finalized:
            raise NotImplementedError("reset of a finalized StagingIterator is not supported")
        self._close_feed()
        self._orders.reset()
        self._restart(0, False, -1.0)

    def _restart(self, position, is_new_epoch, previous_epoch_detail):
        self._close_feed()
        self._position = position
        self._orders.anchor = position
        self.is_new_epoch = is_new_epoch
        self._previous_epoch_detail = previous_epoch_detail
        self._done = not self.repeat and position >= self._orders.length

    def __next__(self):
        if self._finalized:
            raise RuntimeError("next() on a finalized StagingIterator")
        if self._done:
            self._previous_epoch_detail = self.epoch_detail  # Chainer updates it even when it stops
            raise StopIteration
        if self._feed is None or self._feed.closed:  # closed by an error: retry from the position
            self._open_feed()
        batch = self._feed.get(self.dataset_timeout, self._warn_stall)
        if batch is None:  # the plan ended early: an order could not be drawn
            failures = self._feed.failures
            self._close_feed()
            if failures:
                raise failures[0]
            raise RuntimeError("stager's pipeline ended before the epoch did")
        if self._orders.sampler is not None and batch.end // self._orders.length > self.epoch:
            try:
                self._orders.drawn(batch.end // self._orders.length)
            except Exception:
                self._close_feed()  # as Chainer, the position stays and the next call asks the sampler again
                raise
        self._previous_epoch_detail = self.epoch_detail
        before = self.epoch
        self._position = batch.end
        self.is_new_epoch = self.epoch > before
        self._orders.forget_before(self.epoch)
        if batch.last:
            self._done = True
            self._close_feed()
        return list(batch.samples)

    next = __next__

    def _warn_stall(self, waited):
        warnings.warn(f"Stalled dataset is detected: StagingIterator has waited more than dataset_timeout="
                      f"{self.dataset_timeout} s for a minibatch. The shared file system may be slow, or a "
                      "loader stuck; a failed stager worker raises stager.StageError instead.",
                      self.TimeoutWarning, stacklevel=4)

    @property
    def epoch(self):
        return self._position // self._orders.length

    @property
    def current_position(self):
        """Position in the current epoch, counted on this rank's share."""
        return (self._position % self._orders.length) // self.world.size

    @property
    def _epoch_size(self):
        return self._orders.length // self.world.size

    @property
    def epoch_detail(self):
        # Chainer's own formula, so that the floats compare equal too.
        return self.epoch + self.current_position / self._epoch_size

    @property
    def previous_epoch_detail(self):
        return None if self._previous_epoch_detail < 0 else self._previous_epoch_detail

    # Snapshots ------------------------------------------------------------

    def serialize(self, serializer):
        """Saves or restores the state under Chainer's keys and with their meaning.

        The keys are those of ``MultiprocessIterator`` and ``SerialIterator``:
        ``current_position``, ``epoch``, ``is_new_epoch``,
        ``previous_epoch_detail`` and, when shuffling or sampling, ``order``
        (the current epoch's order over the whole dataset). Snapshots of older
        Chainer versions, with ``_order`` or without ``previous_epoch_detail``,
        load as Chainer loads them.

        Raises:
            KeyError: If a shuffling iterator loads a snapshot without an order.
            ValueError, TypeError: If the loaded position or order is malformed.
        """
        loading = isinstance(serializer, _chainer.serializer.Deserializer)
        current_position = serializer("current_position", self.current_position)
        epoch = serializer("epoch", self.epoch)
        is_new_epoch = serializer("is_new_epoch", self.is_new_epoch)
        order = None
        if self._orders.recorded:
            # Loading asks for the stored array as it is, so that a malformed
            # one gets our message rather than a failed copy into ours.
            order = None if loading else self._orders.raw(self.epoch).copy()
            try:
                order = serializer("order", order)
            except KeyError:
                try:
                    order = serializer("_order", order)
                except KeyError:
                    raise KeyError("the snapshot has no 'order' (nor the older '_order'), which iterators that "
                                   "shuffle write: it was taken with shuffle=False, or by stager before it "
                                   "wrote the order") from None
        try:
            previous = serializer("previous_epoch_detail", self._previous_epoch_detail)
        except KeyError:
            previous = None  # older Chainer: estimated below, as Chainer does
        if loading:
            self._load(current_position, epoch, is_new_epoch, order, previous)

    def _load(self, current_position, epoch, is_new_epoch, order, previous):
        current_position, epoch = int(current_position), int(epoch)
        if epoch < 0 or not 0 <= current_position < self._epoch_size:
            raise ValueError(f"the snapshot's position (epoch {epoch}, current_position {current_position}) "
                             f"is outside this iterator's epochs of {self._epoch_size} examples")
        if order is not None:
            self._orders.load(epoch, order)
        self._restart(epoch * self._orders.length + current_position * self.world.size, bool(is_new_epoch), -1.0)
        if previous is None:
            previous = self.epoch + (self.current_position - self.batch_size) / self._epoch_size
            previous = max(previous, 0.0) if self.epoch_detail > 0 else -1.0
        self._previous_epoch_detail = float(previous)

    # Pickling -------------------------------------------------------------

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("_feed", "_finalizer", "_last_pipe")}
        # A communicator does not pickle; the world is detected again instead.
        state["world"] = self.world if self.world.comm is None else None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._feed = None
        self._finalizer = None
        self._last_pipe = None
        if self.world is None:
            # Under MPI this is collective: every rank unpickles its iterator.
            self.world = detect(self.config.world.mpi)

    def __copy__(self):
        other = self.__class__.__new__(self.__class__)
        state = self.__getstate__()
        state["_orders"] = self._orders.copy()  # the copy draws its own orders (a lambda sampler is shared)
        other.__setstate__(state)
        return other

    # Processes ------------------------------------------------------------

    def _open_feed(self):
        self._close_feed()
        failures = []
        plan = minibatches(self._orders, self._position, self.batch_size, self.world.rank, self.world.size,
                           self.repeat, failures)
        pipe = Pipeline(self.config, self.catalog, world=self.world, plan=plan, loader=self._decoder)
        feed = Feed(pipe.start(), failures, self.config.processes.shutdown_timeout_s)
        self._feed = feed
        self._last_pipe = pipe
        # Only the feed is kept alive by the finalizer: dropping the iterator
        # without finalize() ends its processes when it is collected.
        self._finalizer = weakref.finalize(self, release, feed)

    def _close_feed(self):
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._feed is not None:
            self._feed.close()
            self._feed = None

    # Where the time went --------------------------------------------------

    @property
    def stats(self):
        """The latest pipeline's ``stager.telemetry.Stats`` (stall time, files staged), or None."""
        return self._last_pipe.stats if self._last_pipe is not None else None

    def report(self, path=None):
        """The stall report's JSON for the latest pipeline's loop, as ``stager run --report`` writes it.

        Collective under MPI: every rank calls it; rank 0 writes ``path``.
        Call it right after the loop: the time since the last minibatch
        counts as that step's compute. ``stager report PATH`` reads the file.

        Args:
            path: JSON file to write (rank 0), or None.

        Returns:
            On rank 0 the job's report (a dict), elsewhere this rank's summary.

        Raises:
            RuntimeError: No minibatch was taken yet.
        """
        if self._last_pipe is None:
            raise RuntimeError("StagingIterator.report(): no pipeline ran yet; take minibatches first")
        from stager.telemetry import pipeline_report

        return pipeline_report(self._last_pipe, self.config, path)

    def finalize(self):
        """Stops the pipeline's processes; safe to call twice."""
        self._close_feed()
        self._finalized = True

    def __del__(self):
        # The weakref finalizer closes the pipeline, on a safe thread; the base
        # class would call finalize() in whichever thread collects us.
        pass
