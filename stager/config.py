"""One typed configuration object, loaded from YAML with strict checking.

A YAML file has one mapping per section (``dataset``, ``plan``, ...). Unknown
sections or keys and values of the wrong type are rejected with the offending
key, the expected type and the list of valid keys with their defaults, so a
typo never silently falls back to a default.
"""

import dataclasses
import multiprocessing
import os
import typing
from dataclasses import dataclass, field
from typing import List, Optional

import yaml

from .errors import ConfigError


def _path(default=None):
    # Paths given relative in a YAML file are resolved against the file's
    # directory, so a config works whatever the current directory is.
    return field(default=default, metadata={"path": True})


@dataclass(frozen=True)
class DatasetConfig:
    """Where the samples live and how to decode them.

    Attributes:
        source: Dataset root on the shared file system (read only).
        manifest: Manifest file (relative path per line, optional label after
            a tab). Relative to ``source`` unless absolute. None: scan the tree.
        loader: ``raw``, ``npy``, ``hdf5`` or ``module:function`` taking a path.
        hdf5_key: Dataset name inside each ``.h5`` file for the hdf5 loader.
        extensions: When scanning, keep only files with these suffixes.
    """

    source: str = _path("")
    manifest: Optional[str] = None
    loader: str = "npy"
    hdf5_key: str = "data"
    extensions: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class SyntheticConfig:
    """A synthetic dataset that ``stager run`` creates at ``dataset.source`` if absent.

    Attributes:
        samples: Number of samples; 0 disables generation.
        bytes: Approximate size of each ``.npy`` sample.
        classes: Number of distinct labels.
        seed: Seed of the random content.
    """

    samples: int = 0
    bytes: int = 196_736
    classes: int = 10
    seed: int = 0


@dataclass(frozen=True)
class SlowfsConfig:
    """The emulated slow shared file system that ``stager run`` mounts over the source.

    Attributes:
        enabled: Mount ``dataset.source`` through the emulator for the run.
        open_ms: Latency added to every open, in milliseconds.
        mbps: Shared read bandwidth cap in MB/s (10^6 bytes); 0 = unlimited.
        engine: ``auto`` (the C daemon where it can be built, else Python),
            ``c`` or ``python``.
    """

    enabled: bool = False
    open_ms: float = 10.0
    mbps: float = 0.0
    engine: str = "auto"


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
    """

    enabled: bool = True
    local_dir: Optional[str] = _path(None)
    job_id: Optional[str] = None
    prefetchers: int = 4
    lookahead: int = 16
    files_per_task: int = 0
    keep: bool = False


@dataclass(frozen=True)
class ReaderConfig:
    """Turning staged files into decoded minibatches (stage 3).

    Attributes:
        workers: Reader processes.
        ahead: Minibatches decoded ahead of the consumer; 0 = 2 x workers.
    """

    workers: int = 2
    ahead: int = 0


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


@dataclass(frozen=True)
class WorldConfig:
    """How ranks find each other.

    Attributes:
        mpi: ``auto`` uses mpi4py when an MPI launcher started the process
            (mpiexec, mpirun, srun --mpi=pmi2); ``on`` always initialises MPI;
            ``off`` never does and reads the launcher's variables instead.
    """

    mpi: str = "auto"


@dataclass(frozen=True)
class RunConfig:
    """The training-like loop of ``stager run``.

    Attributes:
        compute_ms: Simulated compute per step, in milliseconds.
        max_batches: Stop after this many minibatches; 0 = all.
        state_file: Where the position is saved when the run is stopped
            (SIGTERM, preemption) and read from at the next start, so that a
            requeued job resumes exactly; ``.rank<r>`` is appended under MPI.
            Removed when the run completes. None: no resume.
    """

    compute_ms: float = 0.0
    max_batches: int = 0
    state_file: Optional[str] = _path(None)


@dataclass(frozen=True)
class SlurmConfig:
    """What ``stager slurm render`` puts into an sbatch script.

    Attributes:
        template: ``srun`` (multi-node, srun --mpi=pmi2), ``mpirun``
            (mpiexec inside the allocation) or ``single`` (one node).
        job_name: ``--job-name``.
        nodes: ``--nodes``.
        tasks_per_node: ``--ntasks-per-node`` (one rank per GPU).
        cpus_per_task: ``--cpus-per-task``; 0 leaves it out.
        gpus_per_node: ``--gpus-per-node``; 0 leaves it out.
        time: ``--time`` limit, e.g. ``01:00:00``.
        partition: ``--partition``, or null.
        account: ``--account``, or null.
        signal_s: Seconds before the time limit at which Slurm sends SIGTERM
            (``--signal``), so the job stops cleanly and saves its position.
        requeue: ``--requeue``: a preempted job goes back to the queue.
        output: ``--output`` file pattern.
        venv: The virtual environment with stager; null: the one rendering.
        local_dir: Node-local base directory; null: ``staging.local_dir``,
            then ``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp`` on each node.
        command: The job step's command as a list of words; empty: ``stager
            run CONFIG``.
    """

    template: str = "srun"
    job_name: str = "stager"
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 0
    gpus_per_node: int = 0
    time: str = "01:00:00"
    partition: Optional[str] = None
    account: Optional[str] = None
    signal_s: int = 120
    requeue: bool = False
    output: str = "stager-%j.out"
    venv: Optional[str] = _path(None)
    local_dir: Optional[str] = _path(None)
    command: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Config:
    """The whole configuration; every section has defaults."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    slowfs: SlowfsConfig = field(default_factory=SlowfsConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    staging: StagingConfig = field(default_factory=StagingConfig)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    processes: ProcessesConfig = field(default_factory=ProcessesConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    run: RunConfig = field(default_factory=RunConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    def to_dict(self):
        """Returns the configuration as nested plain dictionaries."""
        return dataclasses.asdict(self)

    def replace(self, **sections):
        """Returns a copy with some values changed, e.g. ``replace(plan={"epochs": 2})``."""
        return _build(Config, _merge(self.to_dict(), sections), base_dir=None, where="")


def _merge(base, updates):
    out = dict(base)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _type_name(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if origin in (list, List):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return tp.__name__


def _coerce(value, tp, key):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        try:
            return _coerce(value, inner, key)
        except ConfigError:
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})") from None
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return [_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    # bool is an int in Python; a YAML "yes" for an int key is a mistake.
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _describe(cls):
    lines = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
            lines.append(f"  {f.name}: (section)")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  {f.name} = {default!r}")
    return "\n".join(lines)


def _build(cls, data, base_dir, where):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        section = where or "top level"
        raise ConfigError(
            f"unknown key(s) {', '.join(repr(where + '.' + k if where else k) for k in unknown)}"
            f" in {section}; valid keys with their defaults:\n{_describe(cls)}")
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, base_dir, key)
            continue
        value = _coerce(value, tp, key)
        if names[name].metadata.get("path") and value and base_dir is not None:
            value = os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))
        kwargs[name] = value
    cfg = cls(**kwargs)
    if cls is Config:
        _validate(cfg)
    return cfg


def _validate(cfg):
    checks = [
        (cfg.plan.batch_size >= 1, "plan.batch_size must be at least 1"),
        (cfg.plan.epochs >= 0, "plan.epochs must be 0 (repeat) or more"),
        (cfg.plan.remainder in ("pad", "drop"), "plan.remainder must be 'pad' or 'drop'"),
        (cfg.world.mpi in ("auto", "on", "off"), "world.mpi must be 'auto', 'on' or 'off'"),
        (cfg.staging.prefetchers >= 1, "staging.prefetchers must be at least 1"),
        (cfg.staging.lookahead >= 1, "staging.lookahead must be at least 1"),
        (cfg.staging.files_per_task >= 0, "staging.files_per_task must be 0 (automatic) or more"),
        (cfg.reader.workers >= 1, "reader.workers must be at least 1"),
        (cfg.reader.ahead >= 0, "reader.ahead must be 0 (auto) or more"),
        (cfg.synthetic.samples >= 0, "synthetic.samples must be 0 or more"),
        (cfg.synthetic.bytes >= 1024, "synthetic.bytes must be at least 1024"),
        (cfg.synthetic.classes >= 1, "synthetic.classes must be at least 1"),
        (cfg.slowfs.open_ms >= 0 and cfg.slowfs.mbps >= 0, "slowfs.open_ms and slowfs.mbps must be 0 or more"),
        (cfg.slowfs.engine in ("auto", "c", "python"),
         f"slowfs.engine must be auto, c or python, not {cfg.slowfs.engine!r}"),
        (cfg.processes.shutdown_timeout_s > 0, "processes.shutdown_timeout_s must be positive"),
        (cfg.processes.start_method in multiprocessing.get_all_start_methods(),
         f"processes.start_method must be one of {multiprocessing.get_all_start_methods()}"),
        (cfg.run.compute_ms >= 0 and cfg.run.max_batches >= 0, "run.compute_ms and run.max_batches must be 0 or more"),
        (cfg.slurm.nodes >= 1 and cfg.slurm.tasks_per_node >= 1, "slurm.nodes and slurm.tasks_per_node must be at least 1"),
        (min(cfg.slurm.cpus_per_task, cfg.slurm.gpus_per_node, cfg.slurm.signal_s) >= 0,
         "slurm.cpus_per_task, slurm.gpus_per_node and slurm.signal_s must be 0 or more"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    from .loaders import check_loader_name
    check_loader_name(cfg.dataset.loader)


def config_from_dict(data, base_dir=None):
    """Builds a Config from nested dictionaries.

    Args:
        data: Mapping of section name to mapping of key to value.
        base_dir: Directory that relative paths are resolved against; None
            leaves them as given.

    Returns:
        The validated Config.

    Raises:
        ConfigError: On an unknown key, a wrong type or an invalid value.
    """
    return _build(Config, data, base_dir, "")


def parse_overrides(pairs):
    """Turns ``["plan.epochs=2", ...]`` into nested dictionaries.

    Values are parsed as YAML scalars, so ``true``, ``3`` and ``null`` work.
    """
    out = {}
    for pair in pairs or ():
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r}: expected key=value, e.g. plan.epochs=2")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {pair!r}: {part} is not a section")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return out


def load_config(path=None, overrides=None):
    """Loads a YAML config file and applies ``key=value`` overrides.

    Args:
        path: YAML file, or None for all defaults.
        overrides: Iterable of ``section.key=value`` strings.

    Returns:
        The validated Config.

    Raises:
        ConfigError: Naming the file and the offending key.
    """
    data = {}
    base_dir = os.getcwd()
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        base_dir = os.path.dirname(os.path.abspath(path))
    try:
        cfg = _build(Config, data, base_dir, "")
        over = parse_overrides(overrides)
        if over:
            # Overrides come from the command line: resolve relative paths
            # against the current directory, as a shell user expects.
            cfg = _build(Config, _merge(cfg.to_dict(), over), os.getcwd(), "")
    except ConfigError as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None
    return cfg
