"""stager: stage training samples from a slow shared file system to node-local
storage minibatch by minibatch, overlapped with training."""

from .catalog import Catalog, ShardCatalog
from .config import Config, config_from_dict, load_config
from .engine import Batch, Pipeline
from .errors import CatalogError, ConfigError, StageError, StagerError

__version__ = "0.2.0"

__all__ = ["Batch", "Catalog", "CatalogError", "Config", "ConfigError", "Pipeline", "ShardCatalog", "StageError",
           "StagerError", "config_from_dict", "load_config", "__version__"]
