"""A decoded sample as bytes on local storage, and back: a PIL image, a numpy array or a dict, bit for bit.

A record is a fixed header, a short text naming what the pixels are, and
the pixels. The header holds the lengths and a 64-bit XXH3 hash of all that
follows it, so a record cut short or changed on disk is found before
anything is built from it. The hash is paid twice a sample, as the record is
written and each time it is read back: XXH3 takes 0.015 ms for a 256x256 RGB
image here, zlib's CRC-32 0.054 ms (``benchmarks/loaders/decoded_tier.py``). A ``PIL.Image`` is rebuilt
with ``Image.frombytes`` (a new image object, writable, as a loader's
``convert`` returns it); an array is a writable array over the buffer read.
What a record does not keep: a PIL image's ``info`` (EXIF, ICC profile, DPI);
torchvision's transforms never read it.
"""

import struct
import sys

import numpy as np
import xxhash

MAGIC = b"SDC2"
HEADER = struct.Struct("<4sBxHQQ")  # magic, kind, meta length, XXH3-64 of meta and payload, payload length
PIL_IMAGE, ARRAY, PARTS = 1, 2, 3
# Modes whose pixels are not the whole image (a palette beside them): kept encoded.
_PALETTED = ("P", "PA")


class CorruptRecord(ValueError):
    """A decoded copy that does not read back whole: why, for the warning that names it."""


def _pil_image(obj):
    pil = sys.modules.get("PIL.Image")  # a PIL image exists only where PIL is imported already
    return pil is not None and isinstance(obj, pil.Image)


def _plain_array(obj):
    return isinstance(obj, np.ndarray) and not obj.dtype.hasobject and obj.dtype.names is None


def _pack_parts(parts):
    """A shard sample's dict (``str`` keys; arrays, ``bytes`` or ``str`` values) as ``(meta, payloads)``, or None."""
    meta, payloads = [], []
    for key, value in parts.items():
        if not isinstance(key, str) or " " in key or "\n" in key:
            return None
        if _plain_array(value):
            data = memoryview(np.ascontiguousarray(value)).cast("B")
            meta.append(f"{key} a {value.dtype.str} {','.join(str(d) for d in value.shape)} {len(data)}")
        elif isinstance(value, (bytes, str)):
            data = value.encode() if isinstance(value, str) else value
            meta.append(f"{key} {'s' if isinstance(value, str) else 'b'} - - {len(data)}")
        else:
            return None
        payloads.append(data)
    return "\n".join(meta), payloads


def _unpack_parts(meta, payload):
    out, at = {}, 0
    for line in meta.split("\n") if meta else ():
        key, kind, dtype, shape, size = line.split(" ")
        data, at = payload[at:at + int(size)], at + int(size)
        if kind == "a":
            dims = tuple(int(d) for d in shape.split(",")) if shape else ()
            out[key] = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(dims)
        else:
            out[key] = bytes(data).decode() if kind == "s" else bytes(data)
    return out


def _hash(buffers):
    """XXH3 (64 bits) of ``buffers`` one after the other."""
    state = xxhash.xxh3_64()
    for data in buffers:
        state.update(data)
    return state.intdigest()


def pack(obj):
    """The buffers of ``obj``'s record (to be written one after the other), or None where it cannot be kept.

    Kept: a ``PIL.Image`` of a mode without a palette, a numpy array of
    plain (not object) values, and a dict of those arrays, ``bytes`` and
    ``str`` by ``str`` keys (a shard's sample). Anything else is None: read
    it encoded.
    """
    if isinstance(obj, dict):
        packed = _pack_parts(obj)
        if packed is None:
            return None
        meta = packed[0].encode()
        return [HEADER.pack(MAGIC, PARTS, len(meta), _hash([meta, *packed[1]]), sum(len(d) for d in packed[1])), meta,
                *packed[1]]
    if _pil_image(obj):
        if obj.mode in _PALETTED:
            return None
        kind, meta, payload = PIL_IMAGE, f"{obj.mode} {obj.size[0]} {obj.size[1]}", obj.tobytes()
    elif _plain_array(obj):
        kind, meta = ARRAY, f"{obj.dtype.str} {','.join(str(d) for d in obj.shape)}"
        payload = memoryview(np.ascontiguousarray(obj)).cast("B")
    else:
        return None
    meta = meta.encode()
    return [HEADER.pack(MAGIC, kind, len(meta), _hash([meta, payload]), len(payload)), meta, payload]


def length(buffers):
    """Bytes of a record made of ``pack``'s buffers."""
    return sum(len(b) for b in buffers)


def unpack(buf):
    """The object a record holds, built from ``buf`` (a ``bytearray``, which an array then shares).

    Raises:
        CorruptRecord: Cut short, not a record, or not what was written.
    """
    if len(buf) < HEADER.size:
        raise CorruptRecord(f"{len(buf)} bytes, shorter than a record's header")
    magic, kind, meta_len, digest, payload_len = HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise CorruptRecord("not a decoded record (its header is not stager's)")
    body = memoryview(buf)[HEADER.size:]
    if len(body) != meta_len + payload_len:
        raise CorruptRecord(f"{len(body)} bytes after the header, where {meta_len + payload_len} were written")
    if xxhash.xxh3_64_intdigest(body) != digest:
        raise CorruptRecord("its hash does not match: the bytes changed after they were written")
    meta, payload = bytes(body[:meta_len]).decode(), body[meta_len:]
    if kind == PIL_IMAGE:
        from PIL import Image

        mode, width, height = meta.split(" ")
        return Image.frombytes(mode, (int(width), int(height)), payload)
    if kind == ARRAY:
        dtype, shape = meta.split(" ")
        dims = tuple(int(d) for d in shape.split(",")) if shape else ()
        return np.frombuffer(payload, dtype=np.dtype(dtype)).reshape(dims)
    if kind == PARTS:
        return _unpack_parts(meta, payload)
    raise CorruptRecord(f"unknown kind {kind}")
