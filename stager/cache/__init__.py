"""The node's local cache: which files are here, which are pinned, which a policy keeps."""

from .capacity import check_window, human, parse_capacity, resolve_capacity, window_bytes
from .depth import AUTO_DEPTH, MAX_DEPTH, MIN_DEPTH, depth_note, fitting_depth, lookahead_depth, needed_depth
from .policies import POLICIES, CacheFull, make_policy, policy_name
from .residency import ABSENT, IN_FLIGHT, STAGED, Cache

__all__ = ["ABSENT", "AUTO_DEPTH", "Cache", "CacheFull", "check_window", "depth_note", "fitting_depth", "IN_FLIGHT",
           "lookahead_depth", "MAX_DEPTH", "MIN_DEPTH", "needed_depth", "POLICIES", "STAGED", "human", "make_policy", "parse_capacity", "policy_name",
           "resolve_capacity", "window_bytes"]
