"""torch.distributed as the ranks' communicator, for jobs started by torchrun.

``TorchComm`` offers the few mpi4py communicator methods the engine uses
(``Get_rank``, ``Get_size``, ``bcast``, ``Bcast``, ``allgather``, ``gather``,
``Barrier``, ``Split``, ``Abort``) over a gloo process group of stager's own,
so catalog, job id, service address and report travel as they do under MPI.
torch is imported only here, and only when this backend is chosen.

The group is a new gloo group beside the default one: stager's collectives
never interleave with the user's (DDP's asynchronous all-reduces included),
and they run on the CPU even when the user's default group is NCCL. When no
default group exists yet, stager initialises it from the launcher's
variables (``env://``, gloo); a script that wants NCCL initialises its own
group before stager starts.
"""

import atexit
import os
import sys

import numpy as np

from ..errors import StagerError

# What torchrun (or any launcher following its convention) sets for env://.
ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def launched_by_torchrun():
    """True when torchrun started this process, or a torch process group is already initialised here."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return True
    dist = sys.modules.get("torch.distributed")  # never import torch (seconds) just to ask
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def has_env():
    """True when the variables of an ``env://`` rendezvous are all set."""
    return all(os.environ.get(v) for v in ENV_VARS)


def node_group():
    """The launcher's name for this process's node group: torchrun's ``GROUP_RANK``, or None.

    torchrun runs one agent per node; several agents on one machine (tests,
    ``--nnodes`` on a workstation) are as many nodes.
    """
    return os.environ.get("GROUP_RANK")


class TorchComm:
    """A gloo process group with the mpi4py methods stager calls.

    Args:
        group: A ``torch.distributed`` process group (gloo) this rank belongs to.
    """

    def __init__(self, group):
        self._group = group

    @classmethod
    def world(cls):
        """A new gloo group of all ranks (collective: every rank calls it).

        Raises:
            StagerError: If torch.distributed is unavailable, or no group is
                initialised and the ``env://`` variables are missing.
        """
        try:
            import torch.distributed as dist
        except ImportError:
            raise StagerError("world.backend is 'torch' but torch cannot be imported") from None
        if not dist.is_available():
            raise StagerError("world.backend is 'torch' but this torch build has no torch.distributed")
        if not dist.is_initialized():
            missing = [v for v in ENV_VARS if not os.environ.get(v)]
            if missing:
                raise StagerError(f"world.backend is 'torch' but no process group is initialised and "
                                  f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
                                  "(start the job with torchrun, or call torch.distributed.init_process_group)")
            dist.init_process_group("gloo")
            # stager made the group, so stager ends it, before the interpreter
            # tears torch down (gloo's threads can abort a process at exit).
            atexit.register(_destroy_default_group)
        return cls(dist.new_group(backend="gloo"))

    def Get_rank(self):
        import torch.distributed as dist

        return dist.get_rank(self._group)

    def Get_size(self):
        import torch.distributed as dist

        return dist.get_world_size(self._group)

    def bcast(self, obj, root=0):
        """Rank ``root``'s picklable ``obj``, on every rank."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, group_src=root, group=self._group)
        return box[0]

    def Bcast(self, array, root=0):
        """Fills the numpy ``array`` on every rank with rank ``root``'s, in place (a buffer broadcast)."""
        import torch
        import torch.distributed as dist

        # torch shares only writable, contiguous memory; anything else goes
        # through a copy, which a receiving rank copies back.
        direct = array.flags.writeable and array.flags.c_contiguous
        tensor = torch.from_numpy(array if direct else np.array(array))
        dist.broadcast(tensor, group_src=root, group=self._group)
        if not direct and self.Get_rank() != root:
            np.copyto(array, tensor.numpy())

    def allgather(self, obj):
        """Every rank's picklable ``obj``, in rank order, on every rank."""
        import torch.distributed as dist

        out = [None] * self.Get_size()
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def gather(self, obj, root=0):
        """Every rank's ``obj`` in rank order on rank ``root``; None elsewhere."""
        import torch.distributed as dist

        out = [None] * self.Get_size() if self.Get_rank() == root else None
        dist.gather_object(obj, out, group_dst=root, group=self._group)
        return out

    def Barrier(self):
        import torch.distributed as dist

        dist.barrier(group=self._group)

    def Split(self, color, key=0):
        """The ranks of equal ``color`` as a group of their own (collective).

        Unlike MPI, ranks keep the order of their global ranks (``key`` is
        accepted for the same call shape; stager passes the rank).
        """
        import torch.distributed as dist

        pairs = self.allgather((color, dist.get_rank()))
        mine = None
        # torch wants every rank in the creation of every group, in one order.
        for c in sorted({c for c, _ in pairs}):
            group = dist.new_group(sorted(r for cc, r in pairs if cc == c), backend="gloo")
            if c == color:
                mine = group
        return TorchComm(mine)

    def Abort(self, code=1):
        """Ends this process at once with ``code``.

        There is no job-wide abort in torch.distributed: the launcher stops
        the other ranks when one exits non-zero (torchrun's agent sends them
        SIGTERM), and their gloo collectives with this rank fail as soon as
        its sockets close. Exiting without the interpreter's teardown means
        no thread or process-group destructor can delay that exit.
        """
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _destroy_default_group():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
