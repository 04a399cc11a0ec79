"""What the DALI readers share: the external source that hands DALI a rank's staged minibatches.

``staged_source`` builds a ``StagedLoader`` over a dataset of stager's
protocol whose samples are the outputs' arrays, and wraps it in a
``StagedSource``: the callable DALI's external source calls with each
batch's ``BatchInfo``. The epoch and iteration it is asked for place it in
the plan, so DALI's reset and its checkpoints move it (``iterators.dali``).
"""

import weakref

import torch
from nvidia.dali.pipeline import Pipeline as DaliPipeline

from stager import plan as planlib
from stager.world import detect

from ._source import staging_settings
from .pytorch import StagedLoader

# The pipelines' staged sources, so that readers(pipe) finds them; a pipeline's entry goes with it.
_OF_PIPELINE = weakref.WeakKeyDictionary()


class StagedSource:
    """The callable DALI's external source calls for each batch: this rank's minibatches, staged.

    Args:
        loader: The ``StagedLoader`` over the reader's files.
    """

    def __init__(self, loader):
        self.loader = loader
        self._batches = None     # the iteration of the epoch being delivered
        self._next = (0, 0)      # (epoch, iteration) that iteration delivers next

    def __call__(self, info):
        wanted = (int(info.epoch_idx), int(info.iteration))
        if self._batches is None or wanted != self._next:
            self._seek(*wanted)
        try:
            outputs = next(self._batches)
        except StopIteration:
            self._batches, self._next = None, (wanted[0] + 1, 0)
            raise
        self._next = (wanted[0], wanted[1] + 1)
        return outputs

    def _seek(self, epoch, iteration):
        """Starts delivering epoch ``epoch`` at its minibatch ``iteration`` (DALI's reset or checkpoint)."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None
        loader = self.loader
        if iteration >= len(loader):
            self._next = (epoch + 1, 0)
            raise StopIteration
        span = loader.batch_size * loader.world.size
        position = planlib.Position(epoch, min(iteration * span, len(loader.catalog)))
        state = planlib.resume_state(position, len(loader.catalog), loader.config.plan, loader.world.size)
        if loader.state_dict() != state:  # else the loader's pipeline goes on where it is
            loader.load_state_dict(state)
        self._batches = iter(loader)
        self._next = (epoch, iteration)

    def __len__(self):
        """Batches of one epoch on this rank."""
        return len(self.loader)

    @property
    def stats(self):
        """The staging pipeline's ``stager.telemetry.Stats``, or None before the first batch."""
        return self.loader.stats

    def report(self, path=None):
        """The stall report (``StagedLoader.report``): collective under several ranks; rank 0 writes ``path``."""
        return self.loader.report(path)

    def close(self):
        """Stops the staging (prefetchers and readers); safe twice. A pipeline's end does it too."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None
        self.loader.close()


def _check_shards(num_shards, shard_id, world):
    if num_shards is None and shard_id is None:
        return
    shards, shard = num_shards if num_shards is not None else 1, shard_id if shard_id is not None else 0
    if (shards, shard) != (world.size, world.rank):
        raise ValueError(f"num_shards={shards}, shard_id={shard} but stager runs this process as rank "
                         f"{world.rank} of {world.size} ({world.source}): stager splits each epoch among its "
                         f"ranks itself, so leave num_shards and shard_id out or give the rank and size")


def staged_source(dataset, collate, what, *, shuffle, seeds, num_shards, shard_id, stick_to_shard, num_workers,
                  config, world):
    """The ``StagedSource`` of a reader built in the pipeline being defined, registered with it.

    Args:
        dataset: Makes the dataset (after the checks): one of stager's protocol whose samples are
            tuples of the outputs' arrays.
        collate: Its minibatches as the external source takes them.
        what: The reader's name, for errors.
        seeds: The seed arguments given (-1 or None: not given).

    Raises:
        RuntimeError: Called outside a pipeline's definition.
        ValueError: ``stick_to_shard``, or shards that are not stager's ranks.
    """
    if stick_to_shard:
        raise ValueError("stick_to_shard=True: stager splits each epoch's permutation of the whole dataset among "
                         "the ranks; a rank that keeps its shard is a fixed split, which stager does not make")
    pipe = DaliPipeline.current()
    if pipe is None:
        raise RuntimeError(f"iterators.dali.{what}() builds a DALI operator: call it inside a function decorated "
                           "with @pipeline_def, or under `with pipe:`")
    base = staging_settings(config)
    world = world if world is not None else detect(base.world.mpi, base.world.backend)
    _check_shards(num_shards, shard_id, world)
    given = [s for s in seeds if s is not None and s != -1]
    order_seed = int(given[0]) if given else base.plan.seed
    loader = StagedLoader(dataset(), batch_size=pipe.max_batch_size, shuffle=shuffle, num_workers=num_workers,
                          collate_fn=collate, generator=torch.Generator().manual_seed(order_seed), config=base,
                          world=world)
    source = StagedSource(loader)
    _OF_PIPELINE.setdefault(pipe, []).append(source)
    weakref.finalize(pipe, source.close)
    return source


def readers(pipe):
    """The ``StagedSource`` of each stager reader in a pipeline: its ``stats``, ``report()`` and ``close()``."""
    return list(_OF_PIPELINE.get(pipe, ()))
