"""``stager simulate`` at the scale users plan for: the tracked nodes stand for the others in time, each
epoch's order is drawn once, and a long simulation says how far it is."""

import io
import tracemalloc

import numpy as np
import pytest

from stager.config import PlanConfig, config_from_dict
from stager.plan import PlanSpec
from stager.plan.shuffles import ShardShuffle, algorithm
from stager.plan.shuffles.remembered import Remembered
from stager.simulate import Layout, load_profile, node_demand, simulate
from stager.simulate.progress import EVERY_S, FIRST_S, Progress


def _cfg(**staging):
    return config_from_dict({"dataset": {"source": "/nonexistent"},
                             "plan": {"batch_size": 8, "epochs": 3, "seed": 2},
                             "staging": {"prefetchers": 4, "lookahead": 4, **staging},
                             "reader": {"workers": 2}, "run": {"compute_ms": 5}})


def _brief(method):
    return ([e["source_files"] for e in method["epochs"]], [e["seconds"] for e in method["epochs"]], method["stall"])


@pytest.mark.parametrize("peers", ["off", "partition"])
def test_the_tracked_nodes_in_time_give_the_times_of_every_node_and_the_same_source_reads(peers):
    """32 nodes of 2 ranks, 4 tracked, on a file system whose metadata service is the limit (so the nodes'
    reads queue behind each other's): simulating only the 4 tracked nodes in time, each for 8, gives each
    epoch's source reads file for file and its time and stall within 2% of simulating all 32."""
    sizes = np.full(32 * 2 * 8 * 12, 80_000)
    share = len(sizes) // 32 * 80_000
    cfg = _cfg(peers=peers, capacity=str(share // 2 + 4 * 8 * 2 * 80_000))
    profile = load_profile(None, ["filesystem.mds_ops_per_s=3000", "filesystem.open_ms=2"])
    every = simulate(cfg, profile, Layout(32, 2, 4, every_node=True), sizes, methods=["stager", "direct"])
    some = simulate(cfg, profile, Layout(32, 2, 4), sizes, methods=["stager", "direct"])
    for method in ("stager", "direct"):
        files, seconds, stall = _brief(some["methods"][method])
        files_all, seconds_all, stall_all = _brief(every["methods"][method])
        assert files == files_all, method
        assert seconds == pytest.approx(seconds_all, rel=0.02), method
        assert stall == pytest.approx(stall_all, abs=0.02), method
        # Each read stands for 8 nodes' that would have ended one after the other: spread over that time,
        # the file system's peak rate is every node's too (at 1,024 nodes, lumps of 128 read 2.2% above
        # it, 6.9% for direct reading; here lumps of 8, 0.4%).
        assert some["methods"][method]["peak_opens_per_s"] == pytest.approx(
            every["methods"][method]["peak_opens_per_s"], rel=0.02), method
    # The metadata service was the limit: the first epoch took longer than its opens at its rate.
    opens = some["methods"]["direct"]["epochs"][0]["source_files"]
    assert some["methods"]["direct"]["epochs"][0]["seconds"] >= opens / 3000 * 0.95


def test_with_every_node_tracked_every_node_is_simulated_in_time():
    """Where every node is tracked, there is no one to stand for: the same figures either way."""
    sizes = np.full(8 * 2 * 8 * 6, 80_000)
    profile = load_profile(None, ["filesystem.mds_ops_per_s=3000"])
    cfg = _cfg(peers="partition", capacity="unbounded")
    a = simulate(cfg, profile, Layout(8, 2), sizes)["methods"]["stager"]
    b = simulate(cfg, profile, Layout(8, 2, every_node=True), sizes)["methods"]["stager"]
    assert _brief(a) == _brief(b)


def test_a_remembered_shuffle_is_the_shuffle_drawn_once_per_epoch():
    for base in (algorithm("pcg64"), ShardShuffle.of(np.repeat(np.arange(40), 25), 4)):
        kept = Remembered(base)
        for epoch in (0, 1, 0):
            positions = np.arange(1000)
            assert np.array_equal(kept.forward(1000, 3, epoch)(positions), base.forward(1000, 3, epoch)(positions))
            assert np.array_equal(kept.inverse(1000, 3, epoch)(positions), base.inverse(1000, 3, epoch)(positions))
        assert kept.forward(1000, 3, 1) is kept.forward(1000, 3, 1)  # drawn once, then kept
    # Beyond its bytes, the oldest epoch goes (8 bytes a sample: room for two epochs of 1,000).
    kept = Remembered(algorithm("pcg64"), budget=16_000)
    first = kept.forward(1000, 3, 0)
    kept.forward(1000, 3, 1)
    assert kept.forward(1000, 3, 0) is first
    kept.forward(1000, 3, 2)  # epoch 1 was used least recently
    assert kept.forward(1000, 3, 0) is first and kept.forward(1000, 3, 1) is not kept.forward(1000, 3, 2)
    # A shuffle that evaluates each position on its own is passed through: nothing to keep.
    assert Remembered(algorithm("feistel")).MATERIALISES is False


def test_a_remembered_shuffle_gives_the_plans_own_reads():
    """The simulator lists its tracked ranks' reads through a remembered shuffle: the same demand."""
    from dataclasses import replace

    spec = PlanSpec.from_config(4096, PlanConfig(batch_size=8, epochs=2, seed=9), 16)
    kept = replace(spec, shuffle_algorithm=Remembered(algorithm(spec.shuffle_algorithm)))
    sizes = np.full(4096, 1000)
    for peers in (False, True):
        a = node_demand(sizes, spec, 8, 2, 4, 200_000, "auto", 4, peers)
        b = node_demand(sizes, kept, 8, 2, 4, 200_000, "auto", 4, peers)
        for x, y in zip(a.tracked, b.tracked):
            assert all(np.array_equal(getattr(x, k), getattr(y, k)) for k in ("source_files", "peer_files",
                                                                             "local_files", "samples"))


def test_a_job_of_4096_nodes_of_8_ranks_simulates_in_memory_of_its_tracked_nodes():
    """4,096 nodes x 8 ranks over a million files, 8 nodes tracked: memory follows the tracked nodes and the
    catalog, not the job's 32,768 ranks; without peers and with room for every file, each node reads each
    of its files from the source once per epoch."""
    sizes = np.full(1_000_000, 110_000)
    cfg = config_from_dict({"dataset": {"source": "/nonexistent"}, "plan": {"batch_size": 32, "epochs": 3},
                            "staging": {"prefetchers": 12, "lookahead": 32, "capacity": "unbounded"},
                            "reader": {"workers": 4}})
    tracemalloc.start()
    try:
        result = simulate(cfg, load_profile(None), Layout(4096, 8, 8), sizes, methods=["stager", "direct"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 400e6, f"{peak / 1e6:.0f} MB"
    staged, direct = result["methods"]["stager"], result["methods"]["direct"]
    # The steps of an epoch cover the catalog once (the last one padded); a node that meets again a file
    # it read in an earlier epoch reads it locally (a few in a million at 244 files a node an epoch).
    assert staged["epochs"][0]["source_files"] == direct["epochs"][0]["source_files"] >= len(sizes)
    assert all(e["source_files"] <= direct["epochs"][0]["source_files"] for e in staged["epochs"][1:])
    assert staged["seconds"] > 0 and 0 <= staged["stall"] <= 1


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_says_how_far_and_how_long_is_left_only_on_long_runs():
    clock, out = _Clock(), io.StringIO()
    progress = Progress(out, clock)
    progress.start("stager")
    for done in range(0, 5):
        progress.update("replaying 8 of 4,096 nodes' caches", done, 40, "step")
        clock.now += 1.0
    assert out.getvalue() == ""  # under FIRST_S: nothing
    clock.now = FIRST_S + 1.0  # 10 steps in 6 s of the phase: 30 steps left take about 18 s
    progress.update("replaying 8 of 4,096 nodes' caches", 10, 40, "step")
    clock.now += EVERY_S / 2
    progress.update("replaying 8 of 4,096 nodes' caches", 11, 40, "step")  # too soon after the last line
    lines = out.getvalue().splitlines()
    assert lines == ["stager simulate: stager: replaying 8 of 4,096 nodes' caches: step 10 of 40 (25%), "
                     "about 18 s left"]
    progress.update("simulating 8 nodes in time", 1, 42, "step")  # a new phase starts its own clock
    clock.now += FIRST_S / 2
    progress.update("simulating 8 nodes in time", 2, 42, "step")
    assert len(out.getvalue().splitlines()) == 1
