"""MosaicML Streaming's MDS shards (``dataset.format: mds``): the index, and a sample out of a staged shard.

A dataset written by Streaming's ``MDSWriter`` is an ``index.json`` beside
its shards (``shard.NNNNN.mds``). The index says, per shard, its file, its
byte count, its samples and its columns (name, encoding, and the fixed size
of encodings that have one). Only the index is read to build the catalog,
so each shard is opened on the source once: when it is staged.

A shard starts with its sample count and ``count + 1`` byte offsets (uint32,
little-endian); sample ``i`` is the bytes between offsets ``i`` and
``i + 1``: first a uint32 size for each column without a fixed size, then
every column's bytes in column order. The columns are decoded by Streaming's
own ``mds_decode`` (the optional extra ``mds``), so a sample is what
Streaming's ``StreamingDataset`` would give: a dict of column to value.
"""

import json

import numpy as np

from ..errors import CatalogError

INDEX = "index.json"
NEEDS = "MosaicML Streaming (pip install 'stager[mds]', or mosaicml-streaming==0.13.0)"
_UNSAFE = ("pkl",)  # decoding runs code the writer chose


def streaming_decoder():
    """Streaming's ``mds_decode``, or a ``CatalogError`` naming what to install."""
    try:
        from streaming.base.format.mds.encodings import mds_decode
    except ImportError as exc:
        raise CatalogError(f"dataset.format mds decodes samples with Streaming's column encodings: install {NEEDS} "
                           f"({type(exc).__name__}: {exc})") from None
    return mds_decode


def read_index(data, where):
    """The shards an ``index.json`` lists: ``[(basename, bytes, samples)]`` and the columns.

    Args:
        data: The index's bytes.
        where: Its path, for messages.

    Returns:
        ``(shards, columns)``: columns ``[(name, encoding, fixed size or None)]``,
        the same in every shard.

    Raises:
        CatalogError: An index that is not Streaming's MDS index, compressed
            shards, an unsafe encoding, or shards whose columns differ;
            naming the index and the shard.
    """
    try:
        index = json.loads(data)
        entries = index["shards"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"{where}: not a Streaming index ({type(exc).__name__}: {exc})") from None
    shards, columns = [], None
    for k, entry in enumerate(entries):
        name = (entry.get("raw_data") or {}).get("basename", f"shard {k}")
        if entry.get("format") != "mds":
            raise CatalogError(f"{where}: {name} is in format {entry.get('format')!r}; dataset.format mds reads "
                               "MDS shards only")
        if entry.get("compression"):
            raise CatalogError(f"{where}: {name} is compressed ({entry['compression']}); stager stages raw MDS "
                               "shards: write them without compression")
        mine = list(zip(entry["column_names"], entry["column_encodings"], entry["column_sizes"]))
        for column, encoding, _ in mine:
            if encoding in _UNSAFE:
                raise CatalogError(f"{where}: column {column!r} is encoded {encoding!r}, whose decoding runs code "
                                   "the writer chose: stager does not decode it")
        if columns is None:
            columns = mine
        elif mine != columns:
            raise CatalogError(f"{where}: {name} has columns {mine}, the first shard {columns}: every shard of a "
                               "dataset must have the same columns")
        shards.append((entry["raw_data"]["basename"], int(entry["raw_data"]["bytes"]), int(entry["samples"])))
    if not shards:
        raise CatalogError(f"{where}: the index lists no shards")
    return shards, columns


def shard_offsets(read, path):
    """A shard's sample offsets (``count + 1`` uint32) from its header; ``read(size, offset)`` reads its bytes.

    Raises:
        OSError: A header shorter than it says, naming the shard.
    """
    head = read(4, 0)
    if len(head) != 4:
        raise OSError(f"{path}: not an MDS shard: {len(head)} bytes where its sample count should be")
    count = int(np.frombuffer(head, "<u4")[0])
    table = read(4 * (count + 1), 4)
    if len(table) != 4 * (count + 1):
        raise OSError(f"{path}: MDS shard header cut short: {len(table)} of {4 * (count + 1)} bytes of offsets "
                      f"for {count} samples")
    return np.frombuffer(table, "<u4").astype(np.int64)


def decode_sample(data, columns, decode, where):
    """A sample's columns from its bytes (see the module's text); ``decode`` is Streaming's ``mds_decode``."""
    sizes, at = [], 0
    for _, _, size in columns:
        if size:
            sizes.append(size)
        else:
            if at + 4 > len(data):
                raise OSError(f"{where}: the sample's column sizes run past its {len(data)} bytes")
            sizes.append(int(np.frombuffer(data[at:at + 4], "<u4")[0]))
            at += 4
    if at + sum(sizes) != len(data):
        raise OSError(f"{where}: the sample's columns take {at + sum(sizes)} bytes, the shard gives it {len(data)}")
    sample = {}
    for (column, encoding, _), size in zip(columns, sizes):
        sample[column] = decode(encoding, data[at:at + size])
        at += size
    return sample
