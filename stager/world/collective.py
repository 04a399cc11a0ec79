"""Collectives stager needs from any world: one rank's result for all, every rank's failure for all.

``agree`` and ``everyone`` keep a rank that failed from leaving the others
waiting in the next collective; ``split_leaders`` makes the node leaders'
communicator for peers.
"""


def agree(comm, produce, error, root=0):
    """Runs ``produce()`` on rank ``root`` and gives its result to every rank.

    One rank reads the shared file system or sets something up for all; if
    it fails, every rank must learn so, or the others would wait forever.

    Args:
        comm: mpi4py communicator, or None (then ``produce()`` is returned).
        produce: Callable run on ``root``; its result must be picklable.
        error: Callable ``(text) -> exception`` raised on the other ranks
            when ``produce`` failed; ``text`` is ``"<Type>: <message>"``.
        root: The rank that runs ``produce``.

    Returns:
        ``produce()``'s result, on every rank.

    Raises:
        The original exception on ``root``, ``error(text)`` elsewhere.
    """
    if comm is None:
        return produce()
    outcome, failure = None, None
    if comm.Get_rank() == root:
        try:
            outcome = ("ok", produce())
        except Exception as exc:
            failure = exc
            outcome = ("error", f"{type(exc).__name__}: {exc}")
    outcome = comm.bcast(outcome, root=root)
    if outcome[0] == "error":
        if failure is not None:
            raise failure
        raise error(outcome[1])
    return outcome[1]


def everyone(comm, produce, error):
    """Runs ``produce()`` on every rank; if it fails on any, every rank raises.

    For work each rank does on its own before the next collective (mapping a
    file, writing its part of one): a rank that failed alone would leave the
    others waiting in that collective.

    Args:
        comm: mpi4py communicator, or None (then ``produce()`` is returned).
        produce: Callable run on every rank.
        error: Callable ``(rank, text) -> exception`` raised on the ranks
            that did not fail, for the first rank that did.

    Returns:
        This rank's ``produce()`` result.
    """
    if comm is None:
        return produce()
    result, failure, text = None, None, None
    try:
        result = produce()
    except Exception as exc:
        failure, text = exc, f"{type(exc).__name__}: {exc}"
    texts = comm.allgather(text)
    if failure is not None:
        raise failure
    for rank, text in enumerate(texts):
        if text is not None:
            raise error(rank, text)
    return result


def split_leaders(world):
    """Collective on ``world.comm`` (every rank calls it): the node leaders' communicator.

    Returns:
        ``(comm, node_of_rank)``: an mpi4py communicator of the node leaders,
        ranked by global rank, on leaders (None elsewhere), and every rank's
        ``node_index``.
    """
    from mpi4py import MPI  # deferred, as everywhere here

    node_of_rank = world.comm.allgather(world.node_index)
    comm = world.comm.Split(0 if world.node_leader else MPI.UNDEFINED, world.rank)
    return (None if comm == MPI.COMM_NULL else comm), node_of_rank
