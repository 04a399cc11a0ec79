"""One typed configuration object, loaded from YAML with strict checking.

A YAML file has one mapping per section (``dataset``, ``plan``, ...). The
library's sections are in ``library.py``, the job tools' in ``job.py``; the
strict loader in ``loading.py``.
"""

from .job import RunConfig, SlowfsConfig, SlurmConfig, SyntheticConfig
from .library import DatasetConfig, PlanConfig, ReaderConfig, StagingConfig
from .loading import config_from_dict, load_config, parse_overrides
from .root import Config
from .runtime import ProcessesConfig, WorldConfig

__all__ = ["Config", "DatasetConfig", "PlanConfig", "ProcessesConfig", "ReaderConfig", "RunConfig",
           "SlowfsConfig", "SlurmConfig", "StagingConfig", "SyntheticConfig", "WorldConfig", "config_from_dict",
           "load_config", "parse_overrides"]
