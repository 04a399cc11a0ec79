"""Strict YAML loading into the typed ``Config``.

Unknown sections or keys and values of the wrong type are rejected with the
offending key, the expected type and the list of valid keys with their
defaults, so a typo never silently falls back to a default.
"""

import dataclasses
import os
import typing
from typing import List

import yaml

from ..errors import ConfigError
from .root import Config


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


def merge(base, updates):
    out = dict(base)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _type_name(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        names = " or ".join(_type_name(a) for a in inner)
        return f"{names} or null" if len(inner) < len(typing.get_args(tp)) else names
    if origin in (list, List):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return tp.__name__


def _coerce(value, tp, key):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        if value is None and type(None) in typing.get_args(tp):
            return None
        # The alternatives in order: ``Union[int, str]`` keeps a number a number.
        for inner in (a for a in typing.get_args(tp) if a is not type(None)):
            try:
                return _coerce(value, inner, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return [_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    # bool is an int in Python; a YAML "yes" for an int key is a mistake.
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if tp is str and isinstance(value, bool):
        # YAML 1.1 reads a bare on/off (world.mpi: off) as a boolean; the
        # key's own check then says whether "on"/"off" is a valid value.
        return "on" if value else "off"
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _describe(cls):
    lines = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
            lines.append(f"  {f.name}: (section)")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  {f.name} = {default!r}")
    return "\n".join(lines)


def build(cls, data, base_dir, where):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        section = where or "top level"
        raise ConfigError(
            f"unknown key(s) {', '.join(repr(where + '.' + k if where else k) for k in unknown)}"
            f" in {section}; valid keys with their defaults:\n{_describe(cls)}")
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, value, base_dir, key)
            continue
        value = _coerce(value, tp, key)
        if names[name].metadata.get("path") and value and base_dir is not None and "://" not in value:
            value = os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))
        kwargs[name] = value
    return cls(**kwargs)


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
