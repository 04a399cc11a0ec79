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

The times are read with ``statx(AT_STATX_FORCE_SYNC)``: file systems that
cache attributes on the client (NFS, FUSE mounts) would otherwise answer
the second ``fstat`` from that cache and hide the change.
"""

import ctypes
import importlib
import os
import struct
from typing import NamedTuple

from ..errors import ConfigError

MODES = ("none", "size", "xxhash")

_AT_EMPTY_PATH = 0x1000
_AT_STATX_FORCE_SYNC = 0x2000
_STATX_BASIC_STATS = 0x7FF
_STATX_SIZE = 256  # struct statx is 256 bytes on every architecture
_libc = None


class Identity(NamedTuple):
    """What tells one version of a file from another, short of its content."""

    size: int
    mtime_ns: int
    ctime_ns: int

    def differences(self, after):
        """``"size 10 -> 12, ctime_ns ..."``: the fields that differ in ``after``."""
        return ", ".join(f"{name} {a} -> {b}" for name, a, b in zip(self._fields, self, after) if a != b)


def _statx(fd):
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _libc = libc if hasattr(libc, "statx") else False
    if not _libc:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if _libc.statx(fd, b"", _AT_EMPTY_PATH | _AT_STATX_FORCE_SYNC, _STATX_BASIC_STATS, buf) != 0:
        return None  # an old kernel or a sandbox that forbids statx: fstat still works

    def stamp(offset):  # struct statx_timestamp {__s64 tv_sec; __u32 tv_nsec; __s32 reserved;}
        sec, nsec = struct.unpack_from("<qI", buf, offset)
        return sec * 1_000_000_000 + nsec

    return Identity(struct.unpack_from("<Q", buf, 40)[0], stamp(112), stamp(96))


def identity(fd, fresh=True):
    """The open file's size, mtime and ctime.

    Args:
        fd: The open file.
        fresh: Ask the file system itself (``statx(AT_STATX_FORCE_SYNC)``),
            not a client's attribute cache; False takes a plain ``fstat``.
    """
    found = _statx(fd) if fresh else None
    if found is not None:
        return found
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
