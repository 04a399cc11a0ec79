"""The node's local cache: which files are here, which are pinned, which a policy keeps."""

from .policies import POLICIES, make_policy
from .residency import ABSENT, IN_FLIGHT, STAGED, Cache

__all__ = ["ABSENT", "Cache", "IN_FLIGHT", "POLICIES", "STAGED", "make_policy"]
