"""The node's cache: residency and pins, capacity, the policies, and the
policies run end to end through real pipelines on the FUSE source."""

import math
import os
import random
import time

import numpy as np
import pytest
from conftest import load_catalog, make_config, size_limited_tmpfs

from stager import plan
from stager.cache import (ABSENT, IN_FLIGHT, POLICIES, STAGED, Cache, check_window, make_policy, parse_capacity,
                          resolve_capacity)
from stager.engine import Pipeline
from stager.engine.node.readpins import ReadPins
from stager.errors import ConfigError, StageError
from stager.model import cache_misses


def test_a_request_pins_each_file_and_fetches_only_absent_ones():
    cache = Cache(np.array([10, 20, 30, 40]))
    missing, waiting = cache.pin(np.array([0, 2]))
    assert missing.tolist() == [0, 2] and waiting.tolist() == [0, 2]
    cache.fetching(missing)
    assert cache.state.tolist() == [IN_FLIGHT, ABSENT, IN_FLIGHT, ABSENT] and cache.in_flight_bytes == 40
    missing, waiting = cache.pin(np.array([2, 3]))
    assert missing.tolist() == [3] and waiting.tolist() == [2, 3]
    assert cache.pins.tolist() == [1, 0, 2, 1]
    cache.staged(2)
    assert cache.state[2] == STAGED and (cache.staged_bytes, cache.in_flight_bytes) == (30, 10)
    assert cache.release(np.array([0, 2])) == []  # unbounded keeps everything
    assert cache.pins.tolist() == [0, 0, 1, 1]


def test_room_is_made_from_unpinned_files_only_and_refused_when_they_do_not_suffice():
    cache = Cache(np.full(6, 10), "lru", capacity=40)
    for group in ([0, 1], [2, 3]):
        missing, _ = cache.pin(np.array(group))
        cache.fetching(missing)
        for i in group:
            cache.staged(i)
    cache.release(np.array([2, 3]))            # read later than 0, 1 are: 0 and 1 are pinned still
    assert cache.room_for(10) == [2]           # least recently read among the unpinned
    assert cache.room_for(30) is None          # only 20 bytes are unpinned
    cache.release(np.array([0, 1]))
    assert cache.room_for(30) == [2, 3, 0]


def test_capacity_forms_and_the_window_check():
    assert parse_capacity(None) is None and parse_capacity("500M") == ("bytes", 500 << 20)
    assert parse_capacity(2048) == ("bytes", 2048) and parse_capacity("80%") == ("share", 0.8)
    for bad in ("lots", "0%", "120%", "-5G"):
        with pytest.raises(ConfigError, match="staging.capacity"):
            parse_capacity(bad)
    assert 0 < resolve_capacity("50%", "/") <= os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    sizes = np.array([5, 100, 7, 100, 3])
    assert check_window(1200, sizes, batch_size=2, minibatches_ahead=3, ranks=2) == 2 * 3 * 200
    with pytest.raises(ConfigError, match=r"1000 B is smaller than the look-ahead window needs: 1.2 KiB .*2 rank.*"
                                          r"3 minibatches ahead x 200 B.*raise staging.capacity or lower "
                                          r"staging.lookahead"):
        check_window(1000, sizes, batch_size=2, minibatches_ahead=3, ranks=2)


def test_policies_are_chosen_by_name_and_unknown_ones_are_refused():
    assert {make_policy(name).name for name in POLICIES} == set(POLICIES)
    with pytest.raises(ConfigError, match="unknown policy 'belady'"):
        make_policy("belady")
    with pytest.raises(ConfigError, match=r"staging.cache_policy must be one of \[.auto., "):
        make_config("/data", "/local", staging={"cache_policy": "belady"})


def test_clairvoyant_evicts_the_file_read_farthest_ahead_across_epochs():
    spec = plan.PlanSpec(samples=6, batch_size=2, epochs=2, seed=4, shuffle=True, drop_last=False,
                         remainder="pad", size=1)
    batches = list(spec.minibatches(0))
    cache = Cache(np.full(6, 1), "clairvoyant", capacity=4)
    cache.add_plan(0, spec)
    cache.future.advance(0, 2)  # the rank is at its last minibatch of epoch 0
    for i in range(6):
        cache.state[i] = STAGED
    cache.staged_bytes = 6
    nxt = cache.future.next_use(np.arange(6))
    for i in range(6):
        seq = next(k for k, mb in enumerate(batches) if k > 2 and i in mb.indices)
        assert nxt[i] == seq - 2
    victims = cache.room_for(2)
    assert [int(nxt[v]) for v in victims] == sorted(nxt.astype(int).tolist(), reverse=True)[:len(victims)]
    assert cache.future.complete and math.isinf(cache.future.next_use(np.array([0]))[0]) is False


def belady_misses(requests, capacity_files):
    """Belady's rule, simulated from its definition: minibatch by minibatch, the
    files of the current one resident together; when room is needed, the
    resident file whose next request lies farthest ahead goes."""
    resident, misses = set(), []
    for k, files in enumerate(requests):
        files = set(files)
        missing = files - resident
        misses.append(len(missing))

        def next_request(f):
            return next((j for j in range(k + 1, len(requests)) if f in requests[j]), math.inf)

        while len(resident | missing) > capacity_files:
            victim = max(resident - files, key=lambda f: (next_request(f), f))
            resident.discard(victim)
        resident |= missing
    return misses


def usage(directory):
    """Bytes of every file under ``directory`` now, temporary copies included."""
    total = 0
    for d, _, files in os.walk(directory):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(d, f)) if not f.startswith((".lock", ".service")) else 0
            except FileNotFoundError:
                pass  # removed meanwhile by the cache
    return total


def run(cfg, catalog, root, loader=None):
    """Runs a pipeline; checks plan order and bytes; returns stats and the job directory's peak usage."""
    seen, peak = [], 0
    with Pipeline(cfg, catalog, loader=loader) as pipe:
        for batch in pipe:
            seen.append(batch.indices.tolist())
            for i, (data, _) in zip(batch.indices, batch.samples):
                with open(os.path.join(root, catalog.path(i)), "rb") as fh:
                    assert data == fh.read(), f"sample {catalog.path(i)} differs from the source"
            peak = max(peak, usage(pipe.local_dir))
        stats = pipe.stats
    assert seen == [m.indices.tolist() for m in plan.iterate(len(catalog), cfg.plan)]
    return stats, peak


def test_clairvoyant_misses_equal_belady_and_no_more_than_lru_and_fifo(slow_source, dataset, tmp_path):
    root, _ = dataset
    base = make_config(slow_source, tmp_path / "local", plan={"epochs": 3}, dataset={"loader": "raw"},
                       staging={"lookahead": 1}, reader={"workers": 1, "ahead": 1})
    catalog = load_catalog(base)
    size = int(catalog.sizes[0])
    assert (catalog.sizes == size).all()
    capacity = 40 * size
    misses = {}
    for policy in ("clairvoyant", "lru", "fifo"):
        cfg = base.replace(staging={"capacity": capacity, "cache_policy": policy})
        stats, peak = run(cfg, catalog, root)
        assert peak <= capacity, f"{policy}: the job directory held {peak} bytes, capacity {capacity}"
        misses[policy] = [e["misses"] for e in stats.cache_table()]
        assert [e["files_from_source"] for e in stats.cache_table()] == misses[policy]
        assert max(e["peak_bytes"] for e in stats.cache_table()) <= capacity
    requests = [m.indices.tolist() for m in plan.iterate(len(catalog), base.plan)]
    steps = plan.steps_per_epoch(len(catalog), 8, False)
    optimum = belady_misses(requests, 40)
    assert misses["clairvoyant"] == [sum(optimum[e * steps:(e + 1) * steps]) for e in range(3)]
    assert sum(misses["clairvoyant"]) <= min(sum(misses["lru"]), sum(misses["fifo"]))
    assert sum(misses["clairvoyant"]) < 3 * len(catalog), "the cache must save some reads"


class JitteredRead:
    """Reads a sample's bytes after a pause of 0 to 4 ms drawn per reader process: each run's readers
    finish, and release, their minibatches in an order and at a pace of their own."""

    def __init__(self, seed):
        self.seed = seed
        self.rng = None

    def __call__(self, path):
        if self.rng is None:
            self.rng = random.Random(f"{self.seed}-{os.getpid()}")
        time.sleep(self.rng.random() * 0.004)
        with open(path, "rb") as fh:
            return fh.read()


def test_a_bounded_cache_fetches_what_the_replay_says_whatever_the_readers_pace(slow_source, dataset, tmp_path):
    """Four minibatches asked ahead and two readers releasing them at their own pace, out of order at times:
    the source reads per epoch are the plan's replay (``model.cache_misses``) in every run."""
    root, _ = dataset
    base = make_config(slow_source, tmp_path / "local", plan={"epochs": 3}, dataset={"loader": "raw"},
                       staging={"lookahead": 4}, reader={"workers": 2, "ahead": 4})
    catalog = load_catalog(base)
    capacity = 40 * int(catalog.sizes.max())
    cfg = base.replace(staging={"capacity": capacity, "cache_policy": "clairvoyant"})
    spec = plan.PlanSpec.from_config(len(catalog), cfg.plan, 1)
    want = cache_misses(catalog.sizes, spec, capacity=capacity, policy="clairvoyant", ahead=4)
    assert sum(want) > len(catalog), "the capacity must make the cache fetch again"
    for seed in (None, 1, 2):
        stats, peak = run(cfg, catalog, root, None if seed is None else JitteredRead(seed))
        assert [e["files_from_source"] for e in stats.cache_table()] == want, f"pace {seed}"
        assert peak <= capacity


def test_read_minibatches_are_let_go_a_look_ahead_behind_or_oldest_first_when_room_is_needed():
    pins = ReadPins()
    pins.hello("a", 2)
    pins.hello("b", 2)
    for seq in range(3):
        assert pins.asking("a", seq) == []
        pins.pinned("a", seq, f"a{seq}")
    assert pins.asking("b", 0) == []
    pins.pinned("b", 0, "b0")
    assert pins.read("a", 1) == [] and pins.oldest_read() is None, "a1 is read, but a0 before it is not"
    assert pins.read("a", 0) == ["a0"], "a0 lies two behind a2, asked for already; a1 only one"
    assert pins.read("b", 0) == []
    assert pins.oldest_read() == "a1", "room needed: of the read heads, the one asked for first"
    assert pins.oldest_read() == "b0" and pins.oldest_read() is None
    assert pins.asking("a", 4) == [], "a2 is not read yet"
    pins.pinned("a", 4, "a4")
    assert pins.read("a", 2) == ["a2"]
    assert pins.leave("a") == ["a4"] and pins.leave("b") == [] and pins.read("a", 4) == []


def test_minio_keeps_what_fits_and_never_replaces_it(slow_source, dataset, tmp_path):
    root, _ = dataset
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 3}, dataset={"loader": "raw"},
                      staging={"lookahead": 1, "cache_policy": "minio"}, reader={"workers": 1, "ahead": 1})
    catalog = load_catalog(cfg)
    size = int(catalog.sizes[0])
    cfg = cfg.replace(staging={"capacity": 48 * size})
    stats, peak = run(cfg, catalog, root)
    table = stats.cache_table()
    retained = 48 - 8  # the capacity less the window (one minibatch of 8)
    assert peak <= 48 * size
    assert [e["misses"] for e in table] == [len(catalog), len(catalog) - retained, len(catalog) - retained]


def test_policy_none_stops_with_the_capacity_named(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", staging={"lookahead": 1, "cache_policy": "none"},
                      reader={"workers": 1, "ahead": 1})
    size = int(load_catalog(cfg).sizes[0])
    cfg = cfg.replace(staging={"capacity": 20 * size})
    with pytest.raises(StageError, match=r"staging.capacity .* is full .* staging.cache_policy is none") as info:
        with Pipeline(cfg) as pipe:
            list(pipe)
    assert info.value.cause == "CacheFull"


def test_a_capacity_below_the_window_fails_at_start_naming_both(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", staging={"lookahead": 4, "capacity": "10K"})
    with pytest.raises(ConfigError, match=r"staging.capacity 10.0 KiB is smaller than the look-ahead window "
                                          r"needs: .*1 rank\(s\) x 4 minibatches ahead"):
        with Pipeline(cfg) as pipe:
            list(pipe)
    assert os.listdir(tmp_path / "local") == []


class DropWhenRead:
    """A policy that keeps nothing: every file goes once no minibatch needs it."""

    name = "drop-when-read"
    released_calls = []

    def released(self, cache, indices):
        assert (cache.pins[indices] == 0).all(), "the policy was offered a pinned file"
        DropWhenRead.released_calls.append(indices.tolist())
        return indices.tolist()

    def victims(self, cache, nbytes):
        return []


@pytest.fixture
def drop_policy():
    POLICIES[DropWhenRead.name] = DropWhenRead
    DropWhenRead.released_calls.clear()
    yield DropWhenRead
    del POLICIES[DropWhenRead.name]


def test_released_files_reach_the_policy_and_removed_ones_are_fetched_again(slow_source, dataset, tmp_path,
                                                                            drop_policy):
    # One minibatch in flight at a time, so each is read, released and its
    # files removed before the next is asked for: every epoch fetches again.
    root, _ = dataset
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 2}, dataset={"loader": "raw"},
                      staging={"lookahead": 1, "cache_policy": drop_policy.name},
                      reader={"workers": 1, "ahead": 1})
    catalog = load_catalog(cfg)
    stats, _ = run(cfg, catalog, root)
    assert stats.files_staged == 2 * len(catalog), "a removed file must be fetched again when needed"
    released = sorted(i for call in drop_policy.released_calls for i in call)
    assert released == sorted(list(range(len(catalog))) * 2), "every file is released once per epoch"


def test_the_unbounded_policy_fetches_each_file_once_over_epochs(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 3}, staging={"lookahead": 1},
                      reader={"workers": 1, "ahead": 1})
    with Pipeline(cfg) as pipe:
        batches = sum(1 for _ in pipe)
        assert pipe.stats.files_staged == len(pipe.catalog) and batches == 3 * -(-len(pipe.catalog) // 8)


@pytest.fixture
def small_tmpfs(tmp_path):
    with size_limited_tmpfs(tmp_path / "nvme", "256k") as mnt:
        yield mnt


def test_a_disk_filled_from_outside_below_the_capacity_makes_the_cache_evict_and_go_on(
        slow_source, dataset, tmp_path, small_tmpfs):
    root, _ = dataset
    cfg = make_config(slow_source, small_tmpfs, plan={"epochs": 2}, dataset={"loader": "raw"},
                      staging={"lookahead": 1, "capacity": "100M", "cache_policy": "lru", "prefetchers": 2},
                      reader={"workers": 1, "ahead": 1})
    catalog = load_catalog(cfg)
    filler = small_tmpfs / "another-job.bin"
    seen = []
    with Pipeline(cfg, catalog) as pipe:
        for batch in pipe:
            if not seen:
                # Another job takes the disk but 64 KiB: about two minibatches' room.
                st = os.statvfs(small_tmpfs)
                filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 64 * 1024))
            seen.append(batch.indices.tolist())
            for i, (data, _) in zip(batch.indices, batch.samples):
                with open(os.path.join(root, catalog.path(i)), "rb") as fh:
                    assert data == fh.read()
        table = pipe.stats.cache_table()
        local = pipe.local_dir
    assert seen == [m.indices.tolist() for m in plan.iterate(len(catalog), cfg.plan)]
    assert sum(e["evictions"] for e in table) > 0, "a full disk must make the cache evict"
    assert not os.path.exists(local)
    filler.unlink()


def test_a_full_disk_with_nothing_to_evict_names_the_directory_and_the_bytes(slow_source, tmp_path, small_tmpfs):
    cfg = make_config(slow_source, small_tmpfs, staging={"lookahead": 1, "capacity": "100M", "cache_policy": "lru",
                                                         "keep": True, "job_id": "full"},
                      reader={"workers": 1, "ahead": 1})
    st = os.statvfs(small_tmpfs)
    (small_tmpfs / "another-job.bin").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 8 * 1024))
    with pytest.raises(StageError, match=r"No space left on device: the local file system under .*stager-full "
                                         r"has no room for .*can evict nothing more") as info:
        with Pipeline(cfg) as pipe:
            list(pipe)
    assert info.value.stage == "prefetch" and info.value.path is not None
    leftovers = [f for _, _, fs in os.walk(small_tmpfs / "stager-full") for f in fs if f.endswith(".part")]
    assert leftovers == [], "nothing partial may stay behind"
