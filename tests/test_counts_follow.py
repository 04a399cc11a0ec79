"""``auto`` counts that follow a source whose latency changes mid-run (Lobster's run-time split).

One source directory holds two real FUSE mounts of the emulated slow file
system, ``fast/`` (1 ms an open) and ``slow/`` (80 ms in the first test),
and the manifest lists one half and then the other; the epoch is read in
catalog order. The report's ``counts_timeline`` must show the prefetchers'
requests raised while the slow half is fetched (the probe read the fast
half's first files) or started high enough for it (it read the slow half's),
and lowered once the source is fast again; every sample must arrive once,
in plan order, with the source's bytes.
"""

import os
import resource
import subprocess
import threading

import pytest
from conftest import stager_cmd

from stager import plan
from stager import telemetry as tm
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.engine.workers import limits
from stager.engine.perf.start import MAX_PREFETCHERS
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS

HALF = 384
BATCH = 32


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    """Two backing directories of ``HALF`` small ``.npy`` samples each."""
    root = tmp_path_factory.mktemp("halves")
    for seed, name in ((1, "fast"), (2, "slow")):
        make_dataset(str(root / name), HALF, nbytes=8192, classes=4, seed=seed, progress=False)
    return root


def _source(tmp_path, halves, first):
    """A source directory with empty mount points ``fast`` and ``slow`` and a manifest, ``first`` half first."""
    src = tmp_path / "src"
    for name in ("fast", "slow"):
        (src / name).mkdir(parents=True)
    order = (first, "slow" if first == "fast" else "fast")
    lines = [f"{name}/{line}" for name in order for line in open(halves / name / MANIFEST)]
    (src / MANIFEST).write_text("".join(lines))
    return src


def _run(src, halves, tmp_path, step_s, on_batch=None, dataset=None, **staging):
    """Runs one unshuffled epoch with ``auto`` counts; returns ``(batches, timeline, staged indices in order)``."""
    cfg = config_from_dict({"dataset": {"source": str(src), "manifest": MANIFEST, "loader": "raw", **(dataset or {})},
                            "plan": {"batch_size": BATCH, "epochs": 1, "shuffle": False},
                            "staging": {"local_dir": str(tmp_path / "local"), "prefetchers": "auto",
                                        "lookahead": 4, **staging},
                            "reader": {"workers": "auto"}})
    batches = []
    done = threading.Event()
    with Pipeline(cfg) as pipe:
        for batch in pipe:
            batches.append((batch.epoch, batch.step, batch.indices.tolist(), batch.samples))
            if on_batch is not None:
                on_batch(len(batches))
            done.wait(step_s)  # the training step (nothing sets it: a fixed compute time)
        timeline = pipe.counts_timeline()
        staged = [(t, a) for t, _, a, _, _ in pipe.stats.telemetry.events([tm.STAGED])]
        catalog = pipe.catalog
    return batches, timeline, staged, catalog, cfg


def _check_records(batches, catalog, cfg, halves):
    expected = [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    assert [b[:3] for b in batches] == expected
    for _, _, indices, samples in batches:
        for i, (data, label) in zip(indices, samples):
            with open(halves / catalog.path(i), "rb") as fh:
                assert data == fh.read(), f"sample {i} differs from {catalog.path(i)}"
            assert label == catalog.label(i)


def _requests(row):
    return row["prefetchers"] * row["in_flight"]


def _requests_at(timeline, t):
    """The requests kept out at time ``t`` (the last change at or before it)."""
    return [_requests(r) for r in timeline if r["t"] <= t][-1]


@pytest.mark.parametrize("first", ["fast", "slow"])
def test_requests_rise_while_the_source_is_slow_and_fall_once_it_is_fast(tmp_path, halves, first):
    src = _source(tmp_path, halves, first)
    with SlowFS(str(halves / "fast"), str(src / "fast"), open_ms=1.0), \
            SlowFS(str(halves / "slow"), str(src / "slow"), open_ms=80.0):
        batches, timeline, staged, catalog, cfg = _run(src, halves, tmp_path, 0.1)
    _check_records(batches, catalog, cfg, halves)
    slow = {i for i in range(len(catalog)) if catalog.path(i).startswith("slow/")}
    slow_times = [t for t, i in staged if i in slow]
    begin, end = min(slow_times), max(slow_times)
    start = _requests(timeline[0])
    assert all(r["prefetchers"] <= MAX_PREFETCHERS for r in timeline)
    if first == "fast":
        # The probe read the fast half's first files; raised while the slow half is fetched, before half of it
        # was staged.
        halfway = sorted(slow_times)[len(slow_times) // 2]
        assert max(_requests(r) for r in timeline if begin <= r["t"] <= halfway) > start, (start, timeline)
    else:
        # The probe read the slow half's first files: the start covers it (80 ms an open, a minibatch of 32
        # every 0.1 s: Little's law asks for 26 files in flight).
        assert start >= 26, timeline
        # Lowered once the source is fast again (the fast half is read at the training's pace).
        top = _requests_at(timeline, end)
        assert any(_requests(r) < top for r in timeline if r["t"] > end), (end, timeline)


def test_a_source_that_stalls_for_two_seconds_grows_within_the_open_files_limit_and_comes_back(tmp_path, halves):
    """Every open of the fast half that starts within 2 s waits 2 s, then opens take 1 ms again.

    The process's open-files limit is lowered so that it, not memory or the
    source, bounds the growth: the pool must stop short of it (and the run
    must not fail with EMFILE), and shrink again once the source recovers.
    One file in flight a prefetcher, so that the pool of processes is what grows.
    """
    src = _source(tmp_path, halves, "fast")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    room = 10  # workers this process may add: its prefetchers, readers and their descriptors
    low = used + limits.FD_HEADROOM + limits.FDS_PER_WORKER * room + 32
    fast_fs = SlowFS(str(halves / "fast"), str(src / "fast"), open_ms=1.0)
    slow_fs = SlowFS(str(halves / "slow"), str(src / "slow"), open_ms=1.0)
    timers = []

    def stall(count):
        if count == 3:  # a few minibatches in: the source hangs for 2 s, then recovers
            fast_fs.set(open_ms=2000.0)
            timer = threading.Timer(2.0, fast_fs.set, kwargs={"open_ms": 1.0})
            timers.append(timer)
            timer.start()

    resource.setrlimit(resource.RLIMIT_NOFILE, (min(low, soft), hard))
    try:
        with fast_fs, slow_fs:
            batches, timeline, staged, catalog, cfg = _run(src, halves, tmp_path, 0.2, on_batch=stall,
                                                           dataset={"requests_in_flight": 1})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for timer in timers:
            timer.join()
    _check_records(batches, catalog, cfg, halves)
    sizes = [r["prefetchers"] for r in timeline]
    most = max(sizes)
    assert most > sizes[0], f"the pool never grew while the source hung: {timeline}"
    assert most <= (low - limits.FD_HEADROOM) // limits.FDS_PER_WORKER, (low, timeline)
    top = sizes.index(most)
    assert min(sizes[top:]) < most, f"the pool did not come back down after the stall: {timeline}"


def test_counts_timeline_is_in_the_report(tmp_path, halves):
    from stager.telemetry import pipeline_report

    # The fast half first: the probe measures 1 ms opens and starts small, then the slow half keeps the loop
    # waiting on the source, so the counts change at least once whatever the machine's speed. (Slow first,
    # a probe that starts at the most files in flight may have nothing left to change.) 80 ms, as in the first
    # test: at 30 ms the slow half took 0.7 s at the start's 16 files in flight, under the two windows the
    # controller needs to answer on a loaded machine, and the counts once never changed.
    src = _source(tmp_path, halves, "fast")
    with SlowFS(str(halves / "fast"), str(src / "fast"), open_ms=1.0), \
            SlowFS(str(halves / "slow"), str(src / "slow"), open_ms=80.0):
        cfg = config_from_dict({"dataset": {"source": str(src), "manifest": MANIFEST, "loader": "raw"},
                                "plan": {"batch_size": BATCH, "epochs": 1, "shuffle": False},
                                "staging": {"local_dir": str(tmp_path / "local"), "prefetchers": "auto"},
                                "reader": {"workers": 1}})
        with Pipeline(cfg) as pipe:
            for _ in pipe:
                pass
            report = pipeline_report(pipe, cfg, str(tmp_path / "r.json"))
    rows = report["counts_timeline"]
    assert rows[0]["t"] == 0.0 and rows[0]["readers"] == 1 and rows[0]["in_flight"] > 1
    assert rows[0]["why"].startswith("auto, from a probe: open ")
    assert all(set(r) == {"t", "prefetchers", "in_flight", "readers", "lookahead", "why"} for r in rows)
    assert all(r["why"] for r in rows), rows
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    assert {r["readers"] for r in rows} == {1}, "fixed readers never change"
    assert len(rows) > 1 and len({_requests(r) for r in rows}) > 1
    # ``stager report`` lists every change beside the rest.
    out = subprocess.run(stager_cmd("report", str(tmp_path / "r.json"), "--no-plots"), capture_output=True,
                         text=True, check=True, timeout=120).stdout
    assert f"counts at start: {rows[0]['prefetchers']} prefetcher(s) x {rows[0]['in_flight']} file(s) in " \
           f"flight, 1 reader(s): auto, from a probe" in out
    table = out.split("counts over the run")[1].split("\n\n")[0]  # up to the next section (the CPU ledger)
    assert f"{len(rows) - 1} change(s)" in table
    lines = [line.split() for line in table.splitlines()[1:] if line.strip()]
    assert lines[0][:2] == ["s", "prefetchers"]
    assert [(float(x[0]), int(x[1]), int(x[2])) for x in lines[1:]] == \
        [(round(r["t"], 2), r["prefetchers"], r["in_flight"]) for r in rows]
