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
staging at that place of the plan. ``webdataset`` does the same in place
of ``fn.readers.webdataset``, for tar shards, and ``shards`` for the tar or
MosaicML Streaming (MDS) shards of a ``ShardDataset`` source, whose columns
DALI has no reader of. docs/dali.md says more.

Needs the ``dali`` extra (``pip install 'stager[dali]'``).
"""

try:
    from nvidia.dali import fn, types
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise ImportError("iterators.dali needs NVIDIA DALI: pip install 'stager[dali]' (nvidia-dali-cuda120)") from exc

import numpy as np

from . import _dali_files
from ._dali_shards import EncodedParts
from ._dali_shards import collate as collate_parts
from ._dali_source import StagedSource, readers, staged_source

__all__ = ["reader", "readers", "shards", "webdataset", "StagedSource"]

READERS = 2  # reader processes of a rank: they only read the staged bytes, DALI's threads decode
# The readers' arguments that tune how DALI's own loader reads; stager stages and reads instead.
LOADER_TUNING = ("initial_fill", "read_ahead", "prefetch_queue_depth", "dont_use_mmap", "lazy_init",
                 "tensor_init_bytes", "skip_cached_images", "bytes_per_sample_hint", "preserve")


def _refuse_unknown(what, given, own):
    unknown = sorted(set(given) - set(LOADER_TUNING))
    if unknown:
        dalis = "file" if what == "reader" else what
        raise TypeError(f"{what}() got unexpected arguments {unknown}: it takes fn.readers.{dalis}'s arguments "
                        f"({own}, random_shuffle, seed, num_shards, shard_id, ...) and num_workers, config, world")


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
    _refuse_unknown("reader", loader_tuning, "file_root, files, labels, file_list, file_filters, dir_filters, "
                    "case_sensitive_filter")
    source = staged_source(
        lambda: _dali_files.EncodedFiles(*_files(file_root, files, labels, file_list, file_filters, dir_filters,
                                                 case_sensitive_filter)),
        _dali_files.collate, "reader", shuffle=bool(random_shuffle or shuffle_after_epoch),
        seeds=(seed, shuffle_after_epoch_seed), num_shards=num_shards, shard_id=shard_id,
        stick_to_shard=stick_to_shard, num_workers=num_workers, config=config, world=world)
    return fn.external_source(source=source, num_outputs=2, batch=True, batch_info=True,
                              dtype=[types.UINT8, types.INT32], ndim=[1, 1])


def webdataset(*, paths, ext, index_paths=None, missing_component_behavior="", dtypes=None,
               case_sensitive_extensions=True, random_shuffle=False, seed=-1, num_shards=None, shard_id=None,
               stick_to_shard=False, pad_last_batch=False, name=None, num_workers=READERS, config=None, world=None,
               **loader_tuning):
    """``fn.readers.webdataset``'s outputs for tar shards, read through stager: call it in a pipeline's definition.

    Each shard is staged once for all its samples (``ShardDataset``), and a
    shuffled epoch reads shard by shard (the ``shards`` shuffle, within a
    window of 8 shards), as sharded readers do.

    Args (``fn.readers.webdataset``'s, with what each means here):
        paths: The tar shards, read in this order when not shuffled.
        ext: Each output's part (the member name after the first dot of its
            base name), matched without regard to case. Every sample must
            hold each part; alternatives (``"jpg;png"``) are refused.
        dtypes: Each output's type (DALI's or numpy's); default ``uint8``.
        missing_component_behavior: Accepted: a sample without one of the
            parts is refused when the reader is built, naming its shard.
        index_paths, case_sensitive_extensions: Accepted and unused (stager
            indexes the shards' headers itself, its parts lower-cased).
        random_shuffle, seed, num_shards, shard_id, stick_to_shard,
            pad_last_batch, name, and the loader's tuning: as ``reader``.

    Keyword-only, stager's own: ``num_workers``, ``config``, ``world``, as ``reader``.

    Returns:
        One output per ``ext``: the external source's outputs.
    """
    _refuse_unknown("webdataset", loader_tuning, "paths, ext, index_paths, missing_component_behavior, dtypes")
    source = staged_source(lambda: EncodedParts.tar(paths, ext, _numpy_types(dtypes)), collate_parts, "webdataset",
                           shuffle=bool(random_shuffle), seeds=(seed,), num_shards=num_shards, shard_id=shard_id,
                           stick_to_shard=stick_to_shard, num_workers=num_workers, config=config, world=world)
    return _outputs(source)


def _outputs(source):
    """The external source of a shards reader: one output per part, of its type."""
    dataset = source.loader.dataset
    return fn.external_source(source=source, num_outputs=len(dataset.parts), batch=True, batch_info=True,
                              dtype=[types.to_dali_type(t) for t in dataset.dtypes], ndim=[1] * len(dataset.parts))


def _numpy_types(dtypes):
    """DALI's or numpy's types (one, or a list) as numpy's, or None."""
    if dtypes is None:
        return None
    return [types.to_numpy_type(d) if isinstance(d, types.DALIDataType) else np.dtype(d)
            for d in (dtypes if isinstance(dtypes, (list, tuple)) else [dtypes])]


def shards(source, parts, *, format="auto", dtypes=None, random_shuffle=False, seed=-1, num_shards=None,
           shard_id=None, stick_to_shard=False, endpoint_url=None, num_workers=READERS, config=None, world=None):
    """The chosen parts of every sample of tar or MDS shards, read through stager: call it in a pipeline's definition.

    DALI has no reader of MosaicML Streaming's MDS shards; this one gives
    each column as the bytes stored (a ``jpeg`` column's JPEG file, an
    ``int`` column's 8 bytes: ``dtypes=[types.INT64]`` reads it), so DALI's
    decoders take the images. Tar parts are as ``webdataset`` gives them.

    Args (``ShardDataset``'s and ``reader``'s, with what each means here):
        source: The directory holding the shards, or an object store's
            prefix (``s3://bucket/prefix``), as ``ShardDataset`` takes it.
        parts: Each output's tar part or MDS column.
        format: ``tar``, ``mds`` or ``auto`` (``dataset.format``).
        dtypes: Each output's type (DALI's or numpy's); default ``uint8``.
        random_shuffle, seed, num_shards, shard_id, stick_to_shard: As ``reader``.
        endpoint_url: An object store's URL, where it is not AWS.
        num_workers, config, world: stager's own, as ``reader``.

    Returns:
        One output per part: the external source's outputs.
    """
    source = staged_source(lambda: EncodedParts.everything(source, parts, format, _numpy_types(dtypes), endpoint_url),
                           collate_parts, "shards", shuffle=bool(random_shuffle), seeds=(seed,),
                           num_shards=num_shards, shard_id=shard_id, stick_to_shard=stick_to_shard,
                           num_workers=num_workers, config=config, world=world)
    return _outputs(source)
