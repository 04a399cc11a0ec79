"""Node leaders share their caches over MPI (``staging.peers: partition``).

Each file has an owner, the node that reads it in the plan's first epoch
(``ownership.py``: every node computes it from the plan, nothing is
exchanged). The owner reads it from the shared file system and keeps it
while it can; other nodes ask the owner's leader for it (``protocol.py``,
``fetcher.py``, ``server.py``): always, by default, so the shared file
system, which every node and job shares, is read once per file; with
``staging.peer_choice: measured`` when the measured rates (``model.py``)
say that is faster. They fall back to the shared file system when the
owner no longer has it, or has not staged it or answered within the stall
limit (counted: ``files_after_peer``).
"""

from .node import Peers
from .ownership import NO_OWNER, first_epoch_owners, leader_of_rank

__all__ = ["NO_OWNER", "Peers", "first_epoch_owners", "leader_of_rank", "node_peers"]


def node_peers(link, spec, catalog, source, root, threads, telemetry, choice="holder", wait_s=0.0):
    """The node leader's ``Peers``.

    Args:
        link: ``world.split_leaders``'s result on this leader.
        spec: This rank's plan description (every rank's plan follows from it).
        catalog: The job's ``Catalog`` (its ``files`` are what nodes hold).
        source: The ``Source``.
        root: The job's node-local directory.
        threads: Fetch threads.
        telemetry: The leader pipeline's ``Telemetry``.
        choice: ``staging.peer_choice``.
        wait_s: ``staging.stall_timeout_s``: how long a holder may take.
    """
    comm, node_of_rank = link
    owners = first_epoch_owners(spec, len(catalog.files), len(node_of_rank), leader_of_rank(node_of_rank),
                                catalog.file_index)
    return Peers(comm, owners, source, root, threads, telemetry, choice, wait_s)
