"""The parts of a shared group (``staging.share``): the shelf's rule, decoded-minibatch files, the settings,
and two pipelines of one process attached to one group, their samples checked against the source."""

import gc
import glob
import os
import threading
import uuid

import numpy as np
import pytest
import torch

from conftest import make_config
from stager.config import config_from_dict
from stager.engine import Pipeline, batchfile
from stager.engine.group.shelf import PUBLISH, SHARED, WAIT, Shelf
from stager.errors import ConfigError


class Request:
    """Stands for a service request: the shelf only keeps and compares them."""

    def __init__(self, job, seq=0):
        self.job, self.seq = job, seq


# The shelf's rule ---------------------------------------------------------


def publish(shelf, stream, key, request):
    """A rank decodes ``key`` and publishes it; returns its file."""
    verdict, path = shelf.claim(stream, key, request, 0.0)
    assert verdict == PUBLISH
    open(path, "wb").close()
    shelf.published(stream, key, request, ok=True, now=0.0)
    return path


def test_the_first_decodes_the_next_waits_and_takes_it_once_published(tmp_path):
    shelf = Shelf(str(tmp_path), window=4)
    a, b, c = Request("a"), Request("b"), Request("c")
    verdict, path = shelf.claim("s", (0, 0), a, 0.0)
    assert verdict == PUBLISH and path.startswith(str(tmp_path))
    assert shelf.claim("s", (0, 0), b, 0.0) == (WAIT, None)
    assert shelf.published("s", (0, 0), a, ok=True, now=0.0) == [(b, SHARED, path)]
    assert shelf.claim("s", (0, 0), c, 0.0) == (SHARED, path)
    assert shelf.claim("other stream", (0, 0), c, 0.0)[0] == PUBLISH, "another order or decoding decodes for itself"


def test_a_straggler_beyond_the_window_decodes_for_itself_and_the_leader_never_waits(tmp_path):
    shelf = Shelf(str(tmp_path), window=2)
    leader, straggler = Request("a"), Request("b")
    paths = [publish(shelf, "s", (0, step), leader) for step in range(5)]  # the leader runs ahead
    assert [shelf.holds("s", (0, step)) for step in range(5)] == [False, False, False, True, True], \
        "only the window's minibatches stay on the shelf"
    assert shelf.claim("s", (0, 0), straggler, 0.0)[0] == PUBLISH, "too far behind: it decodes itself"
    assert shelf.claim("s", (0, 4), straggler, 0.0) == (SHARED, paths[4])


def test_a_file_is_written_again_only_once_nobody_reads_it(tmp_path):
    shelf = Shelf(str(tmp_path), window=1)
    a, b = Request("a"), Request("b")
    first = publish(shelf, "s", (0, 0), a)
    assert shelf.claim("s", (0, 0), b, 0.0) == (SHARED, first)  # b reads it...
    second = publish(shelf, "s", (0, 1), a)
    third = publish(shelf, "s", (0, 2), a)
    assert len({first, second, third}) == 3, "...so it is not written while b reads it"
    shelf.let_go("s", (0, 0))
    assert publish(shelf, "s", (0, 3), a) in (first, second) and shelf.reused >= 1, \
        "off the shelf and read: written again instead of a fresh file"
    assert len(glob.glob(str(tmp_path / "*.batch"))) <= 4, "at most the window, the free files and one being read"


def test_a_rank_waits_for_a_late_decoding_only_a_few_times_the_usual(tmp_path):
    shelf = Shelf(str(tmp_path), window=8)
    a, b = Request("a"), Request("b")
    for step in range(3):  # decoding usually takes 0.5 s
        shelf.claim("s", (0, step), a, 10.0 * step)
        shelf.published("s", (0, step), a, ok=True, now=10.0 * step + 0.5)
    shelf.claim("s", (0, 3), a, 100.0)  # a stops while decoding minibatch 3
    assert shelf.claim("s", (0, 3), b, 100.1) == (WAIT, None)
    assert shelf.overdue(101.9) == [], "within 4 x 0.5 s"
    assert shelf.overdue(102.1) == [b], "then b decodes it for itself"
    assert shelf.overdue(103.0) == []


def test_when_the_decoder_leaves_the_first_waiting_takes_over(tmp_path):
    shelf = Shelf(str(tmp_path), window=4)
    a, b, c = Request("a"), Request("b"), Request("c")
    _, path = shelf.claim("s", (1, 3), a, 0.0)
    shelf.claim("s", (1, 3), b, 0.0)
    shelf.claim("s", (1, 3), c, 0.0)
    assert shelf.published("s", (1, 3), a, ok=False, now=0.0) == [(b, PUBLISH, path)]
    assert shelf.published("s", (1, 3), b, ok=True, now=0.0) == [(c, SHARED, path)]
    shelf.withdraw("s", (1, 3), c)  # harmless once answered


# Decoded minibatches in shared memory -------------------------------------


def test_a_minibatch_file_gives_back_equal_arrays_whose_writes_stay_the_ranks_own(tmp_path):
    rng = np.random.default_rng(0)
    samples = [(rng.random((3, 8, 8), dtype=np.float32), 4),
               (np.asfortranarray(rng.integers(0, 255, (5, 7), dtype=np.uint8)), 1),
               ({"jpg": rng.random((4, 4)).T, "cls": 2, "txt": b"x" * 5000}, None),
               (torch.arange(2000, dtype=torch.int64).reshape(40, 50), 0)]
    path = str(tmp_path / "0.batch")
    batchfile.put(path, [(np.ones(10 ** 6), 0)])  # a bigger minibatch wrote the file before
    batchfile.put(path, samples, 0.125)
    gone = threading.Event()
    back, seconds = batchfile.read(path, gone.set)
    assert seconds == 0.125, "the publisher's decoding time travels with the minibatch"
    assert np.array_equal(back[0][0], samples[0][0]) and back[0][1] == 4
    assert np.array_equal(back[1][0], samples[1][0]) and back[1][0].flags.f_contiguous
    assert np.array_equal(back[2][0]["jpg"], samples[2][0]["jpg"]) and back[2][0]["txt"] == b"x" * 5000
    assert isinstance(back[3][0], torch.Tensor) and torch.equal(back[3][0], samples[3][0])
    back[0][0][:] = 0  # a consumer normalising in place: its own page, not the group's file
    other, _ = batchfile.read(path, lambda: None)
    assert np.array_equal(other[0][0], samples[0][0]), "another job taking it sees the decoded pixels"
    os.unlink(path)  # the shelf removing it: the arrays keep their memory
    assert not back[0][0].any() and np.array_equal(back[1][0], samples[1][0])
    assert not gone.is_set(), "the file is the rank's while its arrays live"
    tensor = back[3][0]
    del back
    gc.collect()
    assert not gone.is_set(), "a tensor still views the mapping"
    del tensor
    gc.collect()
    assert gone.is_set(), "the last array gone: the file may be written again"


def test_a_minibatch_without_arrays_is_let_go_at_once(tmp_path):
    path = str(tmp_path / "0.batch")
    batchfile.put(path, [(b"bytes", 1), ("text", 2)])
    gone = threading.Event()
    assert batchfile.read(path, gone.set) == ([(b"bytes", 1), ("text", 2)], 0.0) and gone.is_set()


def test_a_minibatch_file_cut_short_is_an_error_not_a_minibatch(tmp_path):
    path = str(tmp_path / "0.batch")
    batchfile.put(path, [(np.arange(100000, dtype=np.float64), 1)])
    os.truncate(path, os.path.getsize(path) - 8)
    with pytest.raises(EOFError, match="8 bytes early"):
        batchfile.read(path, lambda: None)
    os.truncate(path, 10)
    with pytest.raises(EOFError, match="less than its header"):
        batchfile.read(path, lambda: None)


def test_a_file_a_rank_left_holding_is_unlinked_never_written_again(tmp_path):
    shelf = Shelf(str(tmp_path), window=1)
    a, b = Request("a"), Request("b")
    first = publish(shelf, "s", (0, 0), a)
    assert shelf.claim("s", (0, 0), b, 0.0) == (SHARED, first)
    shelf.let_go("s", (0, 0), left=True)  # b's job closed its loader and may keep the minibatch
    second = publish(shelf, "s", (0, 1), a)  # pushes (0, 0) off the shelf
    assert not os.path.exists(first), "unlinked: b's mapping keeps its pages"
    assert publish(shelf, "s", (0, 2), a) not in (first, second)


# Settings -----------------------------------------------------------------


@pytest.mark.parametrize("staging, named", [({"share": "a b"}, "staging.share"),
                                            ({"share": "x", "peers": "partition"}, "staging.peers"),
                                            ({"share": "x", "enabled": False}, "staging.enabled"),
                                            ({"share": "x", "share_window": 0}, "staging.share_window")])
def test_bad_share_settings_are_refused_by_name(staging, named):
    with pytest.raises(ConfigError, match=named):
        config_from_dict({"dataset": {"source": "/nonexistent"}, "staging": staging})


# Two pipelines of one process in one group --------------------------------


def test_two_pipelines_in_one_group_deliver_the_source_bytes_and_leave_nothing(slow_source, dataset, tmp_path):
    """Every sample equals the source's, also the samples kept while the shelf's files are written again
    (a window of 1: a file nobody maps any more is reused at once)."""
    root, _ = dataset
    name = f"t{uuid.uuid4().hex[:10]}"
    cfgs = [make_config(slow_source, tmp_path / "local", plan={"epochs": 2},
                        staging={"share": name, "share_window": 1, "job_id": job}) for job in ("x", "y")]
    seen, kept = {0: [], 1: []}, []
    with Pipeline(cfgs[0]) as first, Pipeline(cfgs[1]) as second:
        for one, two in zip(first, second):  # in step: each takes what the other decoded
            for k, batch in enumerate((one, two)):
                seen[k].append(batch.indices.tolist())
                if len(seen[k]) % 3 == 0:
                    kept += list(zip(batch.indices.tolist(), batch.samples))  # the others are dropped
        stats = [first.stats.summary()["group"], second.stats.summary()["group"]]
    for index, (data, label) in kept:
        assert np.array_equal(data, np.load(os.path.join(root, first.catalog.path(index)))), index
        assert label == first.catalog.label(index)
    steps = 2 * -(-100 // 8)
    assert seen[0] == seen[1] and len(seen[0]) == steps
    assert sum(s["samples_decoded"] + s["samples_from_group"] for s in stats) == 2 * 2 * 100
    assert sum(s["batches_from_group"] for s in stats) > 0
    assert sum(s["files_fetched"] for s in stats) == 100
    assert os.listdir(tmp_path / "local") == []
    assert not glob.glob(f"/dev/shm/stager-share-{os.getuid()}-{name}-*")


def test_a_group_directory_inside_the_source_is_refused_before_any_service_starts(dataset, tmp_path):
    root, _ = dataset
    cfg = make_config(root, os.path.join(root, "c000"), staging={"share": f"t{uuid.uuid4().hex[:10]}"})
    with pytest.raises(ConfigError, match="staging.local_dir .* lies inside the dataset source"):
        Pipeline(cfg).start()
