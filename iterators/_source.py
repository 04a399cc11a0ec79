"""What the front ends share: turning their arguments into stager's parts."""

import os

from stager import load_config
from stager.catalog import Catalog, agreed_catalog, broadcast_catalog
from stager.config import Config, config_from_dict
from stager.sources import within
from stager.world import detect

CONFIG_ENV = "STAGER_CONFIG"  # a YAML file of site defaults (local directory, capacity, prefetchers, peers)


def staging_settings(config):
    """The staging settings: ``config=`` (a Config or dict), else ``$STAGER_CONFIG``'s file, else the defaults."""
    if config is None:
        return load_config(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else Config()
    if isinstance(config, dict):
        return config_from_dict(config)
    if isinstance(config, Config):
        return config
    raise TypeError(f"config must be a stager Config or a dict of its values, got {type(config).__name__}")


def resolve(config, world=None, catalog=None, overrides=None, build=None):
    """Returns ``(config, world, catalog)`` for a front end.

    Args:
        config: A ``Config``, nested dictionaries of config values, or a
            ``Catalog`` (its files, with the default settings).
        world: A ``World``; default: detected from the config.
        catalog: A ``Catalog``; default: built on rank 0 and broadcast, or
            mapped from ``dataset.catalog`` (``stager.catalog.agreed_catalog``).
        overrides: Nested dictionaries applied on top of ``config``.
        build: Callable returning the ``Catalog``, run on rank 0 when
            ``catalog`` is None; default: ``stager.catalog.load_catalog(config.dataset)``.
    """
    if isinstance(config, Catalog):
        catalog, config = config, config_from_dict({"dataset": {"source": config.root}})
    if not isinstance(config, Config):
        if not isinstance(config, dict):
            raise TypeError(f"expected a stager Config, a dict of config values or a Catalog, got "
                            f"{type(config).__name__}")
        config = config_from_dict(config)
    if overrides:
        config = config.replace(**overrides)
    world = world if world is not None else detect(config.world.mpi, config.world.backend)
    if catalog is None:
        limit = config.staging.stall_timeout_s  # every read of the source has a deadline
        catalog = (broadcast_catalog(world.comm, lambda: within(limit, build)) if build is not None
                   else agreed_catalog(world.comm, config.dataset, limit))
    return config, world, catalog
