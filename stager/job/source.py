"""Making a job's source readable, and the synthetic data that only the commands for it write.

``prepare_source`` checks that the configured source is there and mounts
the slow file system emulator over it when asked; it never creates,
fills or writes the source (a mistyped path must end the run, not become a
dataset). ``write_synthetic`` writes the dataset a config's ``synthetic``
section describes, for ``stager make-dataset --config`` and ``stager demo``.
"""

import os

from ..config import config_from_dict
from ..errors import ConfigError, StagerError
from ..slowfs import SlowFS
from ..sources import reading, within
from ..world import agree
from .synth import MANIFEST, make_dataset


def write_synthetic(cfg, progress=True):
    """Writes the synthetic dataset of ``cfg.synthetic`` at ``cfg.dataset.source``, unless it is there.

    Returns:
        ``(manifest path, written)``: ``written`` is False when a matching
        dataset was already there.

    Raises:
        ConfigError: No samples asked for, a source that is not a local
            directory (a URL), or a dataset there of another size.
    """
    syn, src = cfg.synthetic, cfg.dataset.source
    if not syn.samples:
        raise ConfigError("synthetic.samples is 0: the config describes no synthetic dataset to write")
    if not src:
        raise ConfigError("dataset.source is empty: nowhere to write the synthetic dataset")
    if "://" in src:
        raise ConfigError(f"dataset.source {src} is not a local directory: synthetic data is written only to "
                          "local directories; put a dataset in the object store with its own tools, or point "
                          "dataset.source at a directory")
    manifest = os.path.join(src, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as fh:
            count = sum(1 for line in fh if line.strip())
        if cfg.dataset.format in ("tar", "hdf5"):
            count = _packed_samples(cfg, count)
        if count != syn.samples:
            raise ConfigError(f"{manifest} lists {count} samples but synthetic.samples is {syn.samples}; "
                              f"remove {src} to write it again, or set synthetic.samples={count}")
        return manifest, False
    if os.path.isdir(src) and os.listdir(src):
        raise ConfigError(f"{src} already holds files but no {MANIFEST}: synthetic data is written only into a "
                          "new or empty directory")
    if cfg.dataset.format in ("tar", "hdf5"):
        from .packing import make_shards

        return make_shards(src, cfg.dataset.format, syn.samples, syn.bytes, syn.classes, syn.seed, syn.per_shard,
                           progress=progress), True
    return make_dataset(src, syn.samples, syn.bytes, syn.classes, syn.seed, progress=progress), True


def _packed_samples(cfg, containers):
    """Samples in a synthetic set of ``containers`` containers as ``synthetic`` would write them."""
    syn = cfg.synthetic
    return syn.samples if containers == -(-syn.samples // syn.per_shard) else containers * syn.per_shard


def check_source(cfg):
    """Refuses a file-tree source that is missing or not a directory, naming it (never creates it)."""
    src = cfg.dataset.source
    if not src:
        raise ConfigError("dataset.source is not set")
    if "://" in src and not src.startswith("file://"):
        return  # an object store: its listing says whether the prefix holds objects
    path = src[len("file://"):] if src.startswith("file://") else src
    hint = (" (the config's synthetic section describes a dataset: `stager make-dataset --config CONFIG` writes it "
            "there)" if cfg.synthetic.samples else "")
    with reading("stat", path):
        exists, isdir = os.path.exists(path), os.path.isdir(path)
    if not exists:
        raise ConfigError(f"dataset.source {path} does not exist{hint}; stager never creates a dataset for a run")
    if not isdir:
        raise ConfigError(f"dataset.source {path} is not a directory")


def check_outputs(cfg, **paths):
    """Refuses, before anything is written, an output that is a URL or lies inside a file-tree source.

    Args:
        paths: What the run writes, by the option that names it
            (``--record``, ``--report``, ``run.state_file``); None where unused.

    Raises:
        ConfigError: Naming the option and the path.
    """
    src = cfg.dataset.source
    root = None
    if src and ("://" not in src or src.startswith("file://")):
        root = os.path.realpath(src[len("file://"):] if src.startswith("file://") else src)
    for option, path in paths.items():
        if not path:
            continue
        if "://" in str(path):
            raise ConfigError(f"{option} {path} is not a local path: stager writes its outputs to local files")
        real = os.path.realpath(path)
        if root is not None and os.path.commonpath([real, root]) == root:
            raise ConfigError(f"{option} {path} lies inside dataset.source {root}: stager never writes into the "
                              "source; write it elsewhere")


def prepare_source(cfg, stack, progress=True, world=None):
    """Checks the configured source and mounts the emulator over it in ``stack`` if asked.

    Under MPI only rank 0 checks and mounts (the emulator is a
    single-machine tool); the other ranks receive the result.

    Args:
        progress: Unused; kept for callers of earlier versions.

    Returns:
        The config whose ``dataset.source`` is where the pipeline should read.
    """
    comm = world.comm if world is not None else None

    def prepare():
        within(cfg.staging.stall_timeout_s, check_source, cfg)  # a hung source fails here, not forever
        prepared = cfg
        if prepared.slowfs.enabled:
            mnt = stack.enter_context(SlowFS(prepared.dataset.source, open_ms=prepared.slowfs.open_ms,
                                             mbps=prepared.slowfs.mbps, engine=prepared.slowfs.engine))
            manifest = prepared.dataset.manifest
            if manifest and os.path.isabs(manifest):
                manifest = os.path.relpath(manifest, prepared.dataset.source)
            prepared = prepared.replace(dataset={"source": mnt, "manifest": manifest})
        return prepared.to_dict()

    prepared = agree(comm, prepare, lambda text: StagerError(f"rank 0 could not prepare the dataset: {text}"))
    if comm is None:
        return config_from_dict(prepared)

    def leave_together(exc_type, exc, tb):
        # Rank 0 unmounts after every rank is done reading; on an error a
        # peer may never arrive, and the job is being aborted anyway.
        if exc_type is None:
            comm.Barrier()

    stack.push(leave_together)
    return config_from_dict(prepared)
