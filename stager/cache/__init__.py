"""The node's local cache: which files are here, which are pinned, which a policy keeps."""

from .capacity import check_window, human, parse_capacity, resolve_capacity, window_bytes
from .policies import POLICIES, CacheFull, make_policy, policy_name
from .residency import ABSENT, IN_FLIGHT, STAGED, Cache

__all__ = ["ABSENT", "Cache", "CacheFull", "check_window", "IN_FLIGHT", "POLICIES", "STAGED", "human", "make_policy",
           "parse_capacity", "policy_name", "resolve_capacity", "window_bytes"]
