"""Who this process is among the job's ranks, and which ranks share its node.

With an MPI launcher (mpiexec, mpirun, srun --mpi=pmi2), mpi4py gives the
rank, the size and, through ``Split_type(COMM_TYPE_SHARED)``, the ranks that
share this node. Under torchrun (or with a torch.distributed process group),
a gloo group does the same (``torchcomm.py``); a node is one torchrun agent
(``GROUP_RANK``) on one host. Without either, the launcher's variables give
rank and size (Open MPI, PMI, Slurm, torchrun), and each rank stages for
itself. mpi4py and torch are imported only when chosen, and only in the rank
process: prefetcher and reader children never initialise them.

``STAGER_NODE_ID`` overrides the node identity: ranks with equal values form
one node with its own staging directory. It emulates several nodes on one
machine, e.g. ``mpiexec -n 2 -env STAGER_NODE_ID a CMD : -n 2 -env STAGER_NODE_ID b CMD``.
"""

import importlib.util
import os
import socket
from dataclasses import dataclass
from typing import Any, Optional

from .torchcomm import TorchComm, has_env, launched_by_torchrun, node_group
from ..errors import StagerError

NODE_ENV = "STAGER_NODE_ID"

# Variables that only an MPI launcher (Hydra, ORTE/PRRTE, Slurm's PMI) sets.
_MPI_LAUNCH_VARS = ("PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")

# (rank, size, local rank, local size) as each launcher names them.
_ENV_SCHEMES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)


@dataclass(frozen=True)
class World:
    """This process's place in the job.

    Attributes:
        rank: Global rank.
        size: Number of ranks.
        node: Node name (``STAGER_NODE_ID`` if set, else the host name).
        node_index: Index of the node among the job's nodes (sorted names).
        nodes: Number of nodes.
        local_rank: Rank among the ranks of this node.
        local_size: Ranks on this node.
        comm: Communicator of all ranks: mpi4py's (a duplicate of
            COMM_WORLD) or a ``TorchComm``; None without either.
        node_comm: Communicator of this node's ranks, or None.
        source: How the world was found: ``mpi``, ``torch``, ``env:<VAR>``
            or ``single``.
        host_shared: Several of the job's nodes run on this machine (several
            torchrun agents), so each needs a directory of its own.
    """

    rank: int = 0
    size: int = 1
    node: str = ""
    node_index: int = 0
    nodes: int = 1
    local_rank: int = 0
    local_size: int = 1
    comm: Optional[Any] = None
    node_comm: Optional[Any] = None
    source: str = "single"
    host_shared: bool = False

    @property
    def node_leader(self):
        """True on the rank that runs its node's staging service."""
        return self.local_rank == 0 or self.node_comm is None

    @property
    def emulated_node(self):
        """True when the machine holds several of the job's nodes (``STAGER_NODE_ID``, several agents)."""
        return self.host_shared or bool(os.environ.get(NODE_ENV))


def _launched_by_mpi():
    return any(v in os.environ for v in _MPI_LAUNCH_VARS)


def _grouped(comm, name, source, node_comm=None, host_shared=False):
    """The World of ``comm``'s ranks, a node being the ranks of one ``name`` (collective)."""
    ordered = sorted(set(comm.allgather(name)))
    if node_comm is None:
        node_comm = comm.Split(ordered.index(name), comm.Get_rank())
    return World(rank=comm.Get_rank(), size=comm.Get_size(), node=name, node_index=ordered.index(name),
                 nodes=len(ordered), local_rank=node_comm.Get_rank(), local_size=node_comm.Get_size(),
                 comm=comm, node_comm=node_comm, source=source, host_shared=host_shared)


def _from_mpi():
    from mpi4py import MPI  # deferred: never imported by workers or MPI-less runs

    comm = MPI.COMM_WORLD.Dup()  # our collectives never mix with the user's
    override = os.environ.get(NODE_ENV)
    if override:
        return _grouped(comm, override, "mpi")
    return _grouped(comm, MPI.Get_processor_name(), "mpi", comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank()))


def _from_torch():
    comm = TorchComm.world()
    override = os.environ.get(NODE_ENV)
    if override:
        return _grouped(comm, override, "torch")
    host, group = socket.gethostname(), node_group()
    # One agent per node is the rule; several on one host are told apart.
    shared = len({g for h, g in comm.allgather((host, group)) if h == host}) > 1
    return _grouped(comm, f"{host}-{group}" if shared else host, "torch", host_shared=shared)


def _from_env():
    node = os.environ.get(NODE_ENV) or socket.gethostname()
    for rank_var, size_var, local_var, local_size_var in _ENV_SCHEMES:
        if rank_var in os.environ and size_var in os.environ:
            try:
                rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
                local = int(os.environ.get(local_var, 0))
                local_size = int(os.environ.get(local_size_var, 1)) if local_size_var else 1
            except ValueError as exc:
                raise StagerError(f"launcher variable {rank_var}/{size_var} is not an integer: {exc}") from None
            if not 0 <= rank < size:
                raise StagerError(f"{rank_var}={rank} is outside {size_var}={size}")
            # Without a communicator the ranks cannot share a staging
            # service, so each one stages for itself (its own "node").
            return World(rank=rank, size=size, node=node, node_index=rank, nodes=size, local_rank=local,
                         local_size=local_size, source=f"env:{rank_var}")
    return World(node=node)


def _choose(mpi):
    """The backend ``auto`` means here (see ``config.WorldConfig``)."""
    if mpi == "on":
        return "mpi"
    # torchrun's variables win over MPI's: under srun, torchrun's workers
    # inherit the PMI variables of the task that runs the agent.
    if launched_by_torchrun():
        return "torch"
    if mpi == "auto" and _launched_by_mpi() and importlib.util.find_spec("mpi4py"):
        return "mpi"
    if has_env() and importlib.util.find_spec("torch"):
        return "torch"
    return "none"


def detect(mpi="auto", backend="auto"):
    """Finds this process's world (collective with the mpi and torch backends).

    Args:
        mpi: ``world.mpi``: ``auto`` (MPI when an MPI launcher started us),
            ``on`` or ``off``; how ``backend="auto"`` considers MPI.
        backend: ``world.backend``: ``auto``, ``mpi``, ``torch`` or ``none``.

    Returns:
        A World.
    """
    if backend == "auto":
        backend = _choose(mpi)
    if backend == "mpi":
        try:
            return _from_mpi()
        except ImportError:
            raise StagerError("world.backend is 'mpi' (or world.mpi is 'on') but mpi4py cannot be imported") \
                from None
    if backend == "torch":
        return _from_torch()
    return _from_env()


