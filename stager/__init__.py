"""stager: stage training samples from a slow shared file system to node-local
storage minibatch by minibatch, overlapped with training."""

from .catalog import Catalog
from .config import Config, config_from_dict, load_config
from .errors import CatalogError, ConfigError, StageError, StagerError
from .coordinator import Batch
from .pipeline import Pipeline

__version__ = "0.1.0"

__all__ = ["Batch", "Catalog", "CatalogError", "Config", "ConfigError", "Pipeline", "StageError",
           "StagerError", "config_from_dict", "load_config", "__version__"]
