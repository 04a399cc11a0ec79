"""What the front ends share: turning their arguments into stager's parts."""

from stager.catalog import Catalog
from stager.catalog_file import agreed_catalog
from stager.config import Config, config_from_dict
from stager.world import detect


def resolve(config, world=None, catalog=None, overrides=None):
    """Returns ``(config, world, catalog)`` for a front end.

    Args:
        config: A ``Config``, nested dictionaries of config values, or a
            ``Catalog`` (its files, with the default settings).
        world: A ``World``; default: detected from the config.
        catalog: A ``Catalog``; default: built on rank 0 and broadcast, or
            mapped from ``dataset.catalog`` (``catalog_file.agreed_catalog``).
        overrides: Nested dictionaries applied on top of ``config``.
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
    world = world if world is not None else detect(config.world.mpi)
    if catalog is None:
        catalog = agreed_catalog(world.comm, config.dataset)
    return config, world, catalog
