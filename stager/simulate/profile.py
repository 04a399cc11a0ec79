"""What the simulator cannot run and so models: the machine a job runs on, as a typed YAML profile.

A profile has four sections. ``filesystem`` is the shared file system every
node reads (its metadata service and bandwidth are shared by all of them,
and by other jobs), ``node`` one compute node (cores, local storage),
``network`` the links between nodes that peers use, ``costs`` the CPU each
stage spends per file (a prefetcher's copy, a reader's decode, the rank's
own share) and the compute of a training step. Unknown keys are refused with
the valid ones and their defaults, as the job config's are.

The node costs can come from ``stager whatif``'s calibration of this machine
(``with_rates``); the file system's and the network's are the cluster's,
from its documentation or a measurement.
"""

from dataclasses import dataclass, field, replace
from typing import List, Optional

import yaml

from ..config.schema import build
from ..errors import ConfigError


def _check(ok, message):
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class FileSystemProfile:
    """The shared file system.

    Attributes:
        open_ms: Latency of one open (a metadata round trip), paid by the
            prefetcher that opens; opens of different clients overlap.
        mds_ops_per_s: Opens per second the metadata service completes for
            all clients together; 0: no limit.
        client_mbps: Read bandwidth of one node's client, MB/s (10^6 bytes); 0: no limit.
        aggregate_mbps: Read bandwidth of the whole file system, MB/s; 0: no limit.
        other_load: Share (0 to below 1) of the metadata service and of the
            aggregate bandwidth taken by other jobs.
        open_ms_changes: The latency changing during the job (another job's
            checkpoint burst, a loaded metadata server): ``[[at_s, open_ms],
            ...]``, from ``at_s`` seconds of simulated time on, opens take
            ``open_ms``; times in increasing order. Empty: ``open_ms`` throughout.
    """

    open_ms: float = 10.0
    mds_ops_per_s: float = 0.0
    client_mbps: float = 0.0
    aggregate_mbps: float = 0.0
    other_load: float = 0.0
    open_ms_changes: List[List[float]] = field(default_factory=list)

    def __post_init__(self):
        _check(min(self.open_ms, self.mds_ops_per_s, self.client_mbps, self.aggregate_mbps) >= 0,
               "filesystem: open_ms, mds_ops_per_s, client_mbps and aggregate_mbps must be 0 or more")
        _check(0 <= self.other_load < 1, f"filesystem.other_load must be in [0, 1), not {self.other_load}")
        for i, change in enumerate(self.open_ms_changes):
            _check(len(change) == 2 and min(change) >= 0,
                   f"filesystem.open_ms_changes[{i}]: expected [at_s, open_ms], both 0 or more, not {change}")
        times = [c[0] for c in self.open_ms_changes]
        _check(times == sorted(set(times)), f"filesystem.open_ms_changes: times must increase, not {times}")

    def open_ms_at(self, t):
        """The latency of an open that starts ``t`` seconds into the job."""
        latency = self.open_ms
        for at_s, open_ms in self.open_ms_changes:
            if t < at_s:
                break
            latency = open_ms
        return latency


@dataclass(frozen=True)
class NodeProfile:
    """One compute node.

    Attributes:
        cores: CPU cores the stages of a node share.
        shared_host: Every simulated node shares one host's cores (emulated
            nodes on one machine, as this project's tests run them).
        local_gb: Node-local storage in GB (10^9 bytes), for ``staging.capacity``
            given as a share or ``auto``.
        local_mbps: Node-local storage's bandwidth, MB/s, shared by the
            prefetchers' writes and the readers' reads; 0: no limit.
        shared_copy_ms: With ``shared_host``, the CPU a fetched file costs
            more for each other node on the host (``costs.copy_ms`` is one
            node's): nodes that share cores slow each other's work (measured
            here: 0.44, 0.69 and 1.04 ms a file at 1, 2 and 4 nodes).
        startup_s: Seconds from the job's start to its first request (the
            stages forked, the catalog agreed), in the first epoch of the
            methods that start stager's stages (not ``direct``).
    """

    cores: float = 16.0
    shared_host: bool = False
    local_gb: float = 1000.0
    local_mbps: float = 0.0
    shared_copy_ms: float = 0.0
    startup_s: float = 0.0

    def __post_init__(self):
        _check(self.cores > 0 and self.local_gb > 0, "node.cores and node.local_gb must be above 0")
        _check(self.local_mbps >= 0 and self.shared_copy_ms >= 0 and self.startup_s >= 0,
               "node.local_mbps, node.shared_copy_ms and node.startup_s must be 0 or more")

    def copy_ms(self, costs, nodes):
        """The CPU a fetched file costs a prefetcher when ``nodes`` nodes run (``costs.copy_ms`` at one)."""
        return costs.copy_ms + (self.shared_copy_ms * (nodes - 1) if self.shared_host else 0.0)


@dataclass(frozen=True)
class NetworkProfile:
    """The links between nodes, for peers.

    Attributes:
        latency_ms: Round trip of one request to another node.
        node_mbps: One node's link, MB/s; 0: no limit.
    """

    latency_ms: float = 0.05
    node_mbps: float = 10_000.0

    def __post_init__(self):
        _check(self.latency_ms >= 0 and self.node_mbps >= 0, "network.latency_ms and network.node_mbps must be 0 or more")


@dataclass(frozen=True)
class CostsProfile:
    """CPU per unit of work, and the training step.

    Attributes:
        copy_ms: A prefetcher's (or peer fetch thread's) own CPU per file:
            the copy, the publication, the messages.
        read_ms: A reader's CPU per sample: reading the local copy and decoding.
        batch_ms: A reader's CPU per minibatch beyond its samples.
        main_ms: The rank's own CPU per sample (scheduling, receiving arrays).
        compute_ms: The training step per minibatch (on the accelerator:
            it takes no core); null: ``run.compute_ms`` of the job's config.
    """

    copy_ms: float = 0.3
    read_ms: float = 1.0
    batch_ms: float = 0.0
    main_ms: float = 0.02
    compute_ms: Optional[float] = None

    def __post_init__(self):
        _check(min(self.copy_ms, self.read_ms, self.batch_ms, self.main_ms) >= 0
               and (self.compute_ms is None or self.compute_ms >= 0), "costs: every time must be 0 or more")


@dataclass(frozen=True)
class Profile:
    """The machine a simulated job runs on (see the module's docstring)."""

    filesystem: FileSystemProfile = field(default_factory=FileSystemProfile)
    node: NodeProfile = field(default_factory=NodeProfile)
    network: NetworkProfile = field(default_factory=NetworkProfile)
    costs: CostsProfile = field(default_factory=CostsProfile)

    def with_rates(self, rates):
        """This profile with the node's costs and cores of a ``whatif`` calibration (``engine.perf.Rates``).

        A prefetcher's cost here is CPU held on a core. A calibration has two
        figures for it: the probe's CPU per file less the reader's share
        (``cpu_s``, which also counts the kernel's work for a file read once,
        cold, in one process) and the prefetchers' time per file beyond the
        latency (``copy_s``, from a run's report with ``--report``: a wall
        time). The smaller is taken: each counts more than the prefetcher's
        own work, in a different way. A run's start (``rates.startup_s``)
        replaces the profile's when measured.
        """
        copy_s = rates.copy_s
        if rates.cpu_s:
            copy_s = min(copy_s, max(0.0, rates.cpu_s - rates.read_s))
        costs = replace(self.costs, copy_ms=1e3 * copy_s, read_ms=1e3 * rates.read_s,
                        batch_ms=1e3 * rates.batch_s, main_ms=1e3 * rates.main_s)
        return replace(self, costs=costs, node=replace(self.node, cores=rates.cores,
                                                       startup_s=rates.startup_s or self.node.startup_s))

    def set(self, pairs):
        """This profile with ``section.key=value`` overrides (values in YAML syntax)."""
        data = self.to_dict()
        for pair in pairs or ():
            key, sep, text = pair.partition("=")
            section, dot, name = key.strip().partition(".")
            if not sep or not dot:
                raise ConfigError(f"profile override {pair!r}: expected section.key=value")
            data.setdefault(section, {})[name] = yaml.safe_load(text)
        return profile_from_dict(data)

    def to_dict(self):
        return {name: dict(vars(getattr(self, name))) for name in ("filesystem", "node", "network", "costs")}


def profile_from_dict(data):
    """A ``Profile`` from nested dictionaries; unknown keys are refused, naming them and the valid ones."""
    return build(Profile, data or {}, None, "")


def load_profile(path=None, overrides=None):
    """Reads a profile YAML file (None: the defaults), then ``section.key=value`` overrides.

    Raises:
        ConfigError: For a file that cannot be read or parsed, or an invalid key or value.
    """
    data = {}
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read profile {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"profile {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"profile {path}: expected a mapping of sections, got {type(data).__name__}")
    try:
        return profile_from_dict(data).set(overrides)
    except ConfigError as exc:
        raise ConfigError(f"profile {path or '(defaults)'}: {exc}") from None
