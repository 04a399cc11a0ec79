"""NVIDIA DALI pipelines that read through stager: one line in place of ``fn.readers.file``.

Inside a ``pipeline_def``, replace DALI's file reader::

    from iterators.dali import reader

    @pipeline_def(batch_size=32, num_threads=4, device_id=0)
    def train(root):
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")  # before
        jpegs, labels = reader(file_root=root, random_shuffle=True, name="Reader")           # after
        images = fn.decoders.image_random_crop(jpegs, device="mixed")
        ...

``reader`` takes ``fn.readers.file``'s arguments and gives what it gives:
each sample's encoded bytes (``uint8``) and its label (``int32``, shape
``(1,)``), for the same files and labels (``_dali_files``). The samples come
in stager's plan for this rank (ranks from MPI, Slurm or torchrun, as in
stager's other front ends), from the node's staged copies, while the
following minibatches are staged; DALI's decoders, CPU or GPU, run on them
unchanged. It is DALI's external source underneath (a callable given each
``BatchInfo``), so an epoch ends as an external source's does:
``pipe.run()`` raises ``StopIteration`` after the last (possibly short)
batch of this rank, and ``pipe.reset()`` starts the next epoch. DALI's
framework iterators follow that when given no ``reader_name`` (an external
source has no reader metadata). Resume is DALI's own checkpointing
(``enable_checkpointing=True``, ``pipe.checkpoint()``, ``checkpoint=``): it
saves the source's epoch and iteration, and the reader restarts the
staging at that place of the plan. docs/dali.md says more.

Needs the ``dali`` extra (``pip install 'stager[dali]'``).
"""

import weakref

try:
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline as DaliPipeline
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise ImportError("iterators.dali needs NVIDIA DALI: pip install 'stager[dali]' (nvidia-dali-cuda120)") from exc

import torch

from stager import plan as planlib
from stager.world import detect

from . import _dali_files
from ._source import staging_settings
from .pytorch import StagedLoader

__all__ = ["reader", "readers", "StagedSource"]

READERS = 2  # reader processes of a rank: they only read the staged bytes, DALI's threads decode
# fn.readers.file's arguments that tune how DALI's own loader reads; stager stages and reads instead.
LOADER_TUNING = ("initial_fill", "read_ahead", "prefetch_queue_depth", "dont_use_mmap", "lazy_init",
                 "tensor_init_bytes", "skip_cached_images", "bytes_per_sample_hint", "preserve")
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
            data, labels = next(self._batches)
        except StopIteration:
            self._batches, self._next = None, (wanted[0] + 1, 0)
            raise
        self._next = (wanted[0], wanted[1] + 1)
        return data, labels

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
        if loader.state_dict() != planlib.resume_state(position, len(loader.catalog), loader.config.plan,
                                                       loader.world.size):
            loader.load_state_dict(planlib.resume_state(position, len(loader.catalog), loader.config.plan,
                                                        loader.world.size))
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


def _files(file_root, files, labels, file_list, file_filters, dir_filters, case_sensitive_filter):
    if file_list is not None:
        if files is not None:
            raise ValueError("file_list and files are mutually exclusive, as in fn.readers.file")
        return _dali_files.listed(file_list, file_root)
    if files is not None:
        return _dali_files.given(files, labels, file_root)
    if file_root is None:
        raise ValueError("reader needs file_root, files or file_list, as fn.readers.file")
    rels, found = _dali_files.tree(file_root, file_filters, dir_filters, case_sensitive_filter)
    return [f"{file_root}/{rel}" for rel in rels], found


def _check_shards(num_shards, shard_id, world):
    if num_shards is None and shard_id is None:
        return
    shards, shard = num_shards if num_shards is not None else 1, shard_id if shard_id is not None else 0
    if (shards, shard) != (world.size, world.rank):
        raise ValueError(f"num_shards={shards}, shard_id={shard} but stager runs this process as rank "
                         f"{world.rank} of {world.size} ({world.source}): stager splits each epoch among its "
                         f"ranks itself, so leave num_shards and shard_id out or give the rank and size")


def reader(*, file_root=None, files=None, labels=None, file_list=None, file_filters=_dali_files.FILE_FILTERS,
           dir_filters=None, case_sensitive_filter=False, random_shuffle=False, shuffle_after_epoch=False, seed=-1,
           shuffle_after_epoch_seed=None, num_shards=None, shard_id=None, stick_to_shard=False,
           pad_last_batch=False, name=None, num_workers=READERS, config=None, world=None, **loader_tuning):
    """``fn.readers.file``'s outputs, read through stager: call it inside a pipeline's definition.

    Args (``fn.readers.file``'s, with what each means here):
        file_root, files, labels, file_list, file_filters, dir_filters,
            case_sensitive_filter: Which files, with which labels, as DALI
            lists them (``_dali_files``).
        random_shuffle, shuffle_after_epoch: Either shuffles every epoch
            with a full permutation of the whole dataset (seed + epoch),
            where DALI's ``random_shuffle`` draws from a window of
            ``initial_fill`` samples.
        seed, shuffle_after_epoch_seed: The order's seed (the first that is
            given and not -1); default: the staging config's ``plan.seed``,
            the same in every run, so a checkpoint resumes the same order.
            Every rank must use the same.
        num_shards, shard_id: Checked against the rank and size stager runs
            with (MPI, Slurm or torchrun), which split every epoch.
        stick_to_shard: Refused: each epoch's plan splits the whole dataset.
        pad_last_batch: Accepted: ranks always read equal shares
            (``plan.remainder``), and a rank's last batch may be short.
        name: Accepted and unused: DALI names no external source of two
            outputs, and has no reader metadata for one.
        initial_fill, read_ahead, prefetch_queue_depth, dont_use_mmap,
            lazy_init, tensor_init_bytes, skip_cached_images,
            bytes_per_sample_hint, preserve: Accepted and unused: they tune
            DALI's own loader.

    Keyword-only, stager's own:
        num_workers: Reader processes of this rank reading the staged bytes
            (default 2).
        config: Staging settings (``Config`` or dict); default
            ``$STAGER_CONFIG``'s file, else stager's defaults.
        world: A ``stager.world.World``; default: detected.

    Returns:
        ``(encoded, labels)``: the external source's two outputs.

    Raises:
        RuntimeError: Called outside a pipeline's definition.
        TypeError: An argument ``fn.readers.file`` does not take, naming it.
        FileNotFoundError: A root, list or file that cannot be read, named.
    """
    unknown = sorted(set(loader_tuning) - set(LOADER_TUNING))
    if unknown:
        raise TypeError(f"reader() got unexpected arguments {unknown}: it takes fn.readers.file's arguments "
                        f"(file_root, files, labels, file_list, file_filters, dir_filters, case_sensitive_filter, "
                        f"random_shuffle, shuffle_after_epoch, seed, num_shards, shard_id, ...) and num_workers, "
                        f"config, world")
    if stick_to_shard:
        raise ValueError("stick_to_shard=True: stager splits each epoch's permutation of the whole dataset among "
                         "the ranks; a rank that keeps its shard is a fixed split, which stager does not make")
    pipe = DaliPipeline.current()
    if pipe is None:
        raise RuntimeError("iterators.dali.reader() builds a DALI operator: call it inside a function decorated "
                           "with @pipeline_def, or under `with pipe:`")
    paths, found = _files(file_root, files, labels, file_list, file_filters, dir_filters, case_sensitive_filter)
    base = staging_settings(config)
    world = world if world is not None else detect(base.world.mpi, base.world.backend)
    _check_shards(num_shards, shard_id, world)
    seeds = [s for s in (seed, shuffle_after_epoch_seed) if s is not None and s != -1]
    order_seed = int(seeds[0]) if seeds else base.plan.seed
    loader = StagedLoader(_dali_files.EncodedFiles(paths, found), batch_size=pipe.max_batch_size,
                          shuffle=bool(random_shuffle or shuffle_after_epoch), num_workers=num_workers,
                          collate_fn=_dali_files.collate, generator=torch.Generator().manual_seed(order_seed),
                          config=base, world=world)
    source = StagedSource(loader)
    _OF_PIPELINE.setdefault(pipe, []).append(source)
    weakref.finalize(pipe, source.close)
    return fn.external_source(source=source, num_outputs=2, batch=True, batch_info=True,
                              dtype=[types.UINT8, types.INT32], ndim=[1, 1])


def readers(pipe):
    """The ``StagedSource`` of each ``reader`` in a pipeline: its ``stats``, ``report()`` and ``close()``."""
    return list(_OF_PIPELINE.get(pipe, ()))
