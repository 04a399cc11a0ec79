"""``staging.lookahead: auto`` goes deeper while running where the source's latency needs it, room allowing.

Real runs over the FUSE-emulated file system, one file a minibatch and 24
prefetchers: with an open of 600 ms against a training step of 5 ms, a
minibatch must be asked for over 100 steps ahead to be staged by its turn
(past 16 for any step under 37 ms: a loaded machine's too), and 16
requests leave prefetchers idle, so the look-ahead deepens past the
start's 16; with an open of 1 ms, two suffice and the start's depth stays.
With 4 prefetchers and two files a minibatch every prefetcher is busy at
16: the source's pace is the limit, and the depth stays. It never passes
what the node's capacity leaves room for. Every run delivers every sample
once, in plan order, with the source's bytes.
"""

import os
import threading

import numpy as np
import pytest

from stager import plan
from stager.cache import AUTO_DEPTH, MAX_DEPTH, fitting_depth, needed_depth
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.engine.tuning.deepening import Deepening
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS
from stager.telemetry import POOL_LOOKAHEAD, RESIZED, Telemetry

FILES = 96
NBYTES = 4096


@pytest.fixture(scope="module")
def backing(tmp_path_factory):
    root = tmp_path_factory.mktemp("deep")
    make_dataset(str(root), FILES, nbytes=NBYTES, classes=3, seed=5, progress=False)
    return root


def _run(mnt, backing, tmp_path, step_s, batch=1, prefetchers=24, **staging):
    """One shuffled epoch with ``auto`` look-ahead; returns ``(look-ahead over the run, catalog, cfg)``."""
    cfg = config_from_dict({"dataset": {"source": str(mnt), "manifest": MANIFEST, "loader": "npy",
                                        "requests_in_flight": 8},
                            "plan": {"batch_size": batch, "epochs": 1, "seed": 11},
                            "staging": {"local_dir": str(tmp_path / "local"), "prefetchers": prefetchers,
                                        "lookahead": "auto",
                                        **staging},
                            "reader": {"workers": 2}})
    batches = []
    pause = threading.Event()
    with Pipeline(cfg) as pipe:
        for batch in pipe:
            batches.append((batch.epoch, batch.step, batch.indices.tolist(), batch.samples))
            pause.wait(step_s)  # the training step (nothing sets it)
        depths = [row["lookahead"] for row in pipe.counts_timeline()]
        catalog = pipe.catalog
    expected = [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    assert [b[:3] for b in batches] == expected
    for _, _, indices, samples in batches:
        for i, (data, label) in zip(indices, samples):
            assert np.array_equal(data, np.load(os.path.join(backing, catalog.path(i)))), catalog.path(i)
            assert label == catalog.label(i)
    return depths


def test_a_source_slow_against_the_step_deepens_the_look_ahead_past_the_start(backing, tmp_path):
    with SlowFS(str(backing), open_ms=600.0) as mnt:
        depths = _run(mnt, backing, tmp_path, 0.005)
    assert depths[0] == AUTO_DEPTH
    assert max(depths) > AUTO_DEPTH, depths
    assert max(depths) <= MAX_DEPTH


def test_a_fast_source_keeps_the_start_depth(backing, tmp_path):
    with SlowFS(str(backing), open_ms=1.0) as mnt:
        depths = _run(mnt, backing, tmp_path, 0.05)
    assert depths == [AUTO_DEPTH]


def test_prefetchers_all_busy_keep_the_start_depth(backing, tmp_path):
    with SlowFS(str(backing), open_ms=300.0) as mnt:
        depths = _run(mnt, backing, tmp_path, 0.005, batch=2, prefetchers=4)
    assert depths == [AUTO_DEPTH]


def test_the_look_ahead_never_deepens_past_the_room_the_capacity_leaves(backing, tmp_path):
    sizes = [os.path.getsize(backing / line.split("\t")[0]) for line in open(backing / MANIFEST)]
    assert len(set(sizes)) == 1  # so the window's largest files are the mean's
    total = sum(sizes)
    capacity = total + 20 * sizes[0]
    deepest = fitting_depth(capacity, total, FILES, 1, 1, 1.0, MAX_DEPTH)[0]
    assert AUTO_DEPTH < deepest < MAX_DEPTH
    with SlowFS(str(backing), open_ms=600.0) as mnt:
        depths = _run(mnt, backing, tmp_path, 0.005, capacity=str(capacity))
    assert max(depths) > AUTO_DEPTH, depths
    assert max(depths) <= deepest, depths


def test_the_depth_follows_littles_law_one_step_at_a_time_between_the_start_and_the_ceiling():
    telemetry = Telemetry()
    deep = Deepening(4, 8, telemetry)
    deep.staged(0.0, True)  # a minibatch already local says nothing of the source
    assert deep.consumed(0.0, 0.0) == 4 and deep.consumed(0.01, 0.0) == 4  # no fetch measured yet
    deep.staged(0.2, True)
    assert deep.consumed(0.015, 0.0) == 4  # one answer with a prefetcher idle is not yet the rule
    for _ in range(3):
        deep.staged(0.2, True)
    assert needed_depth(0.2, 0.01) == 21
    assert deep.consumed(0.025, 0.0) == 5  # one deeper at a time: the prefetchers say whether it helped
    # The time the consumer waited is not the training's: a stalled loop does not look slow.
    assert deep.consumed(0.535, 0.5) == 6
    for _ in range(4):
        deep.staged(0.2, False)  # every prefetcher busy: the source's pace is the limit
    assert deep.consumed(0.545, 0.0) == 6
    for _ in range(5):
        deep.staged(0.2, True)
    now = 0.545
    for _ in range(10):
        now += 0.01
        deep.consumed(now, 0.0)
    assert deep.depth == 8  # the ceiling: the node's room
    for _ in range(100):  # a training slower than the fetches: back to the floor, never below
        now += 1.0
        deep.consumed(now, 0.0)
    assert deep.depth == 4
    changes = [(a, b) for _, _, a, b, _ in telemetry.events([RESIZED])]
    assert changes == [(POOL_LOOKAHEAD, d) for d in (5, 6, 7, 8, 4)]
