"""Several jobs of one user on one node sharing a staging service (``staging.share``).

The service runs in its own process (``daemon.py``), started by the first
job that names the group and ended by the last one to leave; every rank of
every attached job is its client (``attach.py``). ``loop.py`` is the
service's scheduling state, the node service's own with jobs told apart,
and ``shelf.py`` the shared memory through which jobs with the same order
and decoding receive each minibatch decoded once.
"""

from .attach import attach, find_or_claim, join, probe_dir, stream_key

__all__ = ["attach", "find_or_claim", "join", "probe_dir", "stream_key"]
