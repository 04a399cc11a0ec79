"""The job tools' configuration sections: ``stager run``, the emulator, synthetic data, sbatch.

The engine never reads these; they share the YAML file (one typed ``Config``)
so that one file describes a whole job.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from .fields import check_choices, choice_field, path_field, require


@dataclass(frozen=True)
class SyntheticConfig:
    """A synthetic dataset, written at ``dataset.source`` by ``stager make-dataset --config`` (never by ``run``).

    Attributes:
        samples: Number of samples of the synthetic dataset that
            ``stager make-dataset --config`` writes at ``dataset.source``
            (never ``stager run``, which only reads it); 0 disables it.
        bytes: Approximate size of each ``.npy`` sample.
        classes: Number of distinct labels.
        seed: Seed of the random content.
        per_shard: Samples per container when ``dataset.format`` is tar or hdf5.
    """

    samples: int = 0
    bytes: int = 196_736
    classes: int = 10
    seed: int = 0
    per_shard: int = 1000

    def __post_init__(self):
        require(self.samples >= 0, "synthetic.samples must be 0 or more")
        require(self.per_shard >= 1, "synthetic.per_shard must be at least 1")
        require(self.bytes >= 1024, "synthetic.bytes must be at least 1024")
        require(self.classes >= 1, "synthetic.classes must be at least 1")



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
    engine: str = choice_field("auto", ("auto", "c", "python"))

    def __post_init__(self):
        check_choices(self, "slowfs")
        require(self.open_ms >= 0 and self.mbps >= 0, "slowfs.open_ms and slowfs.mbps must be 0 or more")



@dataclass(frozen=True)
class RunConfig:
    """The training-like loop of ``stager run``.

    Attributes:
        compute_ms: Simulated compute per step, in milliseconds.
        max_batches: Stop after this many minibatches; 0 = all.
        state_file: Where the job's position is saved, one file for all
            ranks written by rank 0, and read from at the next start, so that
            a stopped (SIGTERM, preemption) or failed job resumes exactly, on
            the same or another number of ranks. Removed when the run
            completes. None: no resume.
        state_every: With a state file, the ranks agree on their position
            and rank 0 saves it every this many steps (a collective, so the
            ranks keep within that many steps of each other), and when the
            run stops. A failure loses at most this many steps.
    """

    compute_ms: float = 0.0
    max_batches: int = 0
    state_file: Optional[str] = path_field(None)
    state_every: int = 1

    def __post_init__(self):
        require(self.compute_ms >= 0 and self.max_batches >= 0, "run.compute_ms and run.max_batches must be 0 or more")
        require(self.state_every >= 1, "run.state_every must be at least 1")



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
    venv: Optional[str] = path_field(None)
    local_dir: Optional[str] = path_field(None)
    command: List[str] = field(default_factory=list)

    def __post_init__(self):
        require(self.nodes >= 1 and self.tasks_per_node >= 1, "slurm.nodes and slurm.tasks_per_node must be at least 1")
        require(min(self.cpus_per_task, self.gpus_per_node, self.signal_s) >= 0,
                "slurm.cpus_per_task, slurm.gpus_per_node and slurm.signal_s must be 0 or more")
