"""Building typed dataclasses from nested dictionaries, strictly.

Unknown keys and values of the wrong type are rejected with the offending
key, the expected type and the list of valid keys with their defaults, so a
typo never silently falls back to a default. Generic over the sections: it
knows no section by name.
"""

import dataclasses
import os
import typing
from typing import List

from ..errors import ConfigError


def merge(base, updates):
    out = dict(base)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def type_name(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        names = " or ".join(type_name(a) for a in inner)
        return f"{names} or null" if len(inner) < len(typing.get_args(tp)) else names
    if origin in (list, List):
        return f"list of {type_name(typing.get_args(tp)[0])}"
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
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r} ({type(value).__name__})")
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}")
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
    raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r} ({type(value).__name__})")


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
