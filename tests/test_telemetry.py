"""The telemetry room: every minibatch's events, in causal order, and Stats as a view over them."""

from collections import defaultdict

from conftest import make_config

from stager import telemetry as tm
from stager.engine import Pipeline


def test_every_minibatch_is_needed_ready_read_delivered_and_consumed_in_that_order(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 2})
    with Pipeline(cfg) as pipe:
        delivered = [(b.step, len(b.samples), b.times.stall) for b in pipe]
        events = pipe.stats.telemetry.events()
        stats = pipe.stats
    n = len(pipe.catalog)
    per_seq = defaultdict(list)
    for t, kind, a, b, value in events:
        if kind in ("needed", "ready", "read", "delivered", "consumed"):
            per_seq[a].append((kind, t, b, value))
    assert sorted(per_seq) == list(range(len(delivered)))
    for seq, trail in per_seq.items():
        assert [k for k, *_ in trail] == ["needed", "ready", "read", "delivered", "consumed"], seq
        times = [t for _, t, *_ in trail]
        assert times == sorted(times), f"minibatch {seq}: events out of causal order"
        assert trail[-1][2] == delivered[seq][1] and trail[-1][3] == delivered[seq][2]
    staged = [(a, b) for _, kind, a, b, _ in events if kind == "staged"]
    assert sorted(i for i, _ in staged) == list(range(n)), "each file staged once over both epochs"
    # The view agrees with the log it is built from.
    assert stats.files_staged == n and stats.bytes_staged == sum(b for _, b in staged)
    assert stats.batches == len(delivered) and stats.samples == 2 * n
    assert abs(stats.stall_s - sum(s for *_, s in delivered)) < 1e-9
    assert abs(stats.prefetch_s - sum(v for *_, kind, _, _, v in events if kind == "task")) < 1e-9
    assert len(pipe.stats.telemetry) == len(events)


def test_events_recorded_by_several_threads_merge_in_time_order():
    import threading

    log = tm.Telemetry()
    start = threading.Barrier(4)

    def record(k):
        start.wait()
        for i in range(500):
            log.record(tm.READ, k, i, 0.0)

    threads = [threading.Thread(target=record, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = log.events()
    assert len(events) == 2000 and [e[0] for e in events] == sorted(e[0] for e in events)
    for k in range(4):
        assert [b for _, _, a, b, _ in events if a == k] == list(range(500)), "a thread's own order is kept"
    assert log.events(kinds={tm.CONSUMED}) == []


def test_arrays_hold_the_same_events_as_the_list_in_the_same_order(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local")
    with Pipeline(cfg) as pipe:
        for _ in pipe:
            pass
    log = pipe.stats.telemetry
    events = log.events()
    t, kind, a, b, value = log.arrays()
    assert len(t) == len(events) == len(log)
    assert [(tm.KINDS[k], x, y) for k, x, y in zip(kind.tolist(), a.tolist(), b.tolist())] == \
        [(e[1], e[2], e[3]) for e in events]
    assert t.tolist() == [e[0] for e in events] and value.tolist() == [e[4] for e in events]
    assert "finished" in {e[1] for e in events}, "the next() that found the end is recorded"


def test_a_resized_prefetch_pool_is_accounted_by_its_mean_size_over_the_staging_time():
    from stager.telemetry.accounting import _mean_size, account

    # 3 workers for 1 s, 24 for 1 s, 48 for 2 s: (3 + 24 + 96) / 4
    assert _mean_size(3, [(1.0, 24), (2.0, 48)], 0.0, 4.0) == (3 + 24 + 96) / 4
    assert _mean_size(3, [(-1.0, 10), (5.0, 20)], 0.0, 4.0) == 10, "changes outside the window count as they stand"
    assert _mean_size(3, [], 0.0, 4.0) == 3
    log = tm.Telemetry()
    log.record(tm.QUEUED, 0, 2)
    log.record(tm.RESIZED, tm.POOL_PREFETCH, 24, 0.01)
    log.record(tm.RESIZED, tm.POOL_READ, 5, 0.01)  # the readers' pool is not the prefetchers'
    log.record(tm.TASK, 0, 2, 0.02)
    mean = account(log, rank=0, node="n", readers=2, prefetchers=3)["stages"]["prefetch"]["workers"]
    assert isinstance(mean, float) and 3 <= mean <= 24
    quiet = tm.Telemetry()
    quiet.record(tm.QUEUED, 0, 2)
    quiet.record(tm.TASK, 0, 2, 0.02)
    assert account(quiet, rank=0, node="n", readers=2, prefetchers=3)["stages"]["prefetch"]["workers"] == 3


def test_a_prefetcher_keeping_files_in_flight_is_accounted_by_its_slots():
    from stager.telemetry.accounting import _product, account, job_stages

    # 2 processes x 4 files, then 3 x 4 at 1 s, then 3 x 8 at 2 s.
    assert _product(2, [(1.0, 3)], 4, [(2.0, 8)]) == [(1.0, 12), (2.0, 24)]
    log = tm.Telemetry()
    log.record(tm.QUEUED, 0, 8)
    # 8 files of 0.5 s each, fetched 4 at a time by one process: 4 busy seconds in 1 s of wall time.
    log.record(tm.TASK, 0, 8, 4.0)
    p = account(log, rank=0, node="n", readers=2, prefetchers=1, in_flight=4)["stages"]["prefetch"]
    assert (p["workers"], p["in_flight"], p["slots"]) == (1, 4, 4)
    assert p["seconds_per_file"] == 0.5
    # All 4 slots busy deliver 4 files each 0.5 s: 8 files/s, not the 2 of one process taking a file at a time.
    record = account(log, rank=0, node="n", readers=2, prefetchers=1, in_flight=4)
    assert job_stages([record])["prefetch"]["capacity_files_per_s"] == 8.0
    # A files-in-flight change (auto) moves the slots' mean, not the processes'.
    log.record(tm.RESIZED, tm.POOL_IN_FLIGHT, 16, 0.01)
    log.record(tm.TASK, 0, 8, 1.0)
    p = account(log, rank=0, node="n", readers=2, prefetchers=1, in_flight=4)["stages"]["prefetch"]
    assert p["workers"] == 1 and 4 <= p["in_flight"] <= 16 and p["slots"] == p["in_flight"]


def test_per_file_events_keep_a_bounded_window_and_their_totals_stay_exact():
    """A long run's per-file events (one per file per epoch) must not grow the log without end: each thread
    keeps its latest, the older ones are counted, and the accounting's totals are those of every event."""
    import threading

    from stager.telemetry.accounting import account

    kept = tm.FILE_EVENTS_KEPT
    log = tm.Telemetry()
    per_thread = 5 * kept + 123
    start = threading.Barrier(2)

    def stage(k):
        start.wait()
        for i in range(per_thread):
            # every 10th a copy found already there, every 7th one a full disk refused
            b = tm.PRESENT if i % 10 == 0 else tm.NO_SPACE if i % 7 == 0 else 100 + k
            log.record(tm.STAGED, i, b, 0)
            log.record(tm.PEER, i, 7, 0)
            if i % 1000 == 0:
                log.record(tm.CONSUMED, i, 1, 0.0)  # per-minibatch events are all kept

    threads = [threading.Thread(target=stage, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = len(range(0, per_thread, 1000))
    assert len(log) <= 2 * (2 * kept + steps), "each thread keeps at most twice the window of per-file events"
    assert len(log.events([tm.CONSUMED])) == 2 * steps
    present = [i % 10 == 0 for i in range(per_thread)]
    copied = [not p and i % 7 != 0 for i, p in enumerate(present)]
    want_files = 2 * sum(copied)
    want_bytes = sum(sum(copied) * (100 + k) for k in range(2))
    assert log.file_totals(tm.STAGED) == (want_files, want_bytes, 2 * sum(present))
    assert log.file_totals(tm.PEER) == (2 * per_thread, 2 * per_thread * 7, 0)
    latest = [a for _, kind, a, _, _ in log.events([tm.STAGED])]
    # each thread keeps its latest W to 2W per-file events, half of them STAGED here
    assert max(latest) == per_thread - 1 and len(latest) >= kept, "the latest per-file events are the ones kept"
    stages = account(log, rank=0, node="n", readers=1, prefetchers=1)["stages"]
    assert stages["prefetch"]["files_from_source"] == want_files
    assert stages["prefetch"]["bytes_from_source"] == want_bytes
    assert stages["prefetch"]["files_present"] == 2 * sum(present)


def test_per_minibatch_events_beyond_a_few_chunks_leave_memory_and_all_come_back():
    """A run of days records per-minibatch events without end: each thread keeps its latest few chunks in
    memory and writes older ones to a temporary file; every event comes back, in order, with its values,
    also in a forked child that goes on recording (and spilling) on its own."""
    import os
    import threading
    import tracemalloc

    from stager.telemetry.events import CHUNK, STEP_CHUNKS_KEPT

    per_thread = 10 * CHUNK + 77
    log = tm.Telemetry()
    start = threading.Barrier(2)

    def consume(k):
        start.wait()
        for i in range(per_thread):
            log.record(tm.CONSUMED, i, k, i / 1000)

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_event = 33  # bytes of the five columns
    assert held < 2 * (STEP_CHUNKS_KEPT + 2) * CHUNK * per_event, f"{held} bytes held for {2 * per_thread} events"
    assert len(log) == 2 * per_thread

    def check(events, count):
        for k in range(2):
            mine = [(a, v) for _, kind, a, b, v in events if b == k]
            assert mine == [(i, i / 1000) for i in range(count)], f"thread {k}'s events"

    check(log.events([tm.CONSUMED]), per_thread)
    t, kind, a, b, value = log.arrays()
    assert len(t) == 2 * per_thread and (t[1:] >= t[:-1]).all()

    pid = os.fork()
    if pid == 0:  # the child records more, spilling to a file of its own, and still reads its parent's
        code = 1
        try:
            for i in range(per_thread, per_thread + 3 * CHUNK):
                log.record(tm.CONSUMED, i, 0, i / 1000)
                log.record(tm.CONSUMED, i, 1, i / 1000)
            check(log.events([tm.CONSUMED]), per_thread + 3 * CHUNK)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child's log"
    check(log.events([tm.CONSUMED]), per_thread)  # the parent's is untouched
