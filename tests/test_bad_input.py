"""Bad input in the data and the config: each named (key, file, line) by a ``stager`` error, or a documented rule."""

import json
import os
import socket
import subprocess
import textwrap

import numpy as np
import pytest
from conftest import make_config, stager_cmd, stager_workers

from stager.catalog import Catalog
from stager.engine import Pipeline
from stager.errors import CatalogError, ConfigError, StageError
from stager.formats import EmptySample, load_npy, make_loader
from stager.job.synth import make_dataset
from stager.sources import PosixSource


def run_stager(tmp_path, *args):
    return subprocess.run(stager_cmd(*args), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))


def small_tree(root, names=("a/x.npy", "a/y.npy", "b/z.npy")):
    for n, name in enumerate(names):
        os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
        np.save(os.path.join(root, name), np.full(16, n, dtype=np.uint8))


# Duplicate manifest entries ---------------------------------------------------

@pytest.mark.parametrize("second", ["a/x.npy", "./a/x.npy", "a//x.npy", "a/./x.npy"])
def test_a_sample_listed_twice_even_as_an_alias_is_refused_naming_both_lines(tmp_path, second):
    small_tree(tmp_path / "d")
    (tmp_path / "d" / "m.tsv").write_text(f"a/x.npy\na/y.npy\n# comment\n{second}\n")
    with pytest.raises(CatalogError, match=r"m\.tsv:4: 'a/x.npy' is already listed at line 1 \(paths are compared "
                                           r"after removing '\./' and '//'\); list each sample once"):
        PosixSource(str(tmp_path / "d")).read_manifest("m.tsv")


def test_one_file_listed_under_two_names_through_a_link_is_refused(tmp_path):
    small_tree(tmp_path / "d")
    os.symlink("x.npy", tmp_path / "d" / "a" / "alias.npy")
    (tmp_path / "d" / "m.tsv").write_text("a/x.npy\nb/z.npy\na/alias.npy\n")
    with pytest.raises(CatalogError, match=r"m\.tsv:3: 'a/alias.npy' is the file .*/a/x\.npy, already listed as "
                                           r"'a/x.npy' at .*m\.tsv:1; list each sample once"):
        PosixSource(str(tmp_path / "d")).read_manifest("m.tsv")


def test_stager_run_with_a_duplicate_in_the_manifest_stops_at_start_with_nothing_staged(tmp_path):
    small_tree(tmp_path / "data")
    (tmp_path / "data" / "m.tsv").write_text("a/x.npy\t0\nb/z.npy\t1\n./a/x.npy\t0\n")
    (tmp_path / "job.yaml").write_text(textwrap.dedent("""\
        dataset: {source: data, manifest: m.tsv}
        plan: {batch_size: 2}
        staging: {local_dir: local}
        """))
    (tmp_path / "local").mkdir()
    proc = run_stager(tmp_path, "run", str(tmp_path / "job.yaml"))
    assert proc.returncode != 0
    assert "m.tsv:3: 'a/x.npy' is already listed at line 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert os.listdir(tmp_path / "local") == []


# Zero-byte samples -------------------------------------------------------------

def test_an_empty_file_is_staged_delivered_by_raw_and_counted_like_any_other(tmp_path):
    small_tree(tmp_path / "data")
    (tmp_path / "data" / "b" / "empty.npy").write_bytes(b"")
    (tmp_path / "job.yaml").write_text(textwrap.dedent("""\
        dataset: {source: data, loader: raw}
        plan: {batch_size: 2, shuffle: false}
        staging: {local_dir: local, prefetchers: 1}
        """))
    (tmp_path / "local").mkdir()
    proc = run_stager(tmp_path, "run", str(tmp_path / "job.yaml"), "--record", str(tmp_path / "rec"),
                      "--report", str(tmp_path / "r.json"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["samples"], report["files_staged"], report["files_present"]) == (4, 4, 0)
    staged = [json.loads(line) for line in
              (tmp_path / "rec" / f"staged-{socket.gethostname()}.jsonl").read_text().splitlines()]
    assert sorted((s["path"], s["bytes"]) for s in staged) == sorted(
        [("a/x.npy", 144), ("a/y.npy", 144), ("b/empty.npy", 0), ("b/z.npy", 144)])


@pytest.mark.parametrize("loader", ["npy", "hdf5", "image"])
def test_every_decoding_loader_refuses_an_empty_file_with_the_same_error(tmp_path, loader):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    load = make_loader(loader, {"hdf5_key": "data", "layout": "hwc"})
    with pytest.raises(EmptySample, match=rf"^{empty} is empty \(0 bytes\): the {loader} loader has nothing to "
                                          r"decode; remove it from the dataset, or read it with loader raw$"):
        load(str(empty))
    assert make_loader("raw", {})(str(empty)) == b""


def test_a_job_reading_an_empty_npy_file_fails_naming_it(tmp_path):
    small_tree(tmp_path / "data")
    (tmp_path / "data" / "b" / "empty.npy").write_bytes(b"")
    cfg = make_config(str(tmp_path / "data"), tmp_path / "local", dataset={"manifest": None},
                      plan={"batch_size": 4, "shuffle": False})
    pipe = Pipeline(cfg)
    with pytest.raises(StageError, match=r"empty\.npy is empty \(0 bytes\): the npy loader") as info:
        with pipe:
            list(pipe)
    assert (info.value.stage, info.value.path) == ("read", "b/empty.npy")
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


# drop_last with a batch larger than the dataset ---------------------------------

def test_drop_last_with_a_batch_larger_than_an_epoch_fails_before_any_worker_starts(tmp_path):
    small_tree(tmp_path / "data")
    cfg = make_config(str(tmp_path / "data"), tmp_path / "local", dataset={"manifest": None},
                      plan={"batch_size": 4, "drop_last": True})
    pipe = Pipeline(cfg)
    with pytest.raises(ConfigError, match=r"plan\.drop_last is true and a minibatch of plan\.batch_size 4 on each of "
                                          r"1 rank\(s\) takes 4 samples, more than the 3 of an epoch \(3 in the "
                                          r"catalog\): every minibatch would be dropped"):
        pipe.start()
    pipe.close()
    assert not stager_workers()
    assert not os.path.exists(tmp_path / "local") or os.listdir(tmp_path / "local") == []


def test_stager_run_names_drop_last_without_a_traceback(tmp_path):
    small_tree(tmp_path / "data")
    (tmp_path / "job.yaml").write_text("dataset: {source: data}\nplan: {batch_size: 8, drop_last: true}\n"
                                       "staging: {local_dir: local}\n")
    (tmp_path / "local").mkdir()
    proc = run_stager(tmp_path, "run", str(tmp_path / "job.yaml"))
    assert proc.returncode != 0 and "plan.drop_last is true" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path / "local") == []


# manifest: null over a tree holding its manifest ----------------------------------

def test_a_scan_leaves_out_the_trees_own_manifest(tmp_path):
    root = str(tmp_path / "data")
    make_dataset(root, 12, nbytes=256, classes=3, progress=False)
    assert os.path.exists(os.path.join(root, "manifest.tsv"))
    scanned = Catalog.from_directory(root)
    listed = Catalog.from_manifest(root, "manifest.tsv")
    assert "manifest.tsv" not in scanned.paths()
    assert sorted(scanned.paths()) == sorted(listed.paths()) and scanned.labels is not None
    # Only the root's manifest.* is a listing: one deeper is a sample.
    (tmp_path / "data" / "c000" / "manifest.txt").write_text("a sample\n")
    assert "c000/manifest.txt" in Catalog.from_directory(root).paths()


# YAML with a duplicate key -------------------------------------------------------

def test_a_key_given_twice_in_yaml_is_named_with_both_lines(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("dataset:\n  source: /data\nstaging:\n  prefetchers: 2\n  lookahead: 3\n  prefetchers: 8\n")
    proc = run_stager(tmp_path, "config", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"stager: error: {path}: duplicate key 'prefetchers' at lines 4 and 6; "
                                   "give each key once")


# The npy header cap -----------------------------------------------------------------

def _npy_with_header(path, header_len):
    """A version-2 .npy of 4 bytes whose header (dict, padding, newline) is ``header_len`` bytes."""
    text = "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }"
    text = text + " " * (header_len - len(text) - 1) + "\n"
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x02\x00" + len(text).to_bytes(4, "little") + text.encode("latin1") + bytes([1, 2, 3, 4]))


def test_the_npy_header_is_capped_as_numpy_caps_it(tmp_path):
    from numpy.lib import format as npy_format

    cap = npy_format._MAX_HEADER_SIZE
    ok, big = tmp_path / "ok.npy", tmp_path / "big.npy"
    _npy_with_header(ok, cap)
    _npy_with_header(big, cap + 1)
    assert np.array_equal(load_npy(str(ok), {}), np.load(ok)) and load_npy(str(ok), {}).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError) as ours:
        load_npy(str(big), {})
    with pytest.raises(ValueError) as numpys:
        np.load(big, allow_pickle=False)
    assert str(ours.value) == str(numpys.value) and "max_header_size" in str(ours.value)
