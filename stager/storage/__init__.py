"""Node-local storage: the base directory, the job's directory, and what cleans up after a job.

``basedir`` is the rule a base directory must pass; ``jobdir`` chooses,
creates (0700, locked) and removes the job's directory; ``janitor`` removes
it when its owner is killed; ``leftovers`` finds and removes directories
whose job is gone (at a leader's start, ``stager clean``); ``space`` sizes
the node cache from the free space when nobody said (``staging.capacity:
auto``).

May import: ``errors``, ``cache`` (its capacity arithmetic).
"""

from .basedir import check_base
from .janitor import Janitor
from .jobdir import LOCAL_DIR_ENV, JobDir, agreed_job_id, local_base, named_local_base
from .leftovers import clean, live_jobs, sweep
from .space import AUTO_SHARE, auto_capacity, free_share, staging_capacity

__all__ = ["AUTO_SHARE", "Janitor", "JobDir", "LOCAL_DIR_ENV", "agreed_job_id", "auto_capacity", "check_base",
           "clean", "free_share", "live_jobs", "local_base", "named_local_base", "staging_capacity", "sweep"]
