"""How many bytes the node's cache may hold, and how many its look-ahead window needs."""

import os
import re

import numpy as np

from ..errors import ConfigError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_capacity(text):
    """Reads ``staging.capacity``.

    Returns:
        None (unbounded), ``("auto", None)`` (from the free space at start,
        ``storage.space``), ``("bytes", n)`` or ``("share", fraction)``.

    Raises:
        ConfigError: For anything else, with the forms that are accepted.
    """
    if text is None or str(text).strip() == "" or str(text).strip() == "unbounded":
        return None
    text = str(text)
    if text.strip() == "auto":
        return ("auto", None)
    share = _SHARE.match(text)
    if share:
        fraction = float(share.group(1)) / 100
        if not 0 < fraction <= 1:
            raise ConfigError(f"staging.capacity {text!r}: a share must be above 0% and at most 100%")
        return ("share", fraction)
    size = _SIZE.match(text)
    if not size or float(size.group(1)) <= 0:
        raise ConfigError(f"staging.capacity {text!r}: expected auto, unbounded, bytes (e.g. 500000000, 500M, 200G) "
                          "or a share of the local file system's free space (e.g. 80%)")
    return ("bytes", int(float(size.group(1)) * _UNITS[size.group(2).upper()]))


def resolve_capacity(text, directory):
    """``staging.capacity`` in bytes for a job directory (a share of its file system's free space now), or None.

    ``auto`` is the engine's to resolve (``storage.space.auto_capacity``), not this.
    """
    parsed = parse_capacity(text)
    if parsed is None:
        return None
    kind, value = parsed
    if kind == "auto":
        raise ValueError("staging.capacity auto is resolved from the job's dataset: storage.space.auto_capacity")
    if kind == "bytes":
        return value
    st = os.statvfs(directory)
    return int(value * st.f_bavail * st.f_frsize)


def window_bytes(sizes, batch_size, minibatches_ahead, ranks, most=None):
    """Bytes the look-ahead window may pin at once: every rank's minibatches ahead, each as large as can be.

    No minibatch holds more than the ``batch_size`` largest files, so a cache
    of this size always has room for what is in flight, whatever the order.
    ``most`` (``minibatches -> files``) tightens that where the plan says one
    rank's look-ahead touches fewer files (the ``shards`` shuffle's windows).
    """
    sizes = np.asarray(sizes)
    k = min(batch_size, len(sizes))
    window = ranks * minibatches_ahead * _largest(sizes, k)
    if most is not None:
        window = min(window, _largest(sizes, min(len(sizes), ranks * most(minibatches_ahead))))
    return window


def _largest(sizes, k):
    """The sum of the ``k`` largest sizes."""
    return int(np.partition(sizes, len(sizes) - k)[len(sizes) - k:].sum()) if k else 0


def human(nbytes):
    """``nbytes`` as a short text for messages (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def check_window(capacity, sizes, batch_size, minibatches_ahead, ranks, most=None):
    """The window's bytes; refuses a capacity too small for them.

    Args:
        capacity: Bytes, or None.
        sizes: Catalog sizes.
        batch_size: Samples per minibatch on one rank.
        minibatches_ahead: Minibatches one rank may have asked for and not yet read.
        ranks: Ranks sharing the node's cache.
        most: See ``window_bytes``.

    Raises:
        ConfigError: Naming both numbers and the settings that fix it.
    """
    window = window_bytes(sizes, batch_size, minibatches_ahead, ranks, most)
    if capacity is not None and capacity < window:
        raise ConfigError(f"staging.capacity {human(capacity)} is smaller than the look-ahead window needs: "
                          f"{human(window)} ({ranks} rank(s) x {minibatches_ahead} minibatches ahead x "
                          f"{human(window // max(1, ranks * minibatches_ahead))}, the largest a minibatch can be); "
                          "raise staging.capacity or lower staging.lookahead (and reader.ahead)")
    return window
