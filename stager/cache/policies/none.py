"""``none``: keep everything, and stop with a clear error when the capacity is reached."""

from ...errors import StagerError
from ..capacity import human


class CacheFull(StagerError):
    """The cache reached its capacity under policy ``none``."""


class NoEviction:
    """Never removes a file; a fetch that does not fit is an error."""

    name = "none"

    def released(self, cache, indices):
        return []

    def victims(self, cache, nbytes):
        raise CacheFull(f"staging.capacity {human(cache.capacity)} is full ({human(cache.used)} staged or being "
                        f"fetched, {human(nbytes)} more needed) and staging.cache_policy is none: raise "
                        "staging.capacity, or choose a policy that evicts (clairvoyant, lru, fifo, minio)")
