"""``stager simulate``: source reads equal a real run's, sanity of the model, scale, profiles and the command."""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import make_job_data, stager_cmd
from stager.cache import window_bytes
from stager.catalog import load_catalog
from stager.config import PlanConfig, config_from_dict, load_config
from stager.errors import ConfigError
from stager.simulate import Layout, load_profile, node_demand, profile_from_dict, simulate
from stager.plan import PlanSpec
from stager.simulate.optimum import job_optimum
from test_mpi_run import MPIEXEC, assert_nothing_left, mpirun

SAMPLES, EPOCHS, BATCH, AHEAD = 300, 3, 6, 4
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _job(tmp_path):
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv}}
synthetic: {{samples: {SAMPLES}, bytes: 3000}}
slowfs: {{enabled: true, open_ms: 1}}
plan: {{batch_size: {BATCH}, epochs: {EPOCHS}, seed: 5}}
staging: {{local_dir: local, lookahead: {AHEAD}, prefetchers: 3}}
reader: {{workers: 1, ahead: 2}}
run: {{state_file: state.json}}
""")
    return make_job_data(tmp_path / "job.yaml")


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")
@pytest.mark.parametrize("peers,share", [("off", 0.5), ("partition", 1.2)])
def test_source_reads_equal_a_real_two_node_run(tmp_path, peers, share):
    """A real 2-node ``stager run`` reads from the source exactly what the simulator predicts.

    One rank a node: with several, the order in which their requests reach
    the node's service is timing, and a bounded cache's misses follow it
    (by a few files in a hundred). The ranks agree on their position every
    step (``run.state_file``), as training's all-reduce keeps them in step:
    a node far ahead holds files for the others longer than the replay does.
    """
    job = _job(tmp_path)
    cfg = load_config(job)
    catalog = load_catalog(cfg.dataset)
    window = window_bytes(catalog.sizes, BATCH, AHEAD, 1)
    # Below the node's share (off) the clairvoyant cache drops and fetches again; above it, with room for
    # the window (peers), every owner keeps what it owns (whose bytes may exceed half the dataset's a
    # little), so whatever another node asks of it is there, whenever it asks.
    capacity = int(share * int(catalog.sizes.sum()) / 2) + window
    sets = [f"staging.capacity={capacity}", f"staging.peers={peers}", "staging.cache_policy=clairvoyant"]
    report_path = tmp_path / "r.json"
    args = ["run", job, "--quiet", "--report", str(report_path)] + [a for s in sets for a in ("--set", s)]
    proc = mpirun([("a", 1), ("b", 1)], args, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    real = json.loads(report_path.read_text())["cache"]
    sim = simulate(load_config(job, sets), load_profile(), Layout(2, 1), catalog.sizes)["methods"]["stager"]
    assert [e["source_files"] for e in sim["epochs"]] == [e["files_from_source"] for e in real]
    assert [e["source_bytes"] for e in sim["epochs"]] == [e["bytes_from_source"] for e in real]
    assert [e["peer_files"] for e in sim["epochs"]] == [e["files_from_peers"] for e in real]
    if peers == "off":
        assert sum(e["files_from_source"] for e in real) > SAMPLES, "the capacity must make the cache fetch again"
    else:
        assert sum(e["files_from_source"] for e in real) == SAMPLES and sum(e["files_from_peers"] for e in real)
    assert_nothing_left(tmp_path, str(tmp_path))


def _cfg(**staging):
    return config_from_dict({"dataset": {"source": "/nonexistent"},
                             "plan": {"batch_size": 8, "epochs": 3, "seed": 2},
                             "staging": {"prefetchers": 4, "lookahead": 4, **staging},
                             "reader": {"workers": 2}, "run": {"compute_ms": 5}})


def test_more_nodes_never_read_more_from_the_source_per_node():
    sizes = np.full(4096, 50_000)
    profile = profile_from_dict({"filesystem": {"open_ms": 5}})
    for peers in ("off", "partition"):
        per_node = [simulate(_cfg(peers=peers, capacity="unbounded"), profile, Layout(n, 2), sizes)
                    ["methods"]["stager"]["source_files_per_node"] for n in (1, 2, 4, 8, 16)]
        assert all(b <= a for a, b in zip(per_node, per_node[1:])), (peers, per_node)
        assert per_node[-1] < per_node[0]


def test_a_slower_file_system_never_shortens_an_epoch():
    sizes = np.full(2048, 100_000)
    cfg = _cfg(peers="partition", capacity=str(60 * 100_000 + window_bytes(sizes, 8, 4, 2)))
    slower = [("filesystem.open_ms", (0.5, 2, 8, 30)), ("filesystem.mds_ops_per_s", (0, 20000, 2000, 300)),
              ("filesystem.aggregate_mbps", (0, 5000, 500, 50)), ("filesystem.other_load", (0, 0.3, 0.6, 0.9))]
    limited = ["filesystem.mds_ops_per_s=3000", "filesystem.aggregate_mbps=300"]  # what other jobs' load takes
    for key, values in slower:
        base = limited if key == "filesystem.other_load" else []
        epochs = [[e["seconds"] for e in simulate(cfg, load_profile(None, base + [f"{key}={v}"]), Layout(8, 2, 4),
                                                  sizes)["methods"]["stager"]["epochs"]] for v in values]
        for faster, slow in zip(epochs, epochs[1:]):
            # A rate limit reorders the queue of opens: an epoch may end a few tenths of a millisecond sooner.
            assert all(s >= f * (1 - 1e-3) for f, s in zip(faster, slow)), (key, epochs)
        assert sum(epochs[-1]) > sum(epochs[0]), key


def test_a_64_node_job_with_peers_reads_each_file_once_and_beats_reading_directly():
    """What a simulation of 256 ranks gives; what it costs at scale is measured by benchmarks/simulator/."""
    sizes = np.full(64 * 4 * 32 * 12, 110_000)  # 12 steps an epoch on 256 ranks
    result = simulate(_cfg(peers="partition", capacity="unbounded"),
                      load_profile(None, ["filesystem.mds_ops_per_s=20000", "filesystem.aggregate_mbps=20000"]),
                      Layout(64, 4), sizes, methods=["stager", "direct"])
    staged, direct = result["methods"]["stager"], result["methods"]["direct"]
    assert staged["source_files"] == len(sizes), "with peers and room for all, each file once per job"
    assert direct["source_files"] == 3 * len(sizes)
    assert staged["seconds"] < direct["seconds"]


def test_tracked_nodes_stand_for_the_others():
    """Replaying 4 of 32 nodes gives the source reads and times of replaying all 32, within a few percent."""
    sizes = np.full(32 * 2 * 8 * 10, 80_000)
    share = len(sizes) // 32 * 80_000
    cfg = _cfg(peers="partition", capacity=str(share // 2 + window_bytes(sizes, 8, 4, 2)))
    profile = load_profile(None, ["filesystem.mds_ops_per_s=5000"])
    full = simulate(cfg, profile, Layout(32, 2), sizes)["methods"]["stager"]
    some = simulate(cfg, profile, Layout(32, 2, 4), sizes)["methods"]["stager"]
    assert some["source_files"] == pytest.approx(full["source_files"], rel=0.05)
    assert some["seconds"] == pytest.approx(full["seconds"], rel=0.05)


def test_tracked_nodes_stand_for_the_others_where_holders_drop_most_of_what_they_hold():
    """At an eighth of each node's share, replaying 4 of 32 nodes gives the source reads of replaying all 32
    within 5%, and never fewer than the job-wide optimum. (An estimate of what untracked holders still have
    that ignored how long ago they read each file gave 10% fewer reads, below the optimum.)"""
    sizes = np.full(32 * 2 * 8 * 10, 80_000)
    share = len(sizes) // 32 * 80_000
    cfg = _cfg(peers="partition", capacity=str(share // 8 + window_bytes(sizes, 8, 4, 2)))
    profile = load_profile(None, ["filesystem.mds_ops_per_s=5000"])
    full = simulate(cfg, profile, Layout(32, 2), sizes)
    some = simulate(cfg, profile, Layout(32, 2, 4), sizes)
    best = full["optimum"]["files"]
    assert best == some["optimum"]["files"]
    assert full["methods"]["stager"]["source_files"] >= best
    assert some["methods"]["stager"]["source_files"] == pytest.approx(full["methods"]["stager"]["source_files"],
                                                                     rel=0.05)
    assert some["methods"]["stager"]["source_files"] >= best


def test_tracked_nodes_stand_for_the_others_in_every_epoch_of_many_steps():
    """32 steps an epoch at a quarter of each node's share: replaying 4 of 32 nodes gives each epoch's source
    reads within 5% of replaying all 32. (Counting the tracked holders' asks over the whole run, the second
    epoch's estimate was 17% low, below the job-wide optimum: early in an epoch a holder still has most of
    what it read late in the last.)"""
    nodes, ranks, batch, steps = 32, 2, 8, 32
    files = nodes * ranks * batch * steps
    spec = PlanSpec.from_config(files, PlanConfig(batch_size=batch, epochs=3, seed=1), nodes * ranks)
    sizes = np.ones(files, dtype=np.int64)
    capacity = files // nodes // 4
    full = node_demand(sizes, spec, nodes, ranks, None, capacity, "auto", 2, True).totals("source_files")
    some = node_demand(sizes, spec, nodes, ranks, 4, capacity, "auto", 2, True).totals("source_files")
    best = job_optimum(sizes, spec, np.repeat(np.arange(nodes), ranks), [capacity] * nodes, 2)
    assert some.tolist() == pytest.approx(full.tolist(), rel=0.05)
    assert some.sum() >= best["files"] and full.sum() >= best["files"]


def test_the_nodes_order_within_a_step_changes_who_drops_what_but_every_read_is_accounted():
    """4 nodes of one rank, together as large as the dataset: taken in the nodes' order, node 0 makes room
    before the others ask it for anything; shuffled each step, the replay reads the source more (as the real
    runs do), never below the job-wide optimum, and the same shuffle gives the same reads."""
    nodes, batch, files = 4, 16, 1024
    spec = PlanSpec.from_config(files, PlanConfig(batch_size=batch, epochs=3, seed=1), nodes)
    sizes = np.ones(files, dtype=np.int64)
    capacity = files // nodes

    def reads(order):
        d = node_demand(sizes, spec, nodes, 1, None, capacity, "auto", 2, True, order=order)
        for node in d.tracked:
            assert np.array_equal(node.source_files + node.peer_files + node.local_files, node.samples)
        return int(d.totals("source_files").sum())

    by_node, shuffled = reads("node"), reads("shuffled")
    best = job_optimum(sizes, spec, np.arange(nodes), [capacity] * nodes, 2)["files"]
    assert best <= by_node < shuffled
    assert reads("shuffled") == shuffled
    with pytest.raises(ValueError, match="node, shuffled"):
        node_demand(sizes, spec, nodes, 1, None, capacity, "auto", 2, True, order="random")


def test_owners_at_scale_agree_with_the_engines():
    """Past the exact limit, ownership comes from the permutation's inverse: the same owners."""
    from stager.engine.peers.ownership import first_epoch_owners
    from stager.simulate import demand

    spec = PlanSpec(3000, 4, 2, 1, True, False, "pad", 300)  # 3000 divides by 300 ranks: no padding
    node_of_rank = np.repeat(np.arange(150, dtype=np.int32), 2)
    exact = first_epoch_owners(spec, 3000, 300, node_of_rank)
    fast = demand.owners(spec, 3000, 150, 2, exact_ranks=0)
    assert np.array_equal(fast, exact)


def test_untracked_nodes_cost_no_memory_over_the_catalog():
    """1,024 nodes, 2 of them tracked, 40,000 files: the replay's memory follows the tracked nodes, not every
    node (a holder's state over the whole catalog for each of 1,024 nodes took 990 MB here, 30 GB at 1.28M)."""
    import tracemalloc

    sizes = np.full(40_000, 1000)
    spec = PlanSpec(len(sizes), 4, 3, 7, True, False, "pad", 1024)
    tracemalloc.start()
    try:
        d = node_demand(sizes, spec, 1024, 1, tracked=2, capacity=20 * 1000 + 16 * 1000, ahead=4, peers=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100e6, f"{peak / 1e6:.0f} MB"
    assert d.totals("source_files").sum() >= len(sizes)


def test_demand_splits_every_read_by_where_it_comes_from():
    sizes = np.arange(1, 601) * 100
    spec = PlanSpec(600, 5, 2, 3, True, False, "pad", 4)
    d = node_demand(sizes, spec, 2, 2, peers=True)
    for node in d.tracked:
        reads = node.source_files + node.peer_files + node.local_files
        assert np.array_equal(reads, 2 * node.samples), "every sample of the node's ranks, once"
    assert d.totals("source_files").sum() == 600 and d.totals("source_bytes").sum() == sizes.sum()


def test_stage_all_and_the_capacity_it_needs():
    sizes = np.full(512, 10_000)
    fits = simulate(_cfg(capacity="unbounded"), load_profile(), Layout(2), sizes, methods=["stager", "stage-all"])
    assert fits["methods"]["stage-all"]["source_files"] == 2 * 512
    small = simulate(_cfg(capacity=str(2_000_000)), load_profile(), Layout(2), sizes, methods=["stage-all"])
    assert small["methods"]["stage-all"] == {"fits": False}


def test_nodes_sharing_a_host_make_each_fetched_file_cost_more_cpu():
    """``node.shared_copy_ms``: on a shared host (emulated nodes), each other node adds CPU to every fetched
    file; where the cores decide, the first epoch (every file fetched) takes that much longer."""
    sizes = np.full(1200, 1000)
    cfg = _cfg(capacity="unbounded", prefetchers=8)
    base = ["filesystem.open_ms=0.01", "node.cores=2", "costs.read_ms=0", "costs.main_ms=0", "costs.compute_ms=0",
            "costs.copy_ms=1"]

    def first_epoch(nodes, *sets):
        profile = load_profile(None, base + list(sets))
        return simulate(cfg, profile, Layout(nodes), sizes)["methods"]["stager"]["epochs"][0]["seconds"]

    shared = first_epoch(4, "node.shared_host=true")
    assert first_epoch(4, "node.shared_host=true", "node.shared_copy_ms=0.5") == pytest.approx(2.5 * shared, rel=0.1)
    # One node alone, or nodes with cores of their own, pay one node's cost.
    assert first_epoch(1, "node.shared_host=true", "node.shared_copy_ms=0.5") == first_epoch(1, "node.shared_host=true")
    assert first_epoch(4, "node.shared_copy_ms=0.5") == first_epoch(4)
    with pytest.raises(ConfigError, match="shared_copy_ms"):
        load_profile(None, ["node.shared_copy_ms=-1"])


def test_the_processes_start_delays_the_first_epoch_of_the_methods_that_start_stages():
    """``node.startup_s``: stager's stages begin that far into the job; the first epoch counts it, the rest
    of the run is the same, and ``direct`` reading (no stages) does not wait for it."""
    sizes = np.full(600, 20_000)
    methods = ["stager", "stage-all", "direct"]

    def run(*sets):
        out = simulate(_cfg(capacity="unbounded"), load_profile(None, list(sets)), Layout(2), sizes, methods=methods)
        return {m: [e["seconds"] for e in out["methods"][m]["epochs"]] for m in methods}

    without, late = run(), run("node.startup_s=0.75")
    for method in ("stager", "stage-all"):
        assert late[method][0] == pytest.approx(without[method][0] + 0.75, abs=1e-9)
        assert late[method][1:] == pytest.approx(without[method][1:], abs=1e-9)
    assert late["direct"] == without["direct"]
    with pytest.raises(ConfigError, match="startup_s"):
        load_profile(None, ["node.startup_s=-1"])


def test_a_runs_report_calibrates_the_processes_start(tmp_path):
    """``stager whatif --report RUN --save`` keeps the run's start (its slowest rank's time to the first
    request), and ``stager simulate --calibration`` counts it in the first epoch."""
    from stager.cli import main

    job = _job(tmp_path)
    report = tmp_path / "r.json"
    proc = subprocess.run(stager_cmd("run", job, "--report", str(report), "--quiet"), capture_output=True,
                          text=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = max(rank["startup_s"] for rank in json.loads(report.read_text())["per_rank"])
    assert started > 0
    cal = tmp_path / "cal.json"
    subprocess.run(stager_cmd("whatif", job, "--report", str(report), "--save", str(cal)), check=True,
                   capture_output=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    saved = json.loads(cal.read_text())
    assert saved["startup_s"] == started
    unstarted = tmp_path / "cal0.json"  # the same costs, no start measured
    unstarted.write_text(json.dumps(dict(saved, startup_s=0.0)))
    firsts = []
    for rates in (unstarted, cal):
        out = tmp_path / f"{rates.stem}.sim.json"
        assert main(["simulate", job, "--json", str(out), "--calibration", str(rates)]) == 0
        result = json.loads(out.read_text())
        firsts.append(result["methods"]["stager"]["epochs"][0]["seconds"])
    assert result["profile"]["node"]["startup_s"] == started
    assert firsts[1] == pytest.approx(firsts[0] + started, abs=1e-9)


def test_profiles_refuse_unknown_keys_and_bad_values(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("filesystem: {open_msec: 3}\n")
    with pytest.raises(ConfigError, match=r"(?s)filesystem.open_msec.*open_ms = 10.0"):
        load_profile(str(bad))
    with pytest.raises(ConfigError, match="other_load"):
        load_profile(None, ["filesystem.other_load=1.5"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_profile(None, ["cores=3"])
    with pytest.raises(ConfigError, match="cannot read profile"):
        load_profile(str(tmp_path / "missing.yaml"))
    # ``auto`` is simulated (the engine's controller replayed), not refused.
    auto = simulate(_cfg(prefetchers="auto"), load_profile(), Layout(1), np.full(64, 10))["methods"]["stager"]
    assert auto["counts_timeline"][0]["t"] == 0.0
    with pytest.raises(ConfigError, match="unknown method"):
        simulate(_cfg(), load_profile(), Layout(1), np.full(64, 10), methods=["stager", "nfs"])
    for name in os.listdir(os.path.join(REPO, "configs", "profiles")):
        load_profile(os.path.join(REPO, "configs", "profiles", name))  # the shipped ones load


def test_the_command_prints_writes_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from stager.cli import main

    job = tmp_path / "job.yaml"
    job.write_text("dataset: {source: /nonexistent}\nplan: {batch_size: 8, epochs: 2}\n"
                   "staging: {prefetchers: 4, peers: partition}\nreader: {workers: 2}\n")
    out = tmp_path / "s.json"
    code = main(["simulate", str(job), "--nodes", "4", "--ranks-per-node", "2", "--files", "2000",
                 "--baseline", "all", "--json", str(out), "--plot", str(tmp_path / "s.png"),
                 "--profile", os.path.join(REPO, "configs", "profiles", "emulated.yaml")])
    assert code == 0
    text = capsys.readouterr().out
    assert "direct (DataLoader)" in text and "stage all first" in text
    result = json.loads(out.read_text())
    assert set(result["methods"]) == {"stager", "no-peers", "unbounded", "direct", "stage-all"}
    assert result["methods"]["stager"]["source_files"] == 2000
    assert (tmp_path / "s.png").stat().st_size > 0
    # stager report shows the results again, with the plot where a run's report's plots go
    assert main(["report", str(out), "--plots", str(tmp_path / "plots")]) == 0
    assert "direct (DataLoader)" in capsys.readouterr().out
    assert (tmp_path / "plots" / "simulation.png").stat().st_size > 0


def test_the_command_over_a_sharded_dataset_stages_containers(tmp_path, capsys):
    """Over tar shards the simulator counts containers, as the engine stages them."""
    from stager.cli import main
    from stager.job.packing import make_shards

    make_shards(str(tmp_path / "data"), "tar", 240, 2000, 4, 0, 20, progress=False)
    job = tmp_path / "job.yaml"
    job.write_text("dataset: {source: data, manifest: manifest.tsv, format: tar}\n"
                   "plan: {batch_size: 6, epochs: 2, shuffle_algorithm: shards, shard_window: 3}\n"
                   "staging: {prefetchers: 2, lookahead: 2}\nreader: {workers: 1}\n")
    out = tmp_path / "s.json"
    assert main(["simulate", str(job), "--nodes", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["samples"], result["files"]) == (240, 12)
    staged = result["methods"]["stager"]
    assert staged["source_files"] == 2 * 12, "each node stages every container of its windows, once"
    assert [e["local_files"] for e in staged["epochs"]][1] > 0


def _one_epoch(prefetchers, in_flight, copy_ms):
    """Seconds of one epoch of 512 files at 20 ms an open, 8 cores, nothing to compute: the fetches alone."""
    cfg = config_from_dict({"dataset": {"source": "/nonexistent", "manifest": "m.tsv", "requests_in_flight": in_flight},
                            "plan": {"batch_size": 32, "epochs": 1, "seed": 1},
                            "staging": {"prefetchers": prefetchers, "lookahead": 16},
                            "reader": {"workers": 2}, "run": {"compute_ms": 0}})
    profile = profile_from_dict({"filesystem": {"open_ms": 20.0}, "node": {"cores": 8},
                                 "costs": {"copy_ms": copy_ms, "read_ms": 0.01, "batch_ms": 0.0, "main_ms": 0.0}})
    return simulate(cfg, profile, Layout(1), np.full(512, 10_000))["methods"]["stager"]["seconds"]


def test_files_in_flight_wait_on_the_source_together_and_copy_one_process_at_a_time():
    # Waiting on the source, 16 files in flight are 16 whether in one process or four.
    threads, processes, one = _one_epoch(1, 16, 0.1), _one_epoch(4, 4, 0.1), _one_epoch(1, 1, 0.1)
    assert threads == pytest.approx(processes, rel=0.1)
    assert threads < one / 8
    # Copying at 5 ms of CPU a file, one process's threads share one core: four processes copy on four.
    assert _one_epoch(1, 16, 5.0) > 2.5 * _one_epoch(4, 4, 5.0)


def _slowing_source(prefetchers, in_flight="auto"):
    """A 3-epoch job of 1,024 files on a source at 2 ms an open that takes 30 ms from 1 s to 6 s."""
    cfg = config_from_dict({"dataset": {"source": "/nonexistent", "manifest": "m.tsv", "requests_in_flight": in_flight},
                            "plan": {"batch_size": 32, "epochs": 3, "seed": 1},
                            "staging": {"prefetchers": prefetchers, "capacity": "24000000", "cache_policy": "lru",
                                        "lookahead": 4},
                            "reader": {"workers": 2}, "run": {"compute_ms": 20}})
    profile = profile_from_dict({"filesystem": {"open_ms": 2.0, "open_ms_changes": [[1.0, 30.0], [6.0, 2.0]]},
                                 "node": {"cores": 4}, "costs": {"read_ms": 2.0}})
    return simulate(cfg, profile, Layout(1), np.full(1024, 60_000))["methods"]["stager"]


def _files_in_flight(row):
    return row["prefetchers"] * row["in_flight"]


def test_a_source_whose_latency_changes_is_simulated_and_auto_follows_it():
    auto = _slowing_source("auto")
    timeline = auto["counts_timeline"]
    start = timeline[0]
    assert start["t"] == 0.0 and _files_in_flight(start) >= 16
    # The engine's own tuner, replayed: more files in flight once opens take 30 ms, in threads
    # (the prefetchers wait on the source, their own CPU is not the limit): no more processes.
    slow = [r for r in timeline if 1.0 <= r["t"] < 6.0]
    assert max(_files_in_flight(r) for r in slow) > _files_in_flight(start)
    assert max(r["prefetchers"] for r in slow) == start["prefetchers"]
    held = _slowing_source(start["prefetchers"], start["in_flight"])
    assert held["counts_timeline"] == [{"t": 0.0, "prefetchers": start["prefetchers"], "in_flight": start["in_flight"],
                                        "readers": 2, "lookahead": 4}]
    # Held at the start's counts, the slow phase takes longer (simulated time: no machine noise).
    assert auto["seconds"] < held["seconds"]
    # The same job on a source that never slows is quicker than either.
    steady = simulate(*_steady_job())["methods"]["stager"]
    assert steady["seconds"] < auto["seconds"]


def _steady_job():
    cfg = config_from_dict({"dataset": {"source": "/nonexistent", "manifest": "m.tsv"},
                            "plan": {"batch_size": 32, "epochs": 3, "seed": 1},
                            "staging": {"prefetchers": "auto", "capacity": "24000000", "cache_policy": "lru",
                                        "lookahead": 4},
                            "reader": {"workers": 2}, "run": {"compute_ms": 20}})
    profile = profile_from_dict({"filesystem": {"open_ms": 2.0}, "node": {"cores": 4}, "costs": {"read_ms": 2.0}})
    return cfg, profile, Layout(1), np.full(1024, 60_000)


@pytest.mark.parametrize("changes,message", [
    ([[5.0, 30.0], [2.0, 2.0]], "times must increase"),
    ([[5.0]], "expected [at_s, open_ms]"),
    ([[5.0, -1.0]], "expected [at_s, open_ms]"),
])
def test_latency_changes_are_checked(changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        profile_from_dict({"filesystem": {"open_ms_changes": changes}})


def test_the_latency_in_force_is_the_last_change_begun():
    fs = profile_from_dict({"filesystem": {"open_ms": 2.0, "open_ms_changes": [[3.0, 30.0], [8.0, 1.0]]}}).filesystem
    assert [fs.open_ms_at(t) for t in (0.0, 2.99, 3.0, 7.9, 8.0, 100.0)] == [2.0, 2.0, 30.0, 30.0, 1.0, 1.0]


def _one_file_a_minibatch(lookahead):
    """One epoch of 480 files, one a minibatch, 24 prefetchers, 400 ms an open, 10 ms a step."""
    cfg = config_from_dict({"dataset": {"source": "/nonexistent", "manifest": "m.tsv"},
                            "plan": {"batch_size": 1, "epochs": 1, "seed": 1},
                            "staging": {"prefetchers": 24, "lookahead": lookahead},
                            "reader": {"workers": 2}, "run": {"compute_ms": 10}})
    profile = profile_from_dict({"filesystem": {"open_ms": 400.0}, "node": {"cores": 16}, "costs": {"read_ms": 0.5}})
    return simulate(cfg, profile, Layout(1), np.full(480, 4096))["methods"]["stager"]


def test_the_simulated_auto_look_ahead_deepens_as_the_engine_does_where_prefetchers_idle():
    deep, fixed = _one_file_a_minibatch("auto"), _one_file_a_minibatch(16)
    depths = [row["lookahead"] for row in deep["counts_timeline"]]
    assert depths[0] == 16 and max(depths) > 24  # past the prefetchers: each holds a file of its own
    assert [row["lookahead"] for row in fixed["counts_timeline"]] == [16]
    # 16 files in flight against 24 prefetchers: the fixed depth leaves a third of them idle (simulated time).
    assert deep["seconds"] < 0.8 * fixed["seconds"]
