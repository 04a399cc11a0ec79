"""The model (pure functions), its calibration on the real emulator, ``stager whatif`` and ``auto`` in the config."""

import json
import subprocess

import numpy as np
import pytest
from conftest import load_catalog, make_config, stager_cmd

from stager import plan
from stager.config import PlanConfig, load_config
from stager.engine.node.deadlines import DeadlineQueue
from stager.errors import ConfigError
from stager.model import (Rates, Settings, Tuner, cache_misses, choose_counts, from_summary, predict, predict_run,
                          probe, step_misses)
from stager.slowfs import SlowFS
from stager.sources import PosixSource

RATES = Rates(open_s=0.010, bandwidth=50e6, copy_s=0.001, read_s=0.0005, compute_s=0.020, file_bytes=100e3,
              batch_size=32, cores=2)


def test_fetch_bound_throughput_follows_littles_law_until_the_bandwidth():
    one = predict(RATES, Settings(prefetchers=1, readers=2))
    # 10 ms open + 2 ms of bytes at 50 MB/s + 1 ms copy: 13 ms a file, 32 files a step.
    assert one.bottleneck == "fetch" and one.step_s == pytest.approx(32 * 0.013)
    assert predict(RATES, Settings(prefetchers=4, readers=2)).samples_per_s == pytest.approx(4 * one.samples_per_s)
    # 500 files/s is all 50 MB/s carries: more prefetchers add nothing.
    assert predict(RATES, Settings(prefetchers=64, readers=2)).fetch_rate == pytest.approx(500)


def test_the_slowest_stage_sets_the_step_and_the_stall():
    fast_source = Settings(prefetchers=64, readers=2, open_s=0.0, bandwidth=0.0, compute_s=0.040)
    assert predict(RATES, fast_source).bottleneck == "compute" and predict(RATES, fast_source).stall == 0.0
    slow_reader = Rates(**{**RATES.to_dict(), "read_s": 0.004})
    p = predict(slow_reader, Settings(prefetchers=64, readers=1, open_s=0.0, bandwidth=0.0))
    assert p.bottleneck == "read" and p.step_s == pytest.approx(32 * 0.004)
    assert p.stall == pytest.approx(1 - 0.020 / (32 * 0.004))
    # Warm cache: nothing is fetched, whatever the source.
    assert predict(RATES, Settings(prefetchers=1, readers=2, miss=0.0)).bottleneck == "compute"


def test_cache_misses_replay_the_plan():
    sizes = np.full(400, 1000)
    spec = plan.PlanSpec.from_config(400, PlanConfig(batch_size=10, epochs=3, seed=2), 1)
    assert cache_misses(sizes, spec, ahead=4) == [400, 0, 0]
    assert cache_misses(sizes, spec, capacity=400_000, ahead=4) == [400, 0, 0]
    half = cache_misses(sizes, spec, capacity=200_000, ahead=4)
    assert half[0] == 400 and 0 < half[1] < 400 and 0 < half[2] < 400
    small = cache_misses(sizes, spec, capacity=100_000, ahead=4)
    assert small[1] > half[1]
    with pytest.raises(ConfigError, match="smaller than the look-ahead window"):
        cache_misses(sizes, spec, capacity=10_000, ahead=4)


def test_a_bounded_clairvoyant_cache_misses_the_next_epochs_end():
    sizes = np.full(400, 1000)
    spec = plan.PlanSpec.from_config(400, PlanConfig(batch_size=10, epochs=2, seed=2), 1)
    first, second = step_misses(sizes, spec, capacity=200_000, ahead=4)
    assert [int(first.sum()), int(second.sum())] == cache_misses(sizes, spec, capacity=200_000, ahead=4)
    assert len(second) == 40 and first.tolist() == [10] * 40
    # It kept the files the second epoch reads first: its first quarter hits, its last misses nearly all.
    assert second[:10].sum() == 0 and second[-10:].sum() >= 80


def test_a_run_with_bunched_misses_is_slower_than_its_mean_miss_says():
    settings = Settings(prefetchers=4, readers=2)
    fetch_s = 32 * 0.013 / 4      # 32 files a step, 13 ms each, 4 prefetchers: 104 ms a step
    cold = predict(RATES, settings)
    rate, _, seconds = predict_run(RATES, settings, [[32] * 100], ahead=4)
    assert cold.step_s == pytest.approx(fetch_s) and rate == pytest.approx(cold.samples_per_s, rel=0.01)
    # The same 1,600 misses: spread evenly, or all in the second half (a clairvoyant cache's next epoch).
    _, _, even = predict_run(RATES, settings, [[16] * 100], ahead=4)
    _, _, bunched = predict_run(RATES, settings, [[0] * 50 + [32] * 50], ahead=4)
    assert even == pytest.approx(99 * fetch_s / 2 + 0.020, rel=0.01)
    # The first half waits on the compute (20 ms), the second on the prefetchers, who
    # could start on it only 4 minibatches early.
    assert 50 * 0.020 + 46 * fetch_s <= bunched <= 50 * 0.020 + 50 * fetch_s
    assert bunched > 1.15 * even


def test_choose_counts_grow_with_latency_within_the_start_bound():
    few, readers = choose_counts(RATES)
    assert 1 <= readers <= 2 and 1 <= few <= 64
    slow = Rates(**{**RATES.to_dict(), "open_s": 0.001, "bandwidth": 0.0, "copy_s": 0.0005, "main_s": 0.0005})
    slower = Rates(**{**slow.to_dict(), "open_s": 0.004})
    assert choose_counts(slow)[0] < choose_counts(slower)[0]


# A probe of 64 KiB files on 2 cores: 2 ms of CPU a file (0.1 of it decoding), 4 ms of wall time
# beyond the open when eight threads share the cores.
PROBED = Rates(open_s=0.030, bandwidth=0.0, copy_s=0.004, read_s=0.0001, file_bytes=65536, batch_size=16, cores=2,
               cpu_s=0.002)


def test_prefetchers_start_where_the_cores_would_set_the_pace():
    # The cores allow 2 / 2 ms = 1,000 files/s; a prefetcher keeps a file 30 ms + 1.9 ms of its own.
    assert choose_counts(PROBED) == (32, 1)
    assert choose_counts(Rates(**{**PROBED.to_dict(), "open_s": 0.010}))[0] == 12
    # The probe's copy time is a wall time among threads sharing the cores: it does not move the count.
    assert choose_counts(Rates(**{**PROBED.to_dict(), "copy_s": 0.012}))[0] == 32
    # Twice the CPU a file: half the files a second, each 33.9 ms in a prefetcher.
    assert choose_counts(Rates(**{**PROBED.to_dict(), "cpu_s": 0.004}))[0] == 17


def _window(tuner, start, items, rate, per_item_s, waiting=0, cores_busy=None):
    """One second of ``tuner`` from ``start``: ``items`` asked (plus ``waiting`` more), done at ``rate``."""
    tuner.asked(items + waiting, start)
    done = int(rate * 1.0)
    tuner.finished(done, done * per_item_s)
    return tuner.decide(start + 1.0, cores_busy)


def test_tuner_skips_the_pools_start():
    t = Tuner(4, 1, 64, window_s=1.0, min_items=1)
    # The look-ahead asked at once, the first items' whole latency: no decision on that.
    assert _window(t, 0.0, 400, 20, 0.2, waiting=300) is None and t.count == 4
    assert _window(t, 1.0, 100, 100, 0.039, waiting=300).count == 5


def test_tuner_grows_when_saturated_and_shrinks_after_quiet_windows():
    t = Tuner(4, 1, 32, window_s=1.0, min_items=1)
    _window(t, -1.0, 100, 100, 0.039)  # the pool's start
    t.asked(400, 0.0)
    t.finished(100, 3.9)          # 4 workers busy all second, 300 items waiting
    assert t.decide(0.5) is None  # the window is not over
    d = t.decide(1.0)
    assert d.count == 5 and d.busy > 0.85
    count = d.count
    for second in range(2, 8):    # then little demand: shrink, but a quarter at a time
        t.asked(2, second - 0.5)
        t.finished(t.outstanding, 0.02)
        t.decide(float(second))
        assert t.count >= count // 2
        count = t.count
    assert count < d.count


def test_deadline_queue_serves_the_earliest_minibatch_of_any_rank_first():
    put = []
    q = DeadlineQueue(put.append)
    for seq in range(6):          # rank A asked six minibatches ahead first
        q.push(seq, ("A", seq), ("A", seq))
    q.feed(1)                     # one prefetcher: two tasks on its queue
    for seq in range(3):          # then rank B's first three
        q.push(seq, ("B", seq), ("B", seq))
    for task in list(put):
        q.done(task)
        q.feed(1)
    while len(q):
        q.done(put[-1])
        q.done(put[-2])
        q.feed(1)
    assert put[:2] == [("A", 0), ("A", 1)]
    assert put[2:6] == [("B", 0), ("B", 1), ("A", 2), ("B", 2)]


def test_arrival_hands_tasks_out_in_the_order_they_came():
    put = []
    q = DeadlineQueue(put.append, by_deadline=False)
    for seq in range(4):
        q.push(seq, ("A", seq), ("A", seq))
    for seq in range(2):
        q.push(seq, ("B", seq), ("B", seq))
    while len(q):
        q.feed(1)
        for task in list(put):
            q.done(task)
    assert put == [("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 0), ("B", 1)]


def test_probe_measures_the_emulators_latency(dataset, tmp_path):
    root, _ = dataset
    with SlowFS(root, open_ms=15.0, mbps=0) as mnt:
        cfg = make_config(mnt, tmp_path)
        catalog = load_catalog(cfg)
        rates = probe(PosixSource(mnt), catalog, "npy", files=4, batch_size=8)
    assert rates.open_s >= 0.0135 and rates.read_s > 0 and rates.batch_size == 8
    rates = Rates(**{**rates.to_dict(), "bandwidth": 0.0})  # the bytes' time apart, the rest is the copy's
    refined = from_summary({"files_staged": 100, "prefetch_busy_s": 100 * (rates.open_s + 0.002), "samples": 100,
                            "read_busy_s": 0.1, "batches": 10, "compute_s": 0.5,
                            "config": {"plan": {"batch_size": 10}}}, rates)
    assert refined.copy_s == pytest.approx(0.002, abs=1e-6) and refined.read_s == pytest.approx(0.001)
    assert refined.compute_s == pytest.approx(0.05) and refined.batch_size == 10


def test_whatif_prints_a_table_from_a_saved_calibration(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(RATES.to_dict()))
    out = subprocess.run(stager_cmd("whatif", "--calibration", str(cal), "--prefetchers", "1,64", "--open-ms", "10"),
                         capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 1 ") or line.startswith("| 64 ")]
    assert len(rows) == 2 and "fetch" in rows[0] and "| 500 |" in rows[1]


def test_whatif_prints_the_count_auto_settles_at_for_each_latency(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(RATES.to_dict()))
    out = subprocess.run(stager_cmd("whatif", "--calibration", str(cal), "--prefetchers", "auto,4", "--open-ms",
                                    "2,30"), capture_output=True, text=True, check=True).stdout
    counts = [int(line.split("auto (")[1].split(")")[0]) for line in out.splitlines() if "| auto (" in line]
    assert len(counts) == 2 and counts[1] > counts[0]  # a slower source: more prefetchers
    assert counts == [choose_counts(Rates(**{**RATES.to_dict(), "open_s": ms / 1000}))[0] for ms in (2, 30)]
    bad = subprocess.run(stager_cmd("whatif", "--calibration", str(cal), "--prefetchers", "auto,many"),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "expected numbers separated by commas" in bad.stderr


@pytest.mark.parametrize("args,message", [
    (["--capacity", "50%"], "--capacity needs --config"),
    ([], "give a CONFIG"),
])
def test_whatif_refuses_bad_input_clearly(tmp_path, args, message):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(RATES.to_dict()))
    full = args + (["--calibration", str(cal)] if args else [])
    proc = subprocess.run(stager_cmd("whatif", *full), capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_whatif_refuses_a_file_that_is_not_a_calibration(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"open_s": 1, "colour": "red"}))
    proc = subprocess.run(stager_cmd("whatif", "--calibration", str(bad)), capture_output=True, text=True)
    assert proc.returncode == 2 and f"{bad} is not a stager calibration" in proc.stderr


def test_whatif_probes_a_config_and_predicts_capacities(dataset, tmp_path):
    root, _ = dataset
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"dataset: {{source: {root}, manifest: manifest.tsv}}\nplan: {{batch_size: 5, epochs: 2}}\n"
                   f"staging: {{lookahead: 2}}\nslowfs: {{enabled: true, open_ms: 5}}\nrun: {{compute_ms: 10}}\n")
    out = subprocess.run(stager_cmd("whatif", str(cfg), "--prefetchers", "2", "--capacity", "50%,100%",
                                    "--save", str(tmp_path / "cal.json")),
                         capture_output=True, text=True, check=True).stdout
    assert "| 50% |" in out and "| 100% |" in out and "cores" in out
    assert json.loads((tmp_path / "cal.json").read_text())["open_s"] >= 0.0045


def test_auto_counts_in_the_config():
    cfg = load_config(None, ["staging.prefetchers=auto", "reader.workers=auto"])
    assert cfg.staging.prefetchers == "auto" and cfg.reader.workers == "auto"
    assert load_config(None, ["staging.prefetchers=6"]).staging.prefetchers == 6
    for bad, message in (("staging.prefetchers=many", "staging.prefetchers must be a number of at least 1 or 'auto'"),
                         ("reader.workers=0", "reader.workers must be a number of at least 1 or 'auto'")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [bad])


def test_tuner_goes_back_when_a_growth_does_not_pay():
    t = Tuner(4, 1, 64, window_s=1.0, min_items=1)
    _window(t, 0.0, 100, 100, 0.039)                                   # the pool's start
    assert _window(t, 1.0, 100, 100, 0.039, waiting=50).count == 5     # saturated at 100 items/s
    # A quarter more workers promised 125 items/s and got 102: they wait for the CPU.
    assert _window(t, 2.0, 100, 102, 0.049, waiting=50).count == 4
    # Saturated again, each item as long as before: stays at the ceiling.
    assert _window(t, 3.0, 100, 100, 0.039, waiting=50).count == 4
    # Each item now takes 4x longer (the source slowed): grows again.
    assert _window(t, 4.0, 100, 25, 0.156, waiting=50).count > 4


def test_a_growth_that_pays_half_lands_where_littles_law_puts_the_cores_pace():
    t = Tuner(16, 1, 64, window_s=1.0, min_items=1)
    _window(t, 0.0, 900, 900, 0.0178)
    assert _window(t, 1.0, 900, 900, 0.0178, waiting=200).count == 20
    # 20 workers promised 1,125 items/s and got 950: the cores' pace. At the 16
    # workers' 17.8 ms an item, 950 items/s take 17 workers; no more while that holds.
    assert _window(t, 2.0, 950, 950, 0.021, waiting=200).count == 17
    assert _window(t, 3.0, 950, 950, 0.018, waiting=200).count == 17


def test_a_growth_that_pays_is_kept_and_the_pool_grows_on():
    t = Tuner(4, 1, 64, window_s=1.0, min_items=1)
    _window(t, 0.0, 100, 100, 0.039)
    assert _window(t, 1.0, 100, 100, 0.039, waiting=50).count == 5
    assert _window(t, 2.0, 125, 125, 0.039, waiting=50).count == 7


def test_a_saturated_pool_grows_to_fill_the_cores_and_no_further():
    def saturated(cores_busy):
        t = Tuner(10, 1, 64, window_s=1.0, min_items=1)
        _window(t, 0.0, 250, 250, 0.039)
        t.asked(300, 1.0)
        t.finished(250, 250 * 0.039)   # 10 workers busy all second, work waiting
        return t.decide(2.0, cores_busy).count
    # The cores were 64% busy: they allow 1.4 times the items/s (to 90% busy), and as many more workers.
    assert saturated(0.64) == 15
    assert saturated(0.5) == 18        # 1.8 times the items/s
    assert saturated(0.3) == 30        # cores mostly idle: up to eight times, here their fill
    assert saturated(0.95) == 10       # the cores hold the items back, not the pool
    assert saturated(0.85) == 11       # room for a few more


def test_small_growths_are_judged_together_against_the_size_before_them():
    t = Tuner(40, 1, 64, window_s=1.0, min_items=1)
    _window(t, 0.0, 1000, 1000, 0.040)
    # The cores 80% busy, then 85%: room for a few more each time, too few to judge alone.
    assert _window(t, 1.0, 1000, 1000, 0.040, waiting=200, cores_busy=0.8).count == 45
    assert _window(t, 2.0, 1000, 1010, 0.044, waiting=200, cores_busy=0.85).count == 48
    assert _window(t, 3.0, 1000, 1020, 0.047, waiting=200, cores_busy=0.85).count == 51
    # 51 workers are a quarter more than 40: they promised 1,275 items/s and gave 1,020.
    # Little's law at that pace and the 40 workers' 40 ms an item: 41 workers, no more.
    assert _window(t, 4.0, 1000, 1020, 0.050, waiting=200, cores_busy=0.85).count == 41
    assert _window(t, 5.0, 1000, 1000, 0.041, waiting=200, cores_busy=0.8).count == 41


def _saturated_window(t, start, per_item_s, cpu_per_item_s, cores_busy, done=100):
    """One second of ``t``'s workers all busy with work waiting, each item ``cpu_per_item_s`` on a core."""
    t.asked(done + 5 * t.count, start)
    t.finished(done, done * per_item_s, done * cpu_per_item_s)
    return t.decide(start + 1.0, cores_busy)


def test_workers_waiting_on_a_slow_source_grow_whatever_else_keeps_the_cores_busy():
    # 4 prefetchers at 40 ms a file, 1 ms of it on a core; the readers keep 2 cores 60% busy.
    t = Tuner(4, 1, 64, window_s=1.0, min_items=1, cores=2)
    _window(t, 0.0, 100, 100, 0.04)
    # The four took 0.1 s of CPU in the second, 1.25% of the two cores each: the 30% left hold 24 more.
    assert _saturated_window(t, 1.0, 0.04, 0.001, 0.6).count == 29
    # The same pool whose items are on a core 80% of their time: every item costs the cores
    # alike, and at 60% busy they allow 1.5 times the items/s.
    t = Tuner(4, 1, 64, window_s=1.0, min_items=1, cores=2)
    _window(t, 0.0, 100, 100, 0.04)
    assert _saturated_window(t, 1.0, 0.04, 0.032, 0.6).count == 6
    # Cores full: waiting workers still double, judged by the next windows; working ones do not grow.
    t = Tuner(8, 1, 64, window_s=1.0, min_items=1, cores=2)
    _window(t, 0.0, 100, 100, 0.04)
    assert _saturated_window(t, 1.0, 0.04, 0.001, 0.95, done=200).count == 16
    t = Tuner(8, 1, 64, window_s=1.0, min_items=1, cores=2)
    _window(t, 0.0, 100, 100, 0.04)
    assert _saturated_window(t, 1.0, 0.04, 0.035, 0.95, done=200).count == 8


def test_the_source_limit_follows_the_time_per_item():
    # The source allows one worker per 5 ms of an item: 8 at 40 ms, 2 at 10 ms.
    t = Tuner(4, 1, 64, window_s=1.0, min_items=1, cores=2, limit=lambda per_item: round(per_item / 0.005))
    _window(t, 0.0, 100, 100, 0.04)
    assert _saturated_window(t, 1.0, 0.04, 0.001, 0.1).count == 8
    # A growth that did not pay while the cores idled is not a ceiling: the source's limit already is one.
    assert _saturated_window(t, 2.0, 0.04, 0.001, 0.1, done=100).count == 8
    # The source slowed 5x: the limit follows the time per item (smoothed over two windows).
    assert _saturated_window(t, 3.0, 0.2, 0.001, 0.1, done=40).count == 24
    assert _saturated_window(t, 4.0, 0.2, 0.001, 0.1, done=120).count == 32


def test_an_idle_pool_is_judged_and_shrinks():
    t = Tuner(16, 1, 64, window_s=0.25, min_items=8)
    _window(t, 0.0, 100, 100, 0.04)            # the pool's start
    t.asked(50, 1.0)
    t.finished(50, 2.0)
    t.decide(1.3)
    sizes = []
    for k in range(1, 9):                       # then nothing asked, nothing to do
        now = 1.3 + k * 1.5
        assert t.due(now)
        t.decide(now)
        sizes.append(t.count)
    assert sizes[-1] < 16 and sizes == sorted(sizes, reverse=True) and min(sizes) >= 1
