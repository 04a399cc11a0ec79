"""Checking that a copy of a source file is whole and not torn (``staging.verify``).

A file rewritten in place while it is copied gives a copy that matches
neither its old nor its new content, at the same size. What a copy is
checked against, by mode:

- ``none``: the bytes copied equal the catalog's size (always checked).
- ``size`` (the default): also the file's size, modification time and
  change time, read before and after the copy, must be equal; a write or
  ``touch`` during the copy moves at least the change time.
- ``xxhash``: also the copy's content hash (xxHash XXH3, 64 bits) must
  equal the hash of a second read of the source, opened again after the
  copy. This catches what the times cannot: a change within the file
  system's timestamp granularity, or a read path that returns other bytes
  than those stored, at the cost of reading each file twice.

Both readings are a plain ``fstat`` of the open file, the call a direct read
makes too (Python's ``open`` asks it), and neither costs the file system a
round trip in the common case. The open itself brings the file's current
attributes: Lustre's open intent returns them from the metadata server, and
NFS revalidates them on open (close-to-open consistency), so the first
reading is current. The second is answered from the client's cache unless
the file changed: on Lustre a writer revokes the reader's locks, so a
change during the copy is seen; on NFS a change is seen once the attribute
cache expires (``actimeo``), and ``xxhash`` is the check that does not
depend on it.
"""

import importlib
import os
from typing import NamedTuple

from ..errors import ConfigError

MODES = ("none", "size", "xxhash")


class Identity(NamedTuple):
    """What tells one version of a file from another, short of its content."""

    size: int
    mtime_ns: int
    ctime_ns: int

    def differences(self, after):
        """``"size 10 -> 12, ctime_ns ..."``: the fields that differ in ``after``."""
        return ", ".join(f"{name} {a} -> {b}" for name, a, b in zip(self._fields, self, after) if a != b)


def identity(fd):
    """The open file's size, mtime and ctime (a plain ``fstat``: see the module's docstring)."""
    st = os.fstat(fd)
    return Identity(st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_mode(mode):
    """Rejects an unknown ``staging.verify``, or ``xxhash`` without its package.

    Raises:
        ConfigError: Naming the key and what to do.
    """
    if mode not in MODES:
        raise ConfigError(f"staging.verify must be one of {list(MODES)}, not {mode!r}")
    if mode == "xxhash":
        try:
            importlib.import_module("xxhash")  # checked at start, so no prefetcher fails on it later
        except ImportError:
            raise ConfigError("staging.verify: xxhash needs the xxhash package: pip install xxhash "
                              "(or the stager[xxhash] extra), or choose 'size'") from None


def hash_file(path, chunk=1 << 22):
    """XXH3-64 hex digest of a file's content, read from its start (opened anew)."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as fh:
        while True:
            data = fh.read(chunk)
            if not data:
                return digest.hexdigest()
            digest.update(data)
