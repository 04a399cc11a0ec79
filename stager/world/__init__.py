"""Who this process is among the job's ranks, which ranks share its node, and how they agree.

``detect`` finds the world (MPI through mpi4py, torch.distributed through a
gloo group of stager's own in ``torchcomm``, the launcher's variables, or
one process); ``collective`` holds the few collectives stager needs
(``agree``, ``everyone``, ``split_leaders``); ``abort`` ends the whole job
when one rank fails.

May import: ``errors``.
"""

from .abort import abort_on_error, announce_error, install_abort_hook
from .collective import agree, everyone, split_leaders
from .detect import NODE_ENV, World, detect
from .torchcomm import TorchComm

__all__ = ["NODE_ENV", "TorchComm", "World", "abort_on_error", "agree", "announce_error", "detect", "everyone",
           "install_abort_hook", "split_leaders"]
