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
