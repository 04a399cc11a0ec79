"""Cache policies, chosen by name (``staging.cache_policy``), one small module each.

A policy decides which of the node's local files stay once no minibatch in
flight needs them, and which go when room is needed. It sees the ``Cache``
(residency, sizes, pins and every rank's plan description) and returns
catalog indices; it never touches files itself. Files pinned by a minibatch
in flight or being read are never offered to it.

Interface of a policy object:

- ``released(cache, indices)``: files that just lost their last pin; returns
  those to remove now.
- ``victims(cache, nbytes)``: returns unpinned local files (``cache.evictable()``)
  to remove so that ``nbytes`` more fit; fewer when it cannot free that much.
"""

from ...errors import ConfigError
from .clairvoyant import Clairvoyant
from .minio import MinIO
from .none import CacheFull, NoEviction
from .recency import FIFO, LRU
from .unbounded import Unbounded

POLICIES = {"clairvoyant": Clairvoyant, "lru": LRU, "fifo": FIFO, "minio": MinIO, "none": NoEviction,
            "unbounded": Unbounded}


def policy_name(configured, capacity):
    """The policy ``staging.cache_policy`` means: ``auto`` is clairvoyant with a capacity, else unbounded."""
    if configured == "auto":
        return "unbounded" if capacity is None else "clairvoyant"
    return configured


def make_policy(name):
    """A new policy object for ``name``.

    Raises:
        ConfigError: For an unknown name, listing the known ones.
    """
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(f"staging.cache_policy: unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") \
            from None


__all__ = ["CacheFull", "POLICIES", "make_policy", "policy_name"]
