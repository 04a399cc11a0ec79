"""Drives iterators.dlio.StagedDataLoader as DLIO's run loop does, and checks what it hands DLIO.

DLIO's loop never looks at its batches (its accelerator is a sleep), so
this script plays DLIO's part: it loads a workload's settings into DLIO's
own ``ConfigArguments`` (``LoadConfig``, ``derive_configurations``), builds
the loader through DLIO's ``DataLoaderFactory`` (the custom-class path),
calls ``read``, ``next`` and ``finalize`` as ``DLIOBenchmark.run`` does, and
compares every sample with the source file read by numpy or h5py. Prints
one JSON line: each epoch's samples as ``[file, sample]`` pairs in the order
delivered, and whether each equalled the source.

Usage: dlio_batches.py DATA_FOLDER OUT_FOLDER FORMAT SAMPLES_PER_FILE BATCH EPOCHS
"""

import glob
import json
import os
import sys

import numpy as np


def source_samples(files, per_file, fmt):
    """Every sample of the source, keyed by its bytes, as (file index, sample index)."""
    table = {}
    for f, path in enumerate(files):
        if fmt == "npz":
            data = np.load(path)["x"]
            rows = [data[..., s] for s in range(per_file)]
        else:
            import h5py

            with h5py.File(path, "r") as fh:
                rows = [fh["records"][s] for s in range(per_file)]
        for s, row in enumerate(rows):
            table.setdefault(np.ascontiguousarray(row).tobytes(), []).append([f, s])
    return table


def main():
    data, out, fmt, per_file, batch, epochs = sys.argv[1:7]
    per_file, batch, epochs = int(per_file), int(batch), int(epochs)
    from dlio_benchmark.utils.utility import DLIOMPI

    DLIOMPI.get_instance().initialize()
    from dlio_benchmark.common.enumerations import DatasetType, FormatType
    from dlio_benchmark.data_loader.data_loader_factory import DataLoaderFactory
    from dlio_benchmark.utils.config import ConfigArguments, LoadConfig

    args = ConfigArguments.get_instance()
    LoadConfig(args, {
        "framework": "pytorch",
        "dataset": {"data_folder": data, "format": fmt, "num_samples_per_file": per_file},
        "reader": {"data_loader": "pytorch", "batch_size": batch, "read_threads": 2, "sample_shuffle": "seed",
                   "data_loader_classname": "iterators.dlio.StagedDataLoader", "data_loader_sampler": "index"},
        "train": {"epochs": epochs},
        "output": {"folder": out},
    })
    files = sorted(glob.glob(os.path.join(data, "train", f"*.{fmt}")))
    args.derive_configurations(files, [])
    args.reconfigure(1)
    os.environ["STAGER_CONFIG"] = os.path.join(out, "stager.yaml")
    loader = DataLoaderFactory.get_loader(None, FormatType(fmt), DatasetType.TRAIN, 1)
    loader.read()
    table = source_samples(files, per_file, fmt)
    result = {"loader": type(loader).__name__, "epochs": [], "equal": True}
    for _ in range(epochs):
        delivered = []
        for step in loader.next():
            for sample in step:
                found = table.get(sample.numpy().tobytes())
                result["equal"] &= found is not None
                delivered.append(found[0] if found else None)
        result["epochs"].append(delivered)
        loader.finalize()
    result["closed"] = loader.closed
    print(json.dumps(result))
    DLIOMPI.get_instance().finalize()


if __name__ == "__main__":
    main()
