"""The library's configuration sections: what a training job's pipeline reads.

Each section checks its own values when it is made, so an invalid value is
refused with the key at fault wherever the section comes from (YAML, a
dictionary, ``Config.replace``).
"""

import multiprocessing
from dataclasses import dataclass, field
from typing import List, Optional

from ..errors import ConfigError


def path_field(default=None):
    """A path-valued key: relative paths in a YAML file are resolved against the file's directory."""
    return field(default=default, metadata={"path": True})


def require(ok, message):
    """Raises ``ConfigError(message)`` unless ``ok``."""
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class DatasetConfig:
    """Where the samples live and how to decode them.

    Attributes:
        source: Dataset root on the shared file system (read only).
        manifest: Manifest file (relative path per line, optional label after
            a tab). Relative to ``source`` unless absolute. None: scan the tree.
        loader: ``raw``, ``npy``, ``hdf5`` or ``module:function`` taking a path.
        hdf5_key: Dataset name inside each ``.h5`` file for the hdf5 loader.
        layout: What the ``image`` loader returns: ``hwc`` (uint8, height x
            width x channels, as decoded) or ``chw`` (float32, channels
            first, Chainer's ``LabeledImageDataset`` layout).
        extensions: When scanning, keep only files with these suffixes.
    """

    source: str = path_field("")
    manifest: Optional[str] = None
    loader: str = "npy"
    hdf5_key: str = "data"
    layout: str = "hwc"
    extensions: List[str] = field(default_factory=list)

    def __post_init__(self):
        from ..loaders import check_loader_name  # the registry lives with the loaders

        check_loader_name(self.loader)
        require(self.layout in ("hwc", "chw"), f"dataset.layout must be 'hwc' or 'chw', not {self.layout!r}")



@dataclass(frozen=True)
class PlanConfig:
    """What order samples are read in (stage 1).

    Attributes:
        batch_size: Samples per minibatch.
        epochs: Epochs to run; 0 repeats without end.
        seed: Seed of every epoch's permutation (combined with the epoch).
        shuffle: Permute each epoch; False reads in catalog order.
        drop_last: Drop the last, short minibatch of each epoch.
        remainder: Under MPI, when the sample count is not a multiple of the
            number of ranks: ``pad`` repeats a few samples so every rank reads
            as many, ``drop`` leaves a few out of that epoch.
    """

    batch_size: int = 32
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    remainder: str = "pad"

    def __post_init__(self):
        require(self.batch_size >= 1, "plan.batch_size must be at least 1")
        require(self.epochs >= 0, "plan.epochs must be 0 (repeat) or more")
        require(self.remainder in ("pad", "drop"), "plan.remainder must be 'pad' or 'drop'")



@dataclass(frozen=True)
class StagingConfig:
    """Copying minibatches to node-local storage ahead of use (stage 2).

    Attributes:
        enabled: False reads the source directly (the baseline).
        local_dir: Node-local base directory. None: ``$SLURM_TMPDIR``, then
            ``$TMPDIR``, then ``/tmp``.
        job_id: Name of this job's directory under local_dir. None:
            ``$SLURM_JOB_ID``, else a generated id.
        prefetchers: Prefetcher processes.
        lookahead: Minibatches staged ahead of the one being consumed.
        files_per_task: Files a prefetcher copies per task; 0 = a
            minibatch's missing files spread over all prefetchers, so the
            first minibatch is ready after a few opens, not a whole batch.
        keep: Keep the job's staging directory after the run.
        cache_policy: Which files stay local once read (``cache.policies``):
            ``unbounded`` keeps every file until the job ends.
    """

    enabled: bool = True
    local_dir: Optional[str] = path_field(None)
    job_id: Optional[str] = None
    prefetchers: int = 4
    lookahead: int = 16
    files_per_task: int = 0
    keep: bool = False
    cache_policy: str = "unbounded"

    def __post_init__(self):
        from ..cache.policies import POLICIES  # the registry lives with the cache

        require(self.cache_policy in POLICIES, f"staging.cache_policy must be one of {sorted(POLICIES)}, "
                                               f"not {self.cache_policy!r}")
        require(self.prefetchers >= 1, "staging.prefetchers must be at least 1")
        require(self.lookahead >= 1, "staging.lookahead must be at least 1")
        require(self.files_per_task >= 0, "staging.files_per_task must be 0 (automatic) or more")



@dataclass(frozen=True)
class ReaderConfig:
    """Turning staged files into decoded minibatches (stage 3).

    Attributes:
        workers: Reader processes.
        ahead: Minibatches decoded ahead of the consumer; 0 = 2 x workers.
    """

    workers: int = 2
    ahead: int = 0

    def __post_init__(self):
        require(self.workers >= 1, "reader.workers must be at least 1")
        require(self.ahead >= 0, "reader.ahead must be 0 (auto) or more")



@dataclass(frozen=True)
class ProcessesConfig:
    """How child processes are started and stopped.

    Attributes:
        start_method: ``fork``, ``spawn`` or ``forkserver``.
        shutdown_timeout_s: Time children get to exit before being terminated.
        peer_wait_s: How long a node leader waits at the end for the node's
            other ranks to finish reading before it removes the staging
            directory.
    """

    start_method: str = "fork"
    shutdown_timeout_s: float = 5.0
    peer_wait_s: float = 300.0

    def __post_init__(self):
        require(self.shutdown_timeout_s > 0, "processes.shutdown_timeout_s must be positive")
        methods = multiprocessing.get_all_start_methods()
        require(self.start_method in methods, f"processes.start_method must be one of {methods}")



@dataclass(frozen=True)
class WorldConfig:
    """How ranks find each other.

    Attributes:
        mpi: ``auto`` uses mpi4py when an MPI launcher started the process
            (mpiexec, mpirun, srun --mpi=pmi2); ``on`` always initialises MPI;
            ``off`` never does and reads the launcher's variables instead.
    """

    mpi: str = "auto"

    def __post_init__(self):
        require(self.mpi in ("auto", "on", "off"), "world.mpi must be 'auto', 'on' or 'off'")
