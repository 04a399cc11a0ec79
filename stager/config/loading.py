"""Strict YAML loading into the typed ``Config``: files, dictionaries and ``key=value`` overrides.

Keys given twice in one YAML mapping are refused here; everything else a
value must satisfy is checked by ``schema.build`` and the sections' own
checks.
"""

import os

import yaml

from .root import Config
from .schema import build, merge
from ..errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"duplicate key {key!r} at lines {seen[key]} and {line}; give each key once")
            seen[key] = line
        return super().construct_mapping(node, deep)


def config_from_dict(data, base_dir=None):
    """Builds a Config from nested dictionaries.

    Args:
        data: Mapping of section name to mapping of key to value.
        base_dir: Directory that relative paths are resolved against; None
            leaves them as given.

    Returns:
        The validated Config.

    Raises:
        ConfigError: On an unknown key, a wrong type or an invalid value.
    """
    return build(Config, data, base_dir, "")


def parse_overrides(pairs):
    """Turns ``["plan.epochs=2", ...]`` into nested dictionaries.

    Values are parsed as YAML scalars, so ``true``, ``3`` and ``null`` work.
    """
    out = {}
    for pair in pairs or ():
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r}: expected key=value, e.g. plan.epochs=2")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {pair!r}: {part} is not a section")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return out


def load_config(path=None, overrides=None):
    """Loads a YAML config file and applies ``key=value`` overrides.

    Args:
        path: YAML file, or None for all defaults.
        overrides: Iterable of ``section.key=value`` strings.

    Returns:
        The validated Config.

    Raises:
        ConfigError: Naming the file and the offending key.
    """
    data = {}
    base_dir = os.getcwd()
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.load(fh, Loader=_UniqueKeyLoader) or {}
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        base_dir = os.path.dirname(os.path.abspath(path))
    try:
        cfg = build(Config, data, base_dir, "")
        over = parse_overrides(overrides)
        if over:
            # Overrides come from the command line: resolve relative paths
            # against the current directory, as a shell user expects.
            cfg = build(Config, merge(cfg.to_dict(), over), os.getcwd(), "")
    except ConfigError as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None
    return cfg
