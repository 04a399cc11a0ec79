"""A loader for the shard tests, importable by readers as ``shardchecks:same_as_webdataset``."""

import glob
import os
import threading

_reference = {}
_filling = threading.Lock()  # the start's probe decodes a few samples at once, in threads


def same_as_webdataset(sample):
    """Checks a tar sample's parts against webdataset's reading of the source (``STAGER_TEST_SOURCE``), decodes it."""
    import webdataset

    with _filling:
        if not _reference:
            urls = sorted(glob.glob(os.path.join(os.environ["STAGER_TEST_SOURCE"], "*.tar")))
            _reference.update((ref["__key__"], ref) for ref in webdataset.WebDataset(urls, shardshuffle=False))
    want = _reference[sample["__key__"]]
    for part in ("npy", "cls"):
        if sample[part] != want[part]:
            raise ValueError(f"sample {sample['__key__']} part {part} differs from webdataset's read of the source")
    return int(sample["cls"])


_streaming = {}


def streaming_samples(root):
    """Every sample of the MDS shards under ``root`` as Streaming's own reader decodes them, by their ``id`` column."""
    import json

    import numpy as np
    from streaming.base.format import reader_from_json

    out = {}
    with open(os.path.join(root, "index.json")) as fh:
        for entry in json.load(fh)["shards"]:
            reader = reader_from_json(root, None, entry)
            for i in range(entry["samples"]):
                sample = reader.get_item(i)
                out[int(sample["id"])] = {k: np.asarray(v) if k == "image" else v for k, v in sample.items()}
    return out


def same_as_streaming(sample):
    """Checks an MDS sample's columns against Streaming's reading of the source (``STAGER_TEST_SOURCE``)."""
    import numpy as np

    with _filling:
        if not _streaming:
            _streaming.update(streaming_samples(os.environ["STAGER_TEST_SOURCE"]))
    want = _streaming[int(sample["id"])]
    if set(sample) != set(want):
        raise ValueError(f"sample {sample['id']}: columns {sorted(sample)}, Streaming's {sorted(want)}")
    for column, value in sample.items():
        same = np.array_equal(np.asarray(value), want[column]) if column in ("image", "array") else value == want[column]
        if not same:
            raise ValueError(f"sample {sample['id']} column {column} differs from Streaming's read of the source")
    return int(sample["label"])
