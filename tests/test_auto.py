"""``auto`` counts on real processes: pools resized mid-run, a source that gets slower."""

import multiprocessing
import multiprocessing.connection as mpc
import os
import time

import numpy as np
import pytest
from conftest import load_catalog, make_config, stager_workers

from stager import plan
from stager import telemetry as tm
from stager.engine import Pipeline
from stager.engine.messages import Decoded, ReadTask, StageTask, Staged
from stager.engine.rank.startup import _more_rings
from stager.engine.wire import Ring
from stager.engine.workers.pool import RETIRED, WorkerPool
from stager.engine.workers.loops import prefetcher_main, reader_main
from stager.job.synth import make_dataset
from stager.slowfs import SlowFS
from stager.sources import PosixSource


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """1,200 small samples: enough minibatches for the tuner to settle and then see the source change."""
    root = tmp_path_factory.mktemp("auto") / "data"
    make_dataset(str(root), 1200, nbytes=2048, classes=4, seed=5, progress=False)
    return str(root)


def _collect(pool, waiting, replies, until):
    """Reads replies until ``until()``; returns the retirements seen."""
    retired = 0
    while not until():
        ready = mpc.wait(list(pool.conns), timeout=10.0)
        assert ready, "no prefetcher replied within 10 s"
        for conn in ready:
            msg = pool.receive(conn)
            if msg is RETIRED:
                retired += 1
                continue
            assert isinstance(msg, Staged), msg
            replies.append(msg)
            waiting.discard(msg.task)
    return retired


def test_a_pool_grown_and_shrunk_mid_run_loses_no_task(many_files, tmp_path):
    """Real prefetchers copy real files while the pool grows by 3 and shrinks by 4: every task is answered once."""
    catalog = load_catalog(make_config(many_files, tmp_path))
    dest = tmp_path / "dest"
    dest.mkdir()
    ctx = multiprocessing.get_context("fork")
    pool = WorkerPool(ctx, "prefetch", "stager-prefetch", 2, prefetcher_main, (PosixSource(many_files), str(dest)))
    tasks = [StageTask(t, 0, t, [(i, catalog.path(i), int(catalog.sizes[i]), catalog.mtime(i))
                                 for i in range(4 * t, 4 * t + 4)]) for t in range(200)]
    waiting, replies = set(), []
    try:
        for task in tasks[:60]:
            pool.tasks.put(task)
            waiting.add(task.task)
        _collect(pool, waiting, replies, lambda: len(replies) >= 10)
        pool.grow(3)
        assert pool.size == 5 and len(pool.procs) == 5 and all(p.is_alive() for p in pool.procs)
        for task in tasks[60:130]:
            pool.tasks.put(task)
            waiting.add(task.task)
        assert pool.shrink(4) == 4 and pool.size == 1
        for task in tasks[130:]:
            pool.tasks.put(task)
            waiting.add(task.task)
        retired = _collect(pool, waiting, replies, lambda: not waiting)
        retired += _collect(pool, waiting, replies, lambda: pool.retired == 4)
    finally:
        pool.stop(10.0)
    assert retired == 4 and pool.retired == 4
    assert sorted(m.task for m in replies) == list(range(200)), "a task was lost or answered twice"
    assert {m.worker for m in replies} & {2, 3, 4}, "the grown workers took no task"
    for i in range(800):  # the files the tasks named
        with open(os.path.join(many_files, catalog.path(i)), "rb") as src, open(dest / catalog.path(i), "rb") as out:
            assert src.read() == out.read()
    assert not stager_workers("stager-prefetch")


def test_readers_grown_mid_run_decode_through_their_own_rings(many_files, tmp_path):
    """A grown reader pool (rings made first, as auto does) delivers every minibatch once with the source's arrays."""
    catalog = load_catalog(make_config(many_files, tmp_path))
    ctx = multiprocessing.get_context("fork")
    rings = [Ring()]
    pool = WorkerPool(ctx, "read", "stager-read", 1, reader_main, (many_files, "npy", {}, rings),
                      keep_fds=rings[0].fds, recv=lambda i, conn: rings[i].recv(conn), owned=rings)
    got = {}

    def task(seq):
        return ReadTask(seq, 0, seq, [(i, catalog.path(i), catalog.label(i)) for i in range(8 * seq, 8 * seq + 8)])

    try:
        for seq in range(10):
            pool.tasks.put(task(seq))
        keep, owned = _more_rings(rings, 2)
        pool.grow(2, keep, owned)
        assert len(rings) == 3 and pool.size == 3
        for seq in range(10, 40):
            pool.tasks.put(task(seq))
        pool.shrink(2)
        retired = 0
        while len(got) < 40 or retired < 2:
            ready = mpc.wait(list(pool.conns), timeout=10.0)
            assert ready, "no reader replied within 10 s"
            for conn in ready:
                msg = pool.receive(conn)
                if msg is RETIRED:
                    retired += 1
                    continue
                assert isinstance(msg, Decoded) and msg.seq not in got, msg
                got[msg.seq] = (msg.worker, [(np.array(x), y) for x, y in msg.samples])
    finally:
        pool.stop(10.0)
    assert sorted(got) == list(range(40)) and pool.retired == 2
    assert {w for w, _ in got.values()} & {1, 2}, "the grown readers decoded nothing"
    for seq, (_, samples) in got.items():
        for i, (data, label) in zip(range(8 * seq, 8 * seq + 8), samples):
            assert np.array_equal(data, np.load(os.path.join(many_files, catalog.path(i))))
            assert label == catalog.label(i)


def test_shrink_keeps_one_worker(tmp_path):
    ctx = multiprocessing.get_context("fork")
    pool = WorkerPool(ctx, "prefetch", "stager-prefetch", 2, prefetcher_main,
                      (PosixSource(str(tmp_path)), str(tmp_path)))
    try:
        assert pool.shrink(5) == 1 and pool.size == 1
        assert pool.shrink(1) == 0 and pool.size == 1
    finally:
        pool.stop(10.0)


STEP_S = 0.08  # a training step of 8 samples


def test_auto_grows_the_prefetchers_when_the_source_gets_slower_than_the_pool_covers(many_files, tmp_path):
    slow = SlowFS(many_files, open_ms=25.0, mbps=0)
    with slow as mnt:
        # One file in flight a prefetcher (set): the pool of processes is what follows the source.
        cfg = make_config(mnt, tmp_path / "local", dataset={"loader": "raw", "requests_in_flight": 1},
                          plan={"batch_size": 8, "epochs": 1},
                          staging={"prefetchers": "auto", "lookahead": 8}, reader={"workers": "auto"})
        catalog = load_catalog(cfg)
        seen, payload, slowed_at, slowed_pool = [], [], None, None
        with Pipeline(cfg, catalog) as pipe:
            started_with = pipe.start().counts[0]
            for batch in pipe:
                seen.append((batch.epoch, batch.step, batch.indices.tolist()))
                payload.append(batch.samples)
                # The training step: 8 samples per 80 ms, a demand of 100 files/s.
                # At 25 ms an open that takes under 3 busy prefetchers, well below
                # the shrink rule's bound (0.6 of the pool, half of it busy) even on a
                # loaded machine, so the pool (generous at start) shrinks.
                time.sleep(STEP_S)
                if slowed_at is None:
                    sizes = [b for _, _, a, b, _ in pipe.stats.telemetry.events([tm.RESIZED]) if a == 0]
                    if sizes and sizes[-1] < started_with:
                        # Once it has shrunk, the source slows down so far that the pool it
                        # kept covers 5/8 of the demand: it has to grow again.
                        slowed_pool = sizes[-1]
                        slowed_at = time.monotonic() - pipe.stats.telemetry.started
                        slow.set(open_ms=1000.0 * slowed_pool / (5 / 8 * 8 / STEP_S))
            resized = [(t, b) for t, _, a, b, _ in pipe.stats.telemetry.events([tm.RESIZED]) if a == 0]
    assert slowed_at is not None, f"the pool never shrank from {started_with} on a fast source: {resized}"
    # A decision judged on a window from before the slowdown may still shrink the pool first;
    # what must follow is a growth past the smallest size it had since.
    after = [b for t, b in resized if t > slowed_at]
    assert after and max(after) > min([slowed_pool] + after), (started_with, slowed_at, slowed_pool, resized)
    assert seen == [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    assert sorted(i for _, _, idx in seen for i in idx) == list(range(len(catalog)))
    for (_, _, idx), samples in zip(seen, payload):
        for i, (data, label) in zip(idx, samples):
            with open(os.path.join(many_files, catalog.path(i)), "rb") as fh:
                assert data == fh.read()
            assert label == catalog.label(i)
