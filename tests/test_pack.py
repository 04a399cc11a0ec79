"""``stager pack`` in several processes: the same containers as one process, read back equal to the source."""

import glob
import multiprocessing
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import webdataset

from stager.catalog import Catalog
from stager.errors import ConfigError
from stager.job.packing import pack


def assert_webdataset_reads_back(out, root, files):
    """webdataset's reading of the tar shards under ``out``: ``files``' samples in order, bytes and labels equal."""
    got = list(webdataset.WebDataset(sorted(glob.glob(str(out / "*.tar"))), shardshuffle=False))
    assert len(got) == len(files)
    for i, sample in enumerate(got):
        assert sample["__key__"] == files.path(i).rsplit(".", 1)[0]
        with open(os.path.join(root, files.path(i)), "rb") as fh:
            assert sample["npy"] == fh.read()
        assert int(sample["cls"]) == files.label(i)


def _pack(root, out, *args):
    return subprocess.run([sys.executable, "-m", "stager", "pack", root, str(out), "--manifest", "manifest.tsv",
                           "--quiet", *args], capture_output=True, text=True, timeout=300)


def test_two_processes_write_the_containers_one_writes_and_webdataset_reads_the_source_back(dataset, tmp_path):
    root, _ = dataset
    files = Catalog.from_manifest(root, "manifest.tsv")
    for n in (1, 2):
        done = _pack(root, tmp_path / f"tar{n}", "--per-shard", "30", "--processes", str(n))
        assert done.returncode == 0, done.stderr
    names = sorted(os.listdir(tmp_path / "tar1"))
    shards = [f"shard-{k:06d}.tar" for k in range(4)]
    assert names == sorted(os.listdir(tmp_path / "tar2")) == sorted(
        ["manifest.tsv"] + shards + [f".{name}.index.json" for name in shards])  # each shard's index beside it
    for name in names:
        assert (tmp_path / "tar1" / name).read_bytes() == (tmp_path / "tar2" / name).read_bytes(), name
    assert_webdataset_reads_back(tmp_path / "tar2", root, files)


def test_hdf5_containers_from_several_processes_hold_every_row_in_order(dataset, tmp_path):
    root, _ = dataset
    files = Catalog.from_manifest(root, "manifest.tsv")
    done = _pack(root, tmp_path / "h5", "--format", "hdf5", "--per-shard", "16", "--processes", "3")
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "h5" / "manifest.tsv") as fh:
        names = [line.strip() for line in fh]
    assert names == [f"shard-{k:06d}.h5" for k in range(7)]  # 100 samples, 16 a container
    i = 0
    for name in names:
        with h5py.File(tmp_path / "h5" / name, "r") as fh:
            assert len(fh["x"]) == len(fh["y"]) == min(16, len(files) - i)
            for x, y in zip(fh["x"], fh["y"]):
                assert np.array_equal(x, np.load(os.path.join(root, files.path(i)))) and y == files.label(i)
                i += 1
    assert i == len(files)


def test_a_file_that_cannot_be_packed_is_named_and_leaves_no_partial_container_nor_worker(dataset, tmp_path):
    root, _ = dataset
    src = tmp_path / "src"
    shutil.copytree(root, src)
    files = Catalog.from_directory(str(src), [".npy"])
    bad = files.path(len(files) - 1)  # in the last container: others are written, or being written, first
    os.rename(src / bad, src / bad.replace(".npy", ".x.npy"))
    files = Catalog.from_directory(str(src), [".npy"])
    bad = next(files.path(i) for i in range(len(files)) if files.path(i).endswith(".x.npy"))
    with pytest.raises(ConfigError, match=bad.replace(".", r"\.")):
        pack(files, str(tmp_path / "out"), "tar", 10, processes=2, progress=False)
    assert multiprocessing.active_children() == []
    left = os.listdir(tmp_path / "out")
    assert "manifest.tsv" not in left and not [n for n in left if n.endswith(".part")], left


def test_the_count_of_processes_is_refused_below_one(dataset, tmp_path):
    root, _ = dataset
    done = _pack(root, tmp_path / "out", "--processes", "0")
    assert done.returncode != 0 and "--processes: expected a whole number of at least 1, got '0'" in done.stderr
    assert not (tmp_path / "out").exists()
