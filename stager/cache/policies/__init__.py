"""Cache policies, chosen by name (``staging.cache_policy``), one small module each.

A policy decides which of the node's local files stay once no minibatch in
flight needs them, and which go when room is needed. It sees the ``Cache``
(residency, sizes, pins and every rank's plan description) and returns
catalog indices; it never touches files itself. Files pinned by a minibatch
in flight or being read are never offered to it.

Interface of a policy object:

- ``released(cache, indices)``: files that just lost their last pin; returns
  those to remove now.
- ``victims(cache, nbytes)``: returns unpinned local files to remove so that
  ``nbytes`` more fit.
"""

from ...errors import ConfigError
from .unbounded import Unbounded

POLICIES = {"unbounded": Unbounded}


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
