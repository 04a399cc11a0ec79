"""Who holds each file for the job (``engine.peers.holders``), the job-wide optimum
(``simulate.optimum``) and the look-ahead by need (``cache.depth``): pure functions of the plan."""

import math

import numpy as np
import pytest

from stager.cache import AUTO_DEPTH, MAX_DEPTH, MIN_DEPTH, STAGED, Cache, depth_note, fitting_depth
from stager.config import PlanConfig, config_from_dict
from stager.engine.peers import NO_OWNER, FirstReaders, LatestReaders, job_holders
from stager.engine.peers.holders import HANDOFF_STEPS
from stager.engine.peers.swaps import keep_given, stage_given
from stager.errors import ConfigError
from stager.model.misses import NodeReplay
from stager.plan import PlanSpec, job_reads
from stager.simulate import node_demand
from stager.simulate.optimum import job_optimum


def reads(rows):
    """``LatestReaders`` arrays from ``(step, node, file)`` rows."""
    steps, nodes, files = (np.array(c, dtype=np.int64) for c in zip(*rows))
    return steps, nodes, files


# File 0: node 1 at step 0, node 2 at step 3, node 1 at step 5. File 1: nodes 0 and 2 at step 2 (a container).
ROWS = [(0, 1, 0), (2, 0, 1), (2, 2, 1), (3, 2, 0), (5, 1, 0)]


def test_the_last_node_to_read_a_file_holds_it_for_the_next():
    rule = LatestReaders(*reads(ROWS), me=2, count=2)
    assert rule.holder(np.array([0]), 0).tolist() == [NO_OWNER]  # nobody read it before: the source
    assert rule.holder(np.array([0]), 3).tolist() == [1]
    assert rule.holder(np.array([0]), 5).tolist() == [2]
    # At one step the lowest node reads it from the source; the others ask that one.
    assert rule.holder(np.array([1]), 2, node=2).tolist() == [0]
    assert rule.holder(np.array([1]), 2, node=0).tolist() == [NO_OWNER]


@pytest.mark.parametrize("owing, may_wait_at_its_step", [(2, False), (0, True)])
def test_a_node_short_of_room_waits_only_for_fetches_earlier_in_step_then_node_order(owing, may_wait_at_its_step):
    """File 0: node 1 at step 0, node ``owing`` at step 3, node 1 at step 5. Node 1, at step 6, keeps it until
    ``owing`` fetches it for step 3. A request of node 1 for step 3 may wait for that fetch only where ``owing``
    is numbered below it: two nodes at one step never wait for each other's fetches (4 nodes at their own pace
    dropped files the job read again in 2 runs of 40, each waiting on no fetch but one for its own step)."""
    rule = LatestReaders(*reads([(0, 1, 0), (3, owing, 0), (5, 1, 0)]), me=1, count=1)
    rule.advance(6)
    assert rule.owed(np.array([0])).tolist() == [3]
    assert rule.owed_before(np.array([0]), 4).tolist() == [True]
    assert rule.owed_before(np.array([0]), 3).tolist() == [may_wait_at_its_step]
    assert rule.owed_before(np.array([0]), 2).tolist() == [False]
    cache = Cache(np.ones(2, dtype=np.int64), "clairvoyant", capacity=1)
    cache.holders = rule
    cache.state[0], cache.staged_bytes = STAGED, 1
    victims = cache.room_for(1, owed_before=3)
    assert (victims is None and cache.waiting_for_peers) if may_wait_at_its_step else victims == [0]
    rule.served(0, 3)
    assert rule.owed_before(np.array([0]), 4).tolist() == [False]


def test_a_holder_keeps_a_file_until_the_next_reader_fetched_it():
    rule = LatestReaders(*reads(ROWS), me=2, count=2)
    rule.advance(3)
    assert rule.kept(np.array([0])).tolist() == [True]   # it read it last (step 3)
    assert rule.next_use(np.array([0])).tolist() == [2]  # node 1 reads it at step 5
    rule.advance(6)
    assert rule.kept(np.array([0])).tolist() == [True]   # node 1 read it at 5 but has not fetched it from here
    assert rule.next_use(np.array([0])).tolist() == [0]  # so it is the most urgent file to keep
    rule.served(0, 5)
    assert rule.kept(np.array([0])).tolist() == [False]
    assert math.isinf(rule.next_use(np.array([0]))[0])


def test_a_node_that_reads_a_file_again_keeps_it_for_a_node_behind_that_reads_it_in_between():
    """File 0: node 1 at step 0, node 2 at step 3, node 1 at step 5 (ROWS). Node 1 ahead of node 2 reads it
    at step 5 from its own copy: that copy stays, read or not, until node 2 has fetched it for step 3 (it
    went once node 1's ranks had read step 5, and node 2 read the source: 1 file in 2,048, in 1 run of 9)."""
    rule = LatestReaders(*reads(ROWS), me=1, count=2)
    rule.advance(6)
    assert rule.owed(np.array([0])).tolist() == [3]
    assert rule.next_use(np.array([0])).tolist() == [0]  # not "never again": node 2 still needs it
    cache = Cache(np.ones(2, dtype=np.int64), "clairvoyant", capacity=2)
    cache.holders = rule
    cache.state[0], cache.pins[0], cache.staged_bytes = STAGED, 1, 1
    assert cache.release(np.array([0])) == []  # node 1's ranks read it at step 5: it stays
    rule.served(0, 3)
    assert rule.owed(np.array([0])).tolist() == [-1]
    assert math.isinf(rule.next_use(np.array([0]))[0])


def test_a_node_short_of_room_waits_for_the_fetches_of_what_it_keeps_for_nodes_behind():
    """Node 1 ahead: it keeps file 0 for node 2's step 3. With room for one file and a new one to fetch for
    step 4, it waits for node 2's fetch (nothing to drop yet) rather than drop a file the job reads again;
    without the wait (or for a step where node 2's fetch may itself wait on this node), it drops it."""
    rule = LatestReaders(*reads(ROWS), me=1, count=3)
    rule.advance(4)
    cache = Cache(np.ones(3, dtype=np.int64), "clairvoyant", capacity=1)
    cache.holders = rule
    cache.state[0], cache.staged_bytes = STAGED, 1
    assert rule.kept(np.array([0])).tolist() == [True]
    assert cache.room_for(1, owed_before=4) is None and cache.waiting_for_peers
    assert cache.room_for(1, owed_before=3) == [0] and not cache.waiting_for_peers
    assert cache.room_for(1) == [0] and not cache.waiting_for_peers
    rule.served(0, 3)  # node 2 fetched it: a copy now, the first to go
    assert cache.room_for(1, owed_before=4) == [0] and not cache.waiting_for_peers


def test_a_holder_behind_the_node_it_handed_a_file_to_holds_it_no_more():
    """Node 1 read file 0 at step 0; node 2, which reads it at 3, fetched it from node 1 while node 1's own
    ranks were still at step 1. From then on node 2 holds it: node 1's copy is a copy, the first to go."""
    rule = LatestReaders(*reads(ROWS), me=1, count=2)
    rule.advance(1)
    assert rule.kept(np.array([0])).tolist() == [True]
    rule.served(0, 3)
    assert rule.kept(np.array([0])).tolist() == [False]
    rule.advance(6)
    assert rule.kept(np.array([0])).tolist() == [True]  # it read it again at 5: its own again


def test_a_node_given_a_file_holds_it_until_its_next_reader_fetched_it():
    """Node 0 never reads file 0; given it at step 3 (by the node that dropped it), it holds it for the job
    until node 1 fetched it for its read at 5, or, not asked, until ``HANDOFF_STEPS`` after that read."""
    rule = LatestReaders(*reads(ROWS), me=0, count=2)
    rule.advance(3)
    assert rule.kept(np.array([0])).tolist() == [False]
    rule.took(0)
    assert rule.kept(np.array([0])).tolist() == [True] and rule.next_use(np.array([0])).tolist() == [2]
    rule.served(0, 5)
    assert rule.kept(np.array([0])).tolist() == [False]
    rule.took(0)
    rule.advance(5 + HANDOFF_STEPS)
    assert rule.kept(np.array([0])).tolist() == [False]
    # The node that gave a file away notes where; fetching it again, it asks there (the node's fetch
    # notes the step before the files are routed), and from then on answers for it itself.
    rule.gave(1, 3)
    assert rule.moved[1] == 3
    rule.fetching(np.array([1]), 7)
    assert rule.reclaim(np.array([1])).tolist() == [3]
    assert rule.moved[1] == -1 and rule.reclaim(np.array([1])).tolist() == [-1]


def test_a_node_keeps_a_file_given_to_it_only_in_room_that_costs_no_file_it_holds_for_the_job():
    """``swaps.keep_given``: node 0 (capacity 4 files of one byte) holds files 0 and 1 for the job, has a copy
    of file 2, which node 1 read after it, and room for one more. Given files 5, 3 and 4 at once: file 5 is
    never read again (not kept), file 3 takes the free room and file 4 the copy's place. Then, full of files
    it holds for the job, a file read sooner than those (file 6) is not kept."""
    # Reads: files 0-2 by node 0 at step 0; file 2 by node 1 at 1; files 3-6 by node 1 at 0; node 1 reads
    # file 3 again at 4, file 4 at 2, file 6 at 3, file 0 at 6, file 1 at 8; file 5 never again.
    rows = [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 3), (0, 1, 4), (0, 1, 5), (0, 1, 6), (1, 1, 2), (2, 1, 4),
            (3, 1, 6), (4, 1, 3), (6, 1, 0), (8, 1, 1)]
    rule = LatestReaders(*reads(rows), me=0, count=7)
    cache = Cache(np.ones(7, dtype=np.int64), "clairvoyant", capacity=4)
    cache.holders = rule
    rule.advance(1)
    rule.served(2, 1)  # node 1 fetched file 2 from here for its step 1
    cache.state[[0, 1, 2]] = STAGED
    cache.staged_bytes = 3
    assert rule.kept(np.array([0, 1, 2])).tolist() == [True, True, False]
    kept, victims = keep_given(cache, [5, 3, 4])
    assert kept == {3, 4} and victims.tolist() == [2]
    assert keep_given(cache, [3])[1].tolist() == [], "one file fits the free room: no copy goes for it"
    cache.removed(2)
    for index in (3, 4):
        stage_given(cache, index)
    assert rule.kept(np.array([3, 4])).tolist() == [True, True] and cache.state[[3, 4]].tolist() == [STAGED] * 2
    # Full of files it holds for the job: file 6 (read at 3, sooner than files 0 and 1) finds no room.
    kept, victims = keep_given(cache, [6])
    assert kept == set() and not len(victims)


def test_swaps_bring_the_engines_replay_near_the_job_wide_optimum_at_a_few_hundred_files_a_node():
    """4 nodes of 256 files each (1x the dataset together), batch 16, look-ahead 2: without swaps (the
    default), a node that takes a file from its holder makes room before the holder's copy goes, and the
    replay reads 1.058 and 1.060 of the optimum (``benchmarks/studies/pooling_study.py``); with
    ``staging.peer_swaps``, giving the holder the file dropped, within 2.5%."""
    n, nodes = 1024, 4
    for seed in (7, 8):
        spec = PlanSpec.from_config(n, PlanConfig(batch_size=16, epochs=3, seed=seed), nodes)
        best = job_optimum(np.ones(n), spec, np.arange(nodes), [256] * nodes, 2)["files"]
        reads = {swaps: sum(int(d.source_files.sum()) for d in node_demand(
            np.ones(n), spec, nodes, 1, None, 256, "auto", 2, True, swaps=swaps).tracked) for swaps in (False, True)}
        assert best <= reads[True] <= 1.025 * best < 1.05 * best < reads[False], (seed, reads, best)


def test_a_holder_answers_pending_only_for_a_read_of_its_own_before_the_askers():
    rule = LatestReaders(*reads(ROWS), me=2, count=2)

    class Cache:
        state = np.zeros(2, dtype=np.uint8)
        pins = np.zeros(2, dtype=np.int32)

    rule.advance(1)
    assert rule.to_come(0, Cache, 5)          # its read at 3 lies ahead of its requests
    rule.advance(4)
    assert rule.to_come(0, Cache, 5)          # its request for 3 came, and has not pinned the file yet
    rule.asked(np.array([0]), 3)
    assert not rule.to_come(0, Cache, 5)      # asked at 3, not pinned nor being fetched: dropped
    Cache.pins[0] = 1
    assert rule.to_come(0, Cache, 5)          # asked for its step 3 and waiting for room
    rule.asked(np.array([0]), 7)
    assert not rule.to_come(0, Cache, 5)      # pinned for a later step, which could wait on the asker
    Cache.state[0] = 1                        # IN_FLIGHT
    rule.fetching(np.array([0]), 7)
    assert not rule.to_come(0, Cache, 5)      # being fetched for that later step
    rule.fetching(np.array([0]), 3)
    assert rule.to_come(0, Cache, 5)          # being fetched for its step 3, asked again for 7 meanwhile


def test_a_node_short_of_room_drops_its_copies_of_files_others_hold_before_any_it_holds_for_the_job():
    """Losing a copy of a file another node read last costs a transfer from that node; losing a file this
    node holds for the job costs a read of the source. So copies go first, even one this node reads
    again sooner than the files it holds."""
    spec = PlanSpec.from_config(24, PlanConfig(batch_size=2, epochs=3, seed=3), 2)
    steps, nodes, files, _ = job_reads(spec, np.array([0, 1]), None, 24)
    rule = LatestReaders(steps, nodes, files, 0, 24)
    cache = Cache(np.ones(24, dtype=np.int64), "clairvoyant", capacity=3)
    cache.holders = rule
    cache.add_plan(0, spec)
    found = None
    for now in range(int(steps.max())):  # node 0 at step `now`, node 1 has fetched from it all it read so far
        cache.advance(0, now)
        rule.served(files[(nodes == 1) & (steps <= now)], now)
        mine = np.unique(files[(nodes == 0) & (steps <= now)])
        kept, copies = mine[rule.kept(mine)], mine[~rule.kept(mine)]
        if len(kept) < 2 or not len(copies):
            continue
        copy = copies[np.argmin(cache.next_use(copies))]
        far = kept[np.argsort(-cache.next_use(kept), kind="stable")[:2]]
        if cache.next_use(np.array([copy]))[0] < cache.next_use(far).min():
            found = copy, far
            break
    assert found, "the plan gives no such moment"
    copy, far = found
    for index in (copy, *far):
        cache.state[index] = STAGED
    cache.staged_bytes = 3
    # Room for 2: the copy (read again sooner than either kept file), then the kept file read latest.
    assert sorted(cache.room_for(2)) == sorted([int(copy), int(far[0])])


def test_first_readers_remain_where_the_job_cannot_be_listed():
    spec = PlanSpec.from_config(40, PlanConfig(batch_size=5, epochs=0, seed=1), 2)
    rule = job_holders(spec, 40, np.array([0, 1]), 0)
    assert isinstance(rule, FirstReaders) and not rule.complete
    finite = PlanSpec.from_config(40, PlanConfig(batch_size=5, epochs=2, seed=1), 2)
    assert isinstance(job_holders(finite, 40, np.array([0, 1]), 0), LatestReaders)
    assert isinstance(job_holders(finite, 40, np.array([0, 1]), 0, budget=79), FirstReaders)


def test_job_reads_number_steps_as_the_ranks_coordinators_do():
    spec = PlanSpec.from_config(30, PlanConfig(batch_size=4, epochs=2, seed=3), 3)
    steps, nodes, files, epoch_of_step = job_reads(spec, [0, 1, 1])
    for rank in range(3):
        for seq, mb in enumerate(spec.minibatches(rank)):
            mine = (steps == seq) & (nodes == [0, 1, 1][rank])
            assert set(mb.indices.tolist()) <= set(files[mine].tolist())
            assert epoch_of_step[seq] == mb.epoch


@pytest.mark.parametrize("share", [0.15, 0.2, 0.25, 0.3])
def test_no_replay_of_the_engines_cache_reads_less_than_the_optimum(share):
    n, nodes = 320, 4
    sizes = np.full(n, 1000)
    spec = PlanSpec.from_config(n, PlanConfig(batch_size=8, epochs=3, seed=2), nodes)
    cap = int(share * sizes.sum())
    best = job_optimum(sizes, spec, np.arange(nodes), [cap] * nodes, 2)
    assert best["files"] == sum(best["per_epoch"]) and best["per_epoch"][0] == n
    steps, node, files, _ = job_reads(spec, np.arange(nodes))
    rule = LatestReaders(steps, node, files, 0, n)
    replays = [NodeReplay(sizes, spec, [k], cap, "clairvoyant", 2, None, rule.for_node(k)) for k in range(nodes)]
    fetched = 0
    for seq, step in enumerate(zip(*(spec.minibatches(k) for k in range(nodes)))):
        for k, mb in enumerate(step):
            fetched += len(replays[k].request(k, seq, mb.indices)[0])
    assert best["files"] <= fetched  # nodes' fetches include peers' copies: at least the source's reads


def test_the_optimum_reads_each_file_once_when_the_nodes_hold_the_dataset():
    n = 200
    sizes = np.full(n, 1000)
    spec = PlanSpec.from_config(n, PlanConfig(batch_size=5, epochs=3, seed=4), 4)
    assert job_optimum(sizes, spec, np.arange(4), [int(0.3 * sizes.sum())] * 4, 2)["files"] == n
    assert job_optimum(sizes, spec, np.arange(4), [None] * 4, 2)["files"] == n
    tight = job_optimum(sizes, spec, np.arange(4), [int(0.1 * sizes.sum())] * 4, 2)
    # Each later epoch must read at least what the nodes cannot hold: (1 - 0.4) of the dataset.
    assert all(e >= 0.6 * n for e in tight["per_epoch"][1:])


def test_auto_look_ahead_leaves_room_for_the_nodes_share():
    total, files = 100 * 1000, 100
    assert fitting_depth(None, total, files, 4, 1, 0.25) == (AUTO_DEPTH, 25_000)
    assert fitting_depth(10**9, total, files, 4, 1, 0.25)[0] == AUTO_DEPTH
    # 30,000 bytes: 25,000 kept, 5,000 left: one minibatch of 4 x 1,000 fits, the floor is 2.
    assert fitting_depth(30_000, total, files, 4, 1, 0.25) == (MIN_DEPTH, 25_000)
    assert fitting_depth(45_000, total, files, 4, 1, 0.25)[0] == 5
    level, text = depth_note(16, 5, 45_000, 25_000, 4000)
    assert level == "warning" and "staging.lookahead 16 pins up to 62.5 KiB" in text and "24.4 KiB" in text
    assert depth_note(4, 5, 45_000, 25_000, 4000) is None
    assert depth_note("auto", 5, 45_000, 25_000, 4000)[0] == "info"
    assert depth_note("auto", AUTO_DEPTH, None, 25_000, 4000) is None


def test_where_the_share_cannot_fit_auto_look_ahead_may_take_half_the_capacity():
    total, files = 100 * 1000, 100
    # 25,000 kept, 25,000 of room: it fits exactly, nothing left for the look-ahead but the floor.
    assert fitting_depth(25_000, total, files, 4, 1, 0.25) == (MIN_DEPTH, 25_000)
    # 24,000 of room cannot hold the 25,000: part is read again each epoch whatever the depth; half of it is
    # the look-ahead's, 12,000 bytes, three minibatches of 4,000, at start and while running alike.
    assert fitting_depth(24_000, total, files, 4, 1, 0.25) == (3, 25_000)
    assert fitting_depth(24_000, total, files, 4, 1, 0.25, MAX_DEPTH)[0] == 3
    level, text = depth_note("auto", 3, 24_000, 25_000, 4000)
    assert level == "info" and "at most half of staging.capacity 23.4 KiB" in text and "cannot fit" in text
    # A fixed 8 pins 32,000 bytes: 20,000 past the half auto leaves to the cache.
    level, text = depth_note(8, 3, 24_000, 25_000, 4000)
    assert level == "warning" and "leaving no room for 19.5 KiB of the 24.4 KiB" in text and "auto (3 here)" in text
    assert depth_note(3, 3, 24_000, 25_000, 4000) is None


def test_lookahead_is_auto_by_default_and_refuses_other_words():
    cfg = config_from_dict({"dataset": {"source": "/nonexistent"}})
    assert cfg.staging.lookahead == "auto"
    with pytest.raises(ConfigError, match="staging.lookahead must be a number of at least 1 or 'auto'"):
        config_from_dict({"dataset": {"source": "/nonexistent"}, "staging": {"lookahead": "deep"}})
