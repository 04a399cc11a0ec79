"""Node leaders share their caches over MPI (``staging.peers: partition``).

Each file has a holder at each step, the node that read it last
(``holders.py``: every node computes it from the plan, nothing is
exchanged). The first node to read a file reads it from the shared file
system; the next asks that node's leader for it (``protocol.py``,
``fetcher.py``, ``server.py``) and holds it from then on: always, by
default, so the shared file system, which every node and job shares, is
read once per file while the nodes together have room for it; with
``staging.peer_choice: measured`` when the measured rates (``model.py``)
say that is faster. Each holder keeps its files by when any node reads them
next. Nodes fall back to the shared file system when the holder no longer
has the file, or has not staged it or answered within the stall limit
(counted: ``files_after_peer``).
"""

from .holders import FirstReaders, LatestReaders, job_holders
from .node import Peers
from .ownership import NO_OWNER, first_epoch_owners, leader_of_rank

__all__ = ["FirstReaders", "LatestReaders", "NO_OWNER", "Peers", "first_epoch_owners", "job_holders",
           "leader_of_rank", "node_holders", "node_peers", "reads_from_source"]


def node_holders(link, spec, catalog):
    """This node leader's view of the job's holders (``job_holders``: who holds each file at each step).

    Args:
        link: ``world.split_leaders``'s result on this leader.
        spec: This rank's plan description (every rank's plan follows from it).
        catalog: The job's ``Catalog`` (its ``files`` are what nodes hold).
    """
    comm, node_of_rank = link
    return job_holders(spec, len(catalog.files), leader_of_rank(node_of_rank), comm.Get_rank(), catalog.file_index)


def reads_from_source(holders, file, seq):
    """Whether this node reads ``file`` from the shared file system for its step ``seq``, rather than asking a node.

    It does where no other node read it before (or reads it first at that
    step), and where one of its own ranks read it last.
    """
    return int(holders.holder([file], seq, holders.me)[0]) in (NO_OWNER, holders.me)


def node_peers(link, holders, source, root, threads, telemetry, choice="holder", wait_s=0.0, swaps=False):
    """The node leader's ``Peers``.

    Args:
        link: ``world.split_leaders``'s result on this leader.
        holders: ``node_holders``'s result.
        source: The ``Source``.
        root: The job's node-local directory.
        threads: Fetch threads.
        telemetry: The leader pipeline's ``Telemetry``.
        choice: ``staging.peer_choice``.
        wait_s: ``staging.stall_timeout_s``: how long a holder may take.
        swaps: ``staging.peer_swaps``: give a holder the file dropped to make
            room for one taken from it (``swaps.py``).
    """
    holders.swaps = holders.swaps and swaps
    return Peers(link[0], holders, source, root, threads, telemetry, choice, wait_s)
