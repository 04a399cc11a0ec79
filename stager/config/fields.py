"""What the configuration sections are made of: path and choice keys, and the checks every section uses.

``choice_field`` declares a key's allowed values (a tuple, or a function
naming a registry's entries, imported only when asked), ``check_choices``
refuses any other with the key and the valid values, and the configuration
reference (``reference.py``) lists them, so the three cannot disagree.
"""

from dataclasses import field, fields

from ..errors import ConfigError


def path_field(default=None):
    """A path-valued key: relative paths in a YAML file are resolved against the file's directory."""
    return field(default=default, metadata={"path": True})


def choice_field(default, choices):
    """A key whose value is one of ``choices``: a tuple, or a function returning a registry's names.

    ``check_choices`` refuses any other value; the configuration reference
    lists them.
    """
    return field(default=default, metadata={"choices": choices})


def choices_of(f):
    """The allowed values of dataclass field ``f`` (a list), or None when any value of its type is."""
    choices = f.metadata.get("choices")
    if choices is None:
        return None
    return list(choices() if callable(choices) else choices)


def check_choices(section, name):
    """Refuses a value outside its key's choices, naming the key (``name.key``) and the valid values."""
    for f in fields(section):
        allowed = choices_of(f)
        value = getattr(section, f.name)
        if allowed is None or value in allowed:
            continue
        if callable(f.metadata["choices"]):  # a registry: its names, sorted
            raise ConfigError(f"{name}.{f.name} must be one of {allowed}, not {value!r}")
        listed = ", ".join(repr(c) for c in allowed[:-1]) + f" or {allowed[-1]!r}"
        raise ConfigError(f"{name}.{f.name} must be {listed}, not {value!r}")


def shuffles():
    """The names of ``plan.shuffles.SHUFFLES``."""
    from ..plan.shuffles import SHUFFLES  # the registries live with the plan

    return sorted(SHUFFLES)


def splits():
    """The names of ``plan.splits.SPLITS``."""
    from ..plan.splits import SPLITS

    return sorted(SPLITS)


def policies():
    """``auto``, then the names of ``cache.POLICIES``."""
    from ..cache import POLICIES  # the registry lives with the cache

    return ["auto", *sorted(POLICIES)]


def verify_modes():
    """The names of ``sources.verify.MODES``."""
    from ..sources.verify import MODES  # the modes live with the check

    return list(MODES)


def decoded_modes():
    """The names of ``decoded.MODES``."""
    from ..decoded.tier import MODES  # the modes live with the tier

    return list(MODES)


def check_count(value, key):
    """A process count: an int of at least 1, or ``auto`` (chosen by the model at start, adjusted while running)."""
    require(value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
            f"{key} must be a number of at least 1 or 'auto', not {value!r}")


def require(ok, message):
    """Raises ``ConfigError(message)`` unless ``ok``."""
    if not ok:
        raise ConfigError(message)
