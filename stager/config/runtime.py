"""The sections on how a job's processes run: how children start and stop, how ranks find each other.

Each checks its own values when it is made, as the library's sections do.
"""

import multiprocessing
from dataclasses import dataclass

from .fields import check_choices, choice_field, require


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

    start_method: str = choice_field("fork", multiprocessing.get_all_start_methods)
    shutdown_timeout_s: float = 5.0
    peer_wait_s: float = 300.0

    def __post_init__(self):
        check_choices(self, "processes")
        require(self.shutdown_timeout_s > 0, "processes.shutdown_timeout_s must be positive")



@dataclass(frozen=True)
class WorldConfig:
    """How ranks find each other.

    Attributes:
        mpi: ``auto`` uses mpi4py when an MPI launcher started the process
            (mpiexec, mpirun, srun --mpi=pmi2); ``on`` always initialises MPI;
            ``off`` never does and reads the launcher's variables instead.
        backend: What the ranks' collectives go through. ``auto``:
            torch.distributed when a process group is initialised or torchrun
            started the process, else MPI as ``mpi`` says, else
            torch.distributed when ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
            ``WORLD_SIZE`` are set, else none. ``mpi``, ``torch``: that one;
            ``none``: launcher variables only, each rank staging for itself.
    """

    mpi: str = choice_field("auto", ("auto", "on", "off"))
    backend: str = choice_field("auto", ("auto", "mpi", "torch", "none"))

    def __post_init__(self):
        check_choices(self, "world")
