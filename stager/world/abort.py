"""One rank's failure ends the whole job: ``MPI_Abort``, or an immediate exit under torchrun.

Without it, a rank that fails leaves its peers waiting in a collective
until the allocation ends.
"""

import contextlib
import os
import sys
import traceback

from ..errors import StagerError


def _abort(world, text, code):
    how = ("aborting the MPI job" if world.source == "mpi" else
           "exiting at once; the launcher stops the other ranks (torchrun: its agent)")
    sys.stderr.write(f"stager: rank {world.rank} of {world.size} on {world.node}: {text}\n"
                     f"stager: {how} so that no rank waits for this one\n")
    sys.stderr.flush()
    if world.source == "mpi":
        _unlink_own_mpich_segments()
    world.comm.Abort(code)


def _unlink_own_mpich_segments():
    """Removes the names of the MPICH shared-memory segments this process has mapped.

    MPICH unlinks its node's ``/dev/shm/mpich_shm_*`` segment in
    ``MPI_Finalize``; after ``MPI_Abort`` nobody does, and one is left per
    node and aborted job. Those this process maps are certainly its own job's
    (its node's ranks share it), so their names can go: the ranks still
    using them keep their mappings. Other nodes' segments are out of reach
    (their ranks are killed without running any code).
    """
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if "/dev/shm/mpich_shm_" in line}
    except (OSError, IndexError):
        return
    for path in paths:
        if path.startswith("/dev/shm/mpich_shm_") and "/" not in path[len("/dev/shm/"):]:
            try:
                os.unlink(path)
            except OSError:
                pass  # another rank of the node was first, or it is not ours to remove


def _error_text(exc):
    return f"error: {type(exc).__name__}: {exc}"


def announce_error(world, exc):
    """Writes this rank's error now, before the clean-up that ``abort_on_error`` lets run first.

    A node leader's clean-up ends its node's staging service, and a
    neighbour that finds the service gone may end the job with its own,
    secondary error before this rank reaches ``MPI_Abort``: the cause would
    never be printed. ``abort_on_error`` then says only that it aborts.
    """
    if world.comm is None or world.size == 1:
        return
    sys.stderr.write(f"stager: rank {world.rank} of {world.size} on {world.node}: {_error_text(exc)}\n")
    sys.stderr.flush()
    exc.stager_announced = True


@contextlib.contextmanager
def abort_on_error(world):
    """Ends the whole job when the block raises an exception.

    Under MPI through ``MPI_Abort``; under torch.distributed this rank exits
    at once and the launcher stops the others (``TorchComm.Abort``). The
    block's own clean-up (``with`` blocks inside it) runs first. Without a
    communicator, or with one rank, the exception simply propagates.
    SystemExit and KeyboardInterrupt propagate too: a signal reaches every
    rank, and each cleans up on its own.
    """
    try:
        yield
    except Exception as exc:
        if world.comm is None or world.size == 1:
            raise
        text = "the error written above" if getattr(exc, "stager_announced", False) else _error_text(exc)
        _abort(world, text, 2 if isinstance(exc, StagerError) else 1)


def install_abort_hook(world):
    """Makes an uncaught exception on any rank end the whole job.

    Without it, one rank's failure leaves its peers waiting in a collective
    until the allocation ends. The hook prints the rank and the error, then
    calls ``MPI_Abort`` (MPI) or exits at once for the launcher to stop the
    others (torch.distributed). Nothing happens without a communicator.
    """
    if world.comm is None:
        return

    def hook(kind, value, tb):
        _abort(world, "uncaught error:\n" + "".join(traceback.format_exception(kind, value, tb)), 1)

    sys.excepthook = hook
