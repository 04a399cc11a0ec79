"""A loader for the shard tests, importable by readers as ``shardchecks:same_as_webdataset``."""

import glob
import os


_reference = {}


def same_as_webdataset(sample):
    """Checks a tar sample's parts against webdataset's reading of the source (``STAGER_TEST_SOURCE``), decodes it."""
    import webdataset

    if not _reference:
        urls = sorted(glob.glob(os.path.join(os.environ["STAGER_TEST_SOURCE"], "*.tar")))
        for ref in webdataset.WebDataset(urls, shardshuffle=False):
            _reference[ref["__key__"]] = ref
    want = _reference[sample["__key__"]]
    for part in ("npy", "cls"):
        if sample[part] != want[part]:
            raise ValueError(f"sample {sample['__key__']} part {part} differs from webdataset's read of the source")
    return int(sample["cls"])
