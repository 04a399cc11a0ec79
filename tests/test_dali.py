"""iterators.dali: a DALI pipeline reading through stager gets fn.readers.file's files and labels, staged.

DALI's own reader is the reference: its listing of a tree, its decoder on
the bytes given, PIL on the same files. The emulated slow file system is
behind every pipeline that reads, and an inotify count of the source's
opens shows each file fetched once per job.
"""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

pytest.importorskip("nvidia.dali")
from nvidia.dali import fn, pipeline_def  # noqa: E402

from iterators import _dali_files  # noqa: E402
from iterators.dali import reader, readers  # noqa: E402
from stager.job.synth import make_dataset  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402

from helpers.dali_runs import epochs as run_epochs  # noqa: E402
from helpers.opens import Opens  # noqa: E402

BATCH = 5


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dali") / "train")
    make_dataset(root, 23, nbytes=3000, classes=3, seed=4, progress=False, fmt="jpeg")
    return root


def _digest(data):
    return hashlib.sha1(np.asarray(data).tobytes()).hexdigest()


def _source_files(root):
    """digest -> (relative path, label as DALI numbers the folders)."""
    rels, labels = _dali_files.tree(root)
    out = {}
    for rel, label in zip(rels, labels):
        with open(os.path.join(root, rel), "rb") as handle:
            out[_digest(np.frombuffer(handle.read(), np.uint8))] = (rel, label)
    return out


def _epochs(pipe, count, decoded=False):
    """Each epoch's samples: (digest of the bytes, label[, DALI's decoded image])."""
    def sample(outputs, k):
        head = (_digest(outputs[0].at(k)), int(outputs[1].at(k)[0]))
        return head + ((np.array(outputs[2].at(k)),) if decoded else ())
    return run_epochs(pipe, count, sample)


def _config(tmp_path):
    return {"staging": {"local_dir": str(tmp_path / "local"), "prefetchers": 3}}


@pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, enable_checkpointing=True)
def staged(root, config, decode=False, args=None):
    encoded, labels = reader(file_root=root, config=config, **(args or {}))
    if decode:
        return encoded, labels, fn.decoders.image(encoded, device="cpu")
    return encoded, labels


def _close(pipe):
    for source in readers(pipe):
        source.close()


def test_the_listing_is_fn_readers_files_own(tmp_path):
    root = tmp_path / "tree"
    image = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    for rel in ["b/x.JPG", "b/a.jpg", "b/sub/z.jpg", "a/q.jpeg", "a/readme.txt", "Z/k.jpg", "c/.hidden.png",
                "e/m.Jpeg", "a/sub2/deeper/m.jpg"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / rel, format="JPEG")
    (root / "top.jpg").write_bytes((root / "Z/k.jpg").read_bytes())
    (root / "bb").mkdir()  # an empty folder still takes a label
    os.symlink(root / "a", root / "f")
    variants = [{}, {"file_filters": ["*.JPG", "*.png"], "case_sensitive_filter": True},
                {"file_filters": "*.jpg"}, {"dir_filters": ["b*", "f"]}]
    for args in variants:
        @pipeline_def(batch_size=64, num_threads=1, device_id=None)
        def own():
            encoded, labels = fn.readers.file(file_root=str(root), name="R", **args)
            return fn.get_property(encoded, key="source_info"), labels

        pipe = own()
        pipe.build()
        paths, labels = pipe.run()
        size = pipe.reader_meta("R")["epoch_size"]
        want = ([bytes(paths.at(k)).decode() for k in range(size)], [int(labels.at(k)[0]) for k in range(size)])
        assert _dali_files.tree(str(root), **args) == want, args


def test_files_and_file_list_name_what_they_list(tmp_path, jpegs):
    rels, _ = _dali_files.tree(jpegs)
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{rel} {7 + k}\n" for k, rel in enumerate(rels[:4])))
    paths, labels = _dali_files.listed(str(listing), jpegs)
    assert paths == [os.path.join(jpegs, rel) for rel in rels[:4]] and labels == [7, 8, 9, 10]
    assert _dali_files.given(rels[:3], None, jpegs) == ([os.path.join(jpegs, r) for r in rels[:3]], [0, 1, 2])
    listing.write_text(f"{rels[0]} seven\n")
    with pytest.raises(ValueError, match="line 1"):
        _dali_files.listed(str(listing), jpegs)
    with pytest.raises(ValueError, match="2 values for 3 files"):
        _dali_files.given(rels[:3], [1, 2], jpegs)


def test_two_epochs_give_each_file_once_in_dataloaders_order_and_the_node_opens_it_once(tmp_path, jpegs):
    files = _source_files(jpegs)
    (tmp_path / "mnt").mkdir()
    with SlowFS(jpegs, str(tmp_path / "mnt"), open_ms=2.0) as mnt, Opens(jpegs) as opens:
        pipe = staged(mnt, _config(tmp_path), decode=True, args={"random_shuffle": True, "seed": 11})
        pipe.build()
        epochs = _epochs(pipe, 2, decoded=True)
        _close(pipe)
        counts = opens.count()
    # The order DataLoader gives with the same seed, over the same files (one process, as here).
    paths, labels = _dali_files.tree(jpegs)
    ordered = DataLoader(_dali_files.EncodedFiles([os.path.join(jpegs, p) for p in paths], labels), batch_size=None,
                         shuffle=True, generator=torch.Generator().manual_seed(11))
    want = [[(_digest(data), int(label[0])) for data, label in ordered] for _ in range(2)]
    assert [[s[:2] for s in epoch] for epoch in epochs] == want
    assert want[0] != want[1]
    for epoch in epochs:
        assert sorted(files[d][0] for d, _, _ in epoch) == sorted(paths)
        for digest, label, image in epoch:
            rel, folder = files[digest]
            assert label == folder
            # DALI's decoder on the bytes given is PIL's decoding of the source file.
            assert np.array_equal(image, np.asarray(Image.open(os.path.join(jpegs, rel)).convert("RGB"))), rel
    assert dict(counts) == {rel: 1 for rel in paths}, "each file is fetched from the source once for the job"
    assert os.listdir(tmp_path / "local") == []


def test_a_dali_checkpoint_resumes_the_rest_of_the_epoch_in_order(tmp_path, jpegs):
    config = _config(tmp_path)
    pipe = staged(jpegs, config, args={"random_shuffle": True, "seed": 5})
    pipe.build()
    first = _epochs(pipe, 1)[0]
    for _ in range(2):
        pipe.run()
    checkpoint = pipe.checkpoint()
    rest = _epochs(pipe, 2)
    _close(pipe)
    del pipe
    again = staged(jpegs, config, args={"random_shuffle": True, "seed": 5}, checkpoint=checkpoint)
    again.build()
    resumed = _epochs(again, 2)
    _close(again)
    assert resumed == rest
    assert len(rest[0]) == 23 - 2 * BATCH and len(rest[1]) == 23
    assert {d for d, _ in first} == {d for d, _ in rest[1]} and first != rest[1]


def test_a_wrong_root_or_a_missing_file_is_named(tmp_path, jpegs):
    config = _config(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        staged(str(tmp_path / "nowhere"), config)
    rels, _ = _dali_files.tree(jpegs)

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
    def given(files):
        return reader(files=files, file_root=jpegs, config=config)

    with pytest.raises(FileNotFoundError, match="gone.jpg"):
        given(rels[:3] + ["c000/gone.jpg"])


def test_a_file_that_vanishes_after_the_listing_stops_the_run_naming_it(tmp_path, jpegs):
    root = tmp_path / "copy"
    rels, _ = _dali_files.tree(jpegs)
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(open(os.path.join(jpegs, rel), "rb").read())
    pipe = staged(str(root), dict(_config(tmp_path), **{"plan": {"seed": 0}}))
    (root / rels[3]).unlink()
    pipe.build()
    with pytest.raises(Exception, match=os.path.basename(rels[3])):
        _epochs(pipe, 1)
    _close(pipe)
    assert os.listdir(tmp_path / "local") == []


def test_arguments_dali_takes_are_checked_and_others_refused(tmp_path, jpegs):
    config = _config(tmp_path)
    with pytest.raises(RuntimeError, match="pipeline_def"):
        reader(file_root=jpegs, config=config)
    with pytest.raises(TypeError, match="shufle"):
        staged(jpegs, config, args={"random_shufle": True})
    with pytest.raises(ValueError, match="stick_to_shard"):
        staged(jpegs, config, args={"stick_to_shard": True})
    with pytest.raises(ValueError, match="rank 0 of 1"):
        staged(jpegs, config, args={"num_shards": 2, "shard_id": 1})
    pipe = staged(jpegs, config, args={"num_shards": 1, "shard_id": 0, "initial_fill": 64, "dont_use_mmap": True,
                                        "name": "Reader"})
    pipe.build()
    assert [len(epoch) for epoch in _epochs(pipe, 1)] == [23]
    assert len(readers(pipe)[0]) == 5
    _close(pipe)


def test_without_dali_the_import_names_the_extra():
    code = "import sys; sys.modules['nvidia.dali'] = None; import iterators.dali"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode != 0 and "pip install 'stager[dali]'" in done.stderr


def test_dalis_pytorch_iterator_reads_every_sample_each_epoch_without_a_reader_name(tmp_path, jpegs):
    from iterators.pytorch import StagedLoader  # noqa: F401  (torchvision beside a CPU-only torch, for DALI's plugin)
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None)
    def padded():
        encoded, labels = reader(file_root=jpegs, random_shuffle=True, seed=3, config=_config(tmp_path))
        return fn.pad(encoded), encoded.shape(), labels  # a dense tensor for the iterator

    files = _source_files(jpegs)
    pipe = padded()
    try:
        batches = DALIGenericIterator(pipe, ["data", "length", "label"], last_batch_policy=LastBatchPolicy.PARTIAL,
                                      auto_reset=True)
        for _ in range(2):
            seen = []
            for [batch] in batches:
                data, lengths, labels = batch["data"], batch["length"], batch["label"]
                seen += [(_digest(data[k, :int(lengths[k, 0])].numpy()), int(labels[k])) for k in range(len(labels))]
            assert sorted(seen) == sorted((d, label) for d, (_, label) in files.items())
    finally:
        _close(pipe)


def test_under_two_mpi_ranks_the_ranks_share_each_epoch(tmp_path):
    """The rank-level test (tests/mpi/test_dali_ranks.py) in a job of 2 ranks, as CI runs it at 1 and 4."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join("tests", "mpi", "test_dali_ranks.py")], capture_output=True, text=True,
                          timeout=300, cwd=repo, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("1 passed") == 2
