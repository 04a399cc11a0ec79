"""The configuration reference, read from the schema itself: it cannot drift from what the loader accepts.

Every key of every section with its YAML type, its default, its allowed
values (``choice_field``) and the description its section's docstring
gives under ``Attributes:``. The documentation site renders ``markdown()``;
``keys()`` is what a test holds against the schema (a key without a
description is a gap in the reference).
"""

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import List, Optional

from .fields import choices_of
from .root import Config
from .schema import type_name


@dataclass(frozen=True)
class Key:
    """One configuration key as the reference shows it."""

    section: str
    name: str
    type: str
    default: object
    choices: Optional[List[str]]
    description: str

    @property
    def path(self):
        return f"{self.section}.{self.name}"


def attribute_docs(cls):
    """``{name: description}`` from the ``Attributes:`` section of ``cls``'s Google-style docstring."""
    doc = cls.__doc__ or ""
    if "Attributes:" not in doc:
        return {}
    out, name = {}, None
    for line in doc.split("Attributes:", 1)[1].splitlines():
        entry = re.match(r"^ {8}(\w+): ?(.*)$", line)
        if entry:
            name = entry.group(1)
            out[name] = entry.group(2).strip()
        elif name and line.startswith(" " * 12):
            out[name] += " " + line.strip()
        elif line.strip():
            break  # the next docstring section
    return out


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


def sections():
    """``[(section name, section class)]`` in the order of ``Config``."""
    hints = typing.get_type_hints(Config)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(Config)]


def keys():
    """Every key of the configuration, section by section."""
    out = []
    for section, cls in sections():
        docs, hints = attribute_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out.append(Key(section, f.name, type_name(hints[f.name]), _default(f), choices_of(f),
                           docs.get(f.name, "")))
    return out


def _code(value):
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return "`[]`" if not value else "`" + ", ".join(map(str, value)) + "`"
    return f"`{value}`" if value != "" else '`""`'


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def markdown():
    """The reference page, one table per section."""
    lines = ["# Configuration reference", "",
             "Every key stager's YAML loader accepts, generated from the schema (`stager/config`). An unknown key "
             "is refused, naming it and listing the valid keys with their defaults. `stager config [FILE] "
             "[--set KEY=VALUE]` prints the effective configuration; `--set` takes any key below as "
             "`section.key=value`. (Written by `scripts/docs_reference.py` from the sections' docstrings: edit "
             "those, not this page.)", ""]
    by_section = {}
    for key in keys():
        by_section.setdefault(key.section, []).append(key)
    for section, cls in sections():
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        lines += [f"## `{section}`", "", summary, "", "| key | type | default | allowed | description |",
                  "|---|---|---|---|---|"]
        for key in by_section[section]:
            allowed = ", ".join(f"`{c}`" for c in key.choices) if key.choices else ""
            lines.append(f"| `{key.name}` | {key.type} | {_cell(_code(key.default))} | {allowed} | "
                         f"{_cell(key.description)} |")
        lines.append("")
    return "\n".join(lines)
