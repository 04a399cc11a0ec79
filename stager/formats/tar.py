"""Tar shards in WebDataset's layout: a sample is the run of members that share a key.

A member ``dir/000123.jpg`` belongs to sample ``dir/000123`` as its ``jpg``
part: the key is the member's path up to the first dot of its base name, the
part is the rest, lower-cased. Consecutive members with one key make one
sample; members without a dot in their base name, ``__meta__`` members and
anything but regular files are skipped, as WebDataset skips them. Indexing
reads the headers only (ustar, GNU long names, pax paths; the data is
sought over), so a shard of thousands of samples costs a few reads, not a
parse of its bytes.

Over an object store those reads would fetch the whole shard before staging
fetches it again, so ``stager pack`` writes each shard's index beside it
(``index_name``: hidden, so scans leave it out), and the catalog reads that
instead of the shard where one is there for a shard of that size.
"""

import json
import os
import posixpath
import re

from ..errors import CatalogError

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def split_name(name):
    """``(key, part)`` of a member name, or ``(None, None)`` for a member that belongs to no sample."""
    match = _KEY.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2).lower()


_BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")  # regular files (7: contiguous, read as regular, as tarfile does)
_SMALL = 32 << 10  # members this small on average: read the headers in chunks, not one by one
_CHUNK = 64 << 10
_ZEROS = bytes(_BLOCK)


def _number(field):
    """A header's numeric field: octal text, or GNU's base-256 for large values."""
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    text = field.rstrip(b"\0 ").lstrip(b" ")
    return int(text, 8) if text else 0


def _pax_path(data):
    """The ``path`` record of a pax extended header, or None."""
    at = 0
    while at < len(data):
        space = data.index(b" ", at)
        length = int(data[at:space])
        key, _, value = data[space + 1:at + length - 1].partition(b"=")
        if key == b"path":
            return value.decode("utf-8")
        at += length
    return None


def _members(fd, name, size):
    """Yields ``(member name, typeflag, data offset, data size)`` of a tar file's entries, headers only.

    Reads the headers with ``pread`` (in chunks while members are small on
    average, so a shard of small samples costs a few large reads and one of
    large samples little more than its headers), follows GNU long names and
    pax ``path`` records, and checks each header's checksum.
    """
    buf, buf_at, off, long_name, seen, count = b"", 0, 0, None, 0, 0
    while True:
        if not (buf_at <= off and off + _BLOCK <= buf_at + len(buf)):
            small = seen < _SMALL * count or not count
            buf, buf_at = os.pread(fd, _CHUNK if small else _BLOCK, off), off
        head = buf[off - buf_at:off - buf_at + _BLOCK]
        if len(head) < _BLOCK:
            raise CatalogError(f"tar shard {name} is truncated: it ends inside a header at byte {off} ({size} bytes)")
        if head == _ZEROS:
            return  # the end-of-archive marker
        stored, rest = _number(head[148:156]), head[:148] + head[156:]
        unsigned = sum(rest) + 256
        # Unsigned, as POSIX says; some old tar programs summed signed bytes.
        if stored != unsigned and stored != unsigned - 256 * sum(b > 127 for b in rest):
            raise CatalogError(f"tar shard {name} cannot be read as a tar file: the header at byte {off} has a wrong "
                               "checksum")
        length, kind = _number(head[124:136]), head[156:157]
        data = off + _BLOCK
        if data + length > size:
            raise CatalogError(f"tar shard {name} is truncated: a member needs bytes up to {data + length}, the "
                               f"shard has {size}")
        member = head[:100].split(b"\0", 1)[0]
        if head[257:262] == b"ustar" and head[345:500].strip(b"\0"):
            member = head[345:500].split(b"\0", 1)[0] + b"/" + member
        if kind in (b"L", b"x"):  # the next entry's name: GNU long name, pax extended header
            extra = os.pread(fd, length, data)
            found = extra.split(b"\0", 1)[0].decode("utf-8") if kind == b"L" else _pax_path(extra)
            long_name = found or long_name
        elif kind != b"g":
            yield (long_name or member.decode("utf-8")), kind, data, length
            long_name = None
        off, seen, count = data + -(-length // _BLOCK) * _BLOCK, seen + length, count + 1


def index_tar(fileobj, name, size):
    """The samples of one tar shard: a list of ``(key, [(part, data_offset, data_size), ...])``.

    Args:
        fileobj: The shard, opened for binary reading (a file with a descriptor).
        name: Its relative path, for messages.
        size: Its size in bytes: a member whose data runs past it is a
            truncated shard.

    Raises:
        CatalogError: A shard that is not a tar file, is truncated, or holds
            one part twice in a sample; naming the shard and the member.
    """
    samples = []
    try:
        for member, kind, offset, length in _members(fileobj.fileno(), name, size):
            if kind not in _REGULAR or _META.match(member):
                continue
            key, part = split_name(member)
            if key is None:
                continue
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            parts = samples[-1][1]
            if any(p == part for p, _, _ in parts):
                raise CatalogError(f"tar shard {name}: sample {key!r} holds part {part!r} twice (member {member})")
            parts.append((part, offset, length))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CatalogError(f"tar shard {name} cannot be read as a tar file: {exc}") from None
    if not samples:
        raise CatalogError(f"tar shard {name} holds no samples (no member named KEY.PART)")
    return samples


def check_parts(samples, name, expected, exact):
    """Refuses a sample whose parts differ from the dataset's.

    Args:
        samples: ``index_tar``'s result for shard ``name``.
        name: The shard's relative path.
        expected: The parts every sample must have.
        exact: Whether a sample may hold no other part (the parts were
            taken from the dataset's first sample, not named by the user).

    Raises:
        CatalogError: Naming the shard, the sample and the part at fault.
    """
    for key, parts in samples:
        have = {p for p, _, _ in parts}
        missing, extra = sorted(expected - have), sorted(have - expected) if exact else []
        if missing or extra:
            fault = (f"has no {', '.join(missing)} part" if missing
                     else f"has a {', '.join(extra)} part the first sample lacks")
            raise CatalogError(f"tar shard {name}: sample {key!r} {fault} (it has {', '.join(sorted(have))}; the "
                               f"dataset's samples have {', '.join(sorted(expected))}); dataset.parts names the "
                               "parts to keep when samples differ")


_INDEX_KEY, _INDEX_VERSION = "stager_tar_index", 1


def index_name(rel):
    """Where the index of shard ``rel`` lies: ``dir/.NAME.index.json``, hidden so that scans leave it out."""
    head, tail = posixpath.split(rel)
    return posixpath.join(head, f".{tail}.index.json")


def dump_index(samples, size):
    """The bytes of an index file: ``index_tar``'s result for a shard of ``size`` bytes, as JSON."""
    return json.dumps({_INDEX_KEY: _INDEX_VERSION, "bytes": size, "samples": samples},
                      separators=(",", ":")).encode("utf-8")


def load_index(data, name, size):
    """``index_tar``'s result for shard ``name`` from its index file's bytes.

    Returns:
        The samples, or None where the index was written for a shard of
        another size (the shard was rewritten since): index the shard itself.

    Raises:
        CatalogError: An index that cannot be read, or places a part outside
            the shard or twice in a sample; naming the index file.
    """
    where = index_name(name)
    try:
        index = json.loads(data)
        if index.get(_INDEX_KEY) != _INDEX_VERSION:
            raise ValueError(f"{_INDEX_KEY} is {index.get(_INDEX_KEY)!r}, not {_INDEX_VERSION}")
        if index["bytes"] != size:
            return None
        samples = [(str(key), [(str(part), int(offset), int(length)) for part, offset, length in parts])
                   for key, parts in index["samples"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CatalogError(f"tar shard index {where} cannot be read ({type(exc).__name__}: {exc}): delete it and "
                           "the shard is indexed from its own headers") from None
    for key, parts in samples:
        names = [part for part, _, _ in parts]
        bad = next(((p, o, n) for p, o, n in parts if o < 0 or n < 0 or o + n > size), None)
        if bad is not None or len(set(names)) != len(names):
            fault = (f"part {bad[0]!r} at bytes {bad[1]}-{bad[1] + bad[2]}, outside the shard's {size}"
                     if bad is not None else f"parts {names}, one twice")
            raise CatalogError(f"tar shard index {where}: sample {key!r} has {fault}: delete the index and the "
                               "shard is indexed from its own headers")
    if not samples:
        raise CatalogError(f"tar shard index {where} lists no samples")
    return samples
