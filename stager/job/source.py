"""Making a job's source readable: synthetic data and the slow file system emulator."""

import os

from ..config import config_from_dict
from ..errors import ConfigError, StagerError
from ..slowfs import SlowFS
from ..world import agree
from .synth import MANIFEST, make_dataset


def ensure_synthetic(cfg, progress=True):
    """Creates the synthetic dataset that ``cfg.synthetic`` describes, if absent.

    Returns:
        The config, with ``dataset.manifest`` set to the dataset's manifest.
    """
    syn, src = cfg.synthetic, cfg.dataset.source
    if not syn.samples:
        return cfg
    if not src:
        raise ConfigError("synthetic.samples is set but dataset.source is empty")
    manifest = os.path.join(src, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as fh:
            count = sum(1 for line in fh if line.strip())
        if count != syn.samples:
            raise ConfigError(f"{manifest} lists {count} samples but synthetic.samples is {syn.samples}; "
                              f"remove {src} to regenerate it, or set synthetic.samples={count}")
    else:
        make_dataset(src, syn.samples, syn.bytes, syn.classes, syn.seed, progress=progress)
    return cfg.replace(dataset={"manifest": MANIFEST})


def prepare_source(cfg, stack, progress=True, world=None):
    """Makes the configured source readable, mounting the emulator in ``stack`` if asked.

    Under MPI only rank 0 creates the synthetic dataset and mounts the
    emulator (a single-machine tool); the other ranks receive the result.

    Returns:
        The config whose ``dataset.source`` is where the pipeline should read.
    """
    comm = world.comm if world is not None else None

    def prepare():
        prepared = ensure_synthetic(cfg, progress)
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
