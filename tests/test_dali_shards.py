"""iterators.dali.webdataset: tar shards (written by the webdataset library) read as DALI's own reader reads them.

DALI's ``fn.readers.webdataset`` is the reference for the outputs and their
order; an inotify count behind the emulator shows each shard fetched once.
"""

import os

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")
webdataset_lib = pytest.importorskip("webdataset")
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from iterators.dali import readers, webdataset  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402

from helpers.dali_runs import epochs as run_epochs  # noqa: E402
from helpers.opens import Opens  # noqa: E402

BATCH = 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three shards of 5, 6 and 7 samples (one in a subdirectory) and one more the readers are not given."""
    root = tmp_path_factory.mktemp("wds")
    (root / "sub").mkdir()
    rng = np.random.default_rng(3)
    paths = []
    for n, (rel, count) in enumerate([("b.tar", 5), ("sub/a.tar", 6), ("c.tar", 7), ("other.tar", 2)]):
        with webdataset_lib.TarWriter(str(root / rel)) as sink:
            for k in range(count):
                sink.write({"__key__": f"s{n}-{k:03d}", "jpg": rng.bytes(int(rng.integers(10, 90))),
                            "cls": str(k % 3).encode(), "idx": np.int32(100 * n + k).tobytes()})
        paths.append(str(root / rel))
    return str(root), paths[:3]


def _epochs(pipe, count):
    return run_epochs(pipe, count, lambda outputs, k: tuple(bytes(np.array(o.at(k))) for o in outputs))


def test_unshuffled_the_outputs_and_their_order_are_dalis_own(tmp_path, shards):
    _, paths = shards
    given = [paths[2], paths[0], paths[1]]  # not sorted: the order given is the order read

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
    def own():
        return tuple(fn.readers.webdataset(paths=given, ext=["jpg", "cls"], name="R"))

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
    def staged():
        return tuple(webdataset(paths=given, ext=["jpg", "cls"], name="R",
                                config={"staging": {"local_dir": str(tmp_path / "local")}}))

    reference = own()
    reference.build()
    size = reference.reader_meta("R")["epoch_size"]
    want = []
    while len(want) < size:
        outputs = reference.run()
        want += [tuple(bytes(np.array(o.at(k))) for o in outputs) for k in range(len(outputs[0]))]
    pipe = staged()
    pipe.build()
    try:
        got = _epochs(pipe, 1)[0]
    finally:
        for source in readers(pipe):
            source.close()
    assert size == 18 and got == want[:size]


def test_shuffled_epochs_give_each_sample_once_with_its_types_and_fetch_each_shard_once(tmp_path, shards):
    root, paths = shards
    (tmp_path / "mnt").mkdir()
    with SlowFS(root, str(tmp_path / "mnt"), open_ms=2.0) as mnt, Opens(root) as opens:
        mounted = [os.path.join(mnt, os.path.relpath(p, root)) for p in paths]

        @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
        def staged():
            return tuple(webdataset(paths=mounted, ext=["idx", "CLS"], dtypes=[types.INT32, np.uint8],
                                    random_shuffle=True, seed=4,
                                    config={"staging": {"local_dir": str(tmp_path / "local")}}))

        pipe = staged()
        pipe.build()
        try:
            epochs = _epochs(pipe, 2)
        finally:
            for source in readers(pipe):
                source.close()
        counts = opens.count()
    expected = sorted(100 * n + k for n, count in enumerate([5, 6, 7]) for k in range(count))
    for epoch in epochs:
        values = [int(np.frombuffer(idx, np.int32)[0]) for idx, _ in epoch]
        assert sorted(values) == expected
        assert all(cls == str(v % 100 % 3).encode() for v, (_, cls) in zip(values, epoch))
    assert epochs[0] != epochs[1]
    # Every shard under the paths' directory has its headers read once when the catalog is made (stager's tar
    # index, as DALI's own reader indexes each archive); a shard the reader is given is then fetched once.
    assert dict(counts) == {**{os.path.relpath(p, root): 2 for p in paths}, "other.tar": 1}
    assert os.listdir(tmp_path / "local") == []


def test_what_is_not_served_is_refused_naming_it(tmp_path, shards):
    root, paths = shards
    config = {"staging": {"local_dir": str(tmp_path / "local")}}

    def build(**args):
        @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
        def staged():
            return tuple(webdataset(config=config, **args))
        return staged()

    with pytest.raises(ValueError, match="jpg;png"):
        build(paths=paths, ext=["jpg;png", "cls"])
    with pytest.raises(FileNotFoundError, match="missing.tar"):
        build(paths=paths + [os.path.join(root, "missing.tar")], ext=["jpg"])
    with pytest.raises(Exception, match="no txt part"):
        build(paths=paths, ext=["jpg", "txt"])
    with pytest.raises(ValueError, match="not a whole number"):
        pipe = build(paths=paths, ext=["jpg"], dtypes=[types.INT64])
        try:
            pipe.build()
            _epochs(pipe, 1)
        finally:
            for source in readers(pipe):
                source.close()


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory):
    """40 samples (a JPEG, an int) in several MDS shards, by Streaming's own MDSWriter."""
    streaming = pytest.importorskip("streaming", reason="MosaicML Streaming is not installed (extra 'mds')")
    from PIL import Image

    out = str(tmp_path_factory.mktemp("mds") / "data")
    rng = np.random.default_rng(5)
    with streaming.MDSWriter(out=out, columns={"image": "jpeg", "label": "int"}, size_limit=1 << 13) as writer:
        for i in range(40):
            writer.write({"image": Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)),
                          "label": 1000 + i})
    return out


def test_mds_columns_come_as_stored_and_decode_as_streaming_decodes_them(tmp_path, mds_dir):
    from streaming import StreamingDataset

    from iterators.dali import shards as shards_reader

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)
    def staged(shuffle):
        jpegs, labels = shards_reader(mds_dir, ["image", "label"], format="mds", dtypes=[types.UINT8, types.INT64],
                                      random_shuffle=shuffle, seed=2,
                                      config={"staging": {"local_dir": str(tmp_path / "local")}})
        return jpegs, labels, fn.decoders.image(jpegs, device="cpu")

    theirs = StreamingDataset(local=mds_dir, shuffle=False, batch_size=1)
    want = [(int(theirs[i]["label"]), np.asarray(theirs[i]["image"])) for i in range(len(theirs))]
    runs = []
    for shuffle in (False, True):
        pipe = staged(shuffle)
        pipe.build()
        try:
            runs.append(_run_labelled(pipe))
        finally:
            for source in readers(pipe):
                source.close()
    unshuffled, shuffled = runs
    assert [label for label, _ in unshuffled[0]] == [label for label, _ in want]
    for (label, image), (_, reference) in zip(unshuffled[0], want):
        assert np.array_equal(image, reference), label
    for epoch in shuffled:
        assert sorted(label for label, _ in epoch) == sorted(label for label, _ in want)
    assert [label for label, _ in shuffled[0]] != [label for label, _ in shuffled[1]]


def _run_labelled(pipe):
    return run_epochs(pipe, 2, lambda outputs, k: (int(np.array(outputs[1].at(k))[0]), np.array(outputs[2].at(k))))
