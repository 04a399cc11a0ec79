"""Where the time goes: the accounting of real runs on the emulated slow file
system, ``stager report`` (text, advice, plots) and the live progress line."""

import json
import os
import struct
import subprocess
import sys
import time

import pytest
from conftest import REPO, make_config, make_job_data, stager_cmd
from helpers.terminal import Terminal

from stager.telemetry import ReportError, load_report
from stager.telemetry.advice import fetch_split, judge

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
PNG = b"\x89PNG\r\n\x1a\n"


def env_for(tmp_path):
    """This checkout's stager, temporary directories (the emulator's mount point) under ``tmp_path``."""
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=path)


def write_job(directory, *, open_ms, prefetchers, compute_ms, samples=120, epochs=1, in_flight=1):
    directory.mkdir(exist_ok=True)
    (directory / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv, requests_in_flight: {in_flight}}}
synthetic: {{samples: {samples}, bytes: 3000}}
slowfs: {{enabled: true, open_ms: {open_ms}}}
plan: {{batch_size: 8, epochs: {epochs}, seed: 5}}
staging: {{local_dir: local, prefetchers: {prefetchers}, lookahead: 4}}
reader: {{workers: 2}}
run: {{compute_ms: {compute_ms}}}
""")
    return make_job_data(directory / "job.yaml")


def stager_run(directory, **settings):
    job = write_job(directory, **settings)
    out = directory / "run.json"
    proc = subprocess.run(stager_cmd("run", job, "--report", str(out)), capture_output=True, text=True,
                          timeout=180, env=env_for(directory))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "minibatches" not in proc.stderr, "no progress line off a terminal"
    return out


# Two controlled runs: 30 ms per open with one prefetcher and 1 ms of compute per
# step (the source sets the pace), and 1 ms per open with four prefetchers and
# 60 ms of compute per step (the training step does).
SOURCE_BOUND = {"open_ms": 30, "prefetchers": 1, "compute_ms": 1}
COMPUTE_BOUND = {"open_ms": 1, "prefetchers": 4, "compute_ms": 60}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("report-runs")
    return {"source": stager_run(base / "source", **SOURCE_BOUND),
            "compute": stager_run(base / "compute", **COMPUTE_BOUND)}


def assert_adds_up(report, rank, compute_ms, other=0.20):
    """A rank's loop: wait + compute + other = its wall time; compute is the known sleep per step."""
    r = report["per_rank"][rank]
    loop = r["wait_s"] + r["compute_s"] + r["other_s"]
    assert abs(loop - r["wall_s"]) <= 1e-3 * r["wall_s"] + 1e-5, r
    assert r["other_s"] == pytest.approx(r["before_s"] + r["after_s"], abs=2e-6)
    # "other": before the first next(), and after the plan's end the pipeline's
    # shutdown (on a node leader of several ranks: waiting for them to leave).
    assert r["other_s"] <= other * r["wall_s"], r
    known = r["steps"] * compute_ms / 1000.0
    # A sleep never returns early; the loop's own bookkeeping adds little per
    # step, and a loaded machine wakes a sleeper late: a bound far below the
    # waits, which would land here if the accounting mixed them up.
    assert known <= r["compute_s"] <= known * 1.5 + 0.01 * r["steps"], (known, r)
    assert len(r["series"]["wait"]) == r["steps"]
    assert abs(sum(r["series"]["wait"]) - r["wait_s"]) <= 0.01 * r["wall_s"] + 1e-3  # plus the end's wait
    assert abs(sum(r["series"]["compute"]) - r["compute_s"]) <= 1e-3


@pytest.mark.parametrize("kind", ["source", "compute"])
def test_accounting_adds_up_to_the_wall_time(runs, kind):
    report = json.loads(runs[kind].read_text())
    compute_ms = (SOURCE_BOUND if kind == "source" else COMPUTE_BOUND)["compute_ms"]
    assert report["batches"] == 15 and report["samples"] == 120
    assert [r["rank"] for r in report["per_rank"]] == [0]
    r = report["per_rank"][0]
    assert r["steps"] == 15 and r["samples"] == 120
    assert_adds_up(report, 0, compute_ms)
    # The runner times its loop itself: the accounting's wall agrees within 1%.
    assert abs(r["wall_s"] - report["wall_s"]) <= 0.01 * report["wall_s"]
    # The old keys stay, and agree with the accounting.
    assert abs(report["stall_s"] - r["wait_s"]) <= 0.01 * report["wall_s"]
    assert report["prefetch_busy_s"] == pytest.approx(report["stages"]["prefetch"]["busy_s"], abs=1e-3)
    p = report["stages"]["prefetch"]
    assert p["files"] == p["files_from_source"] == 120 and p["bytes"] == report["bytes_staged"]
    assert p["workers"] == (SOURCE_BOUND if kind == "source" else COMPUTE_BOUND)["prefetchers"]
    assert report["stages"]["read"]["samples"] == 120 and report["stages"]["consume"]["steps"] == 15
    # A prefetcher's time per file is at least the emulator's latency per open.
    open_ms = (SOURCE_BOUND if kind == "source" else COMPUTE_BOUND)["open_ms"]
    assert p["seconds_per_file"] >= open_ms / 1000.0


def test_advice_names_the_source_when_it_is_slow_and_the_step_when_it_is_not(runs):
    source = load_report(str(runs["source"]))
    verdict = judge(source)
    assert verdict.bottleneck == "prefetch", verdict
    assert source["steady_stall_fraction"] > 0.5
    assert any("staging.prefetchers: " in a for a in verdict.advice), verdict.advice
    # A count set by hand: auto is advised first, for it grows requests in flight before processes.
    assert "set staging.prefetchers: auto" in verdict.advice[0] and "no new processes" in verdict.advice[0]
    assert "x 1 file(s) in flight" in verdict.reason
    # Where auto ran and the source still set the pace, more requests are not the answer.
    auto = json.loads(json.dumps(source))
    auto["config"]["staging"]["prefetchers"] = "auto"
    auto["counts_timeline"] = (auto.get("counts_timeline") or [{"t": 0.0, "prefetchers": 1, "readers": 1}])[-1:]
    auto["counts_timeline"][0]["in_flight"] = 6
    verdict = judge(auto)
    assert verdict.bottleneck == "prefetch" and "x 6 file(s) in flight" in verdict.reason
    assert "auto ended at" in verdict.advice[0] and "stager pack" in verdict.advice[0], verdict.advice
    compute = load_report(str(runs["compute"]))
    verdict = judge(compute)
    assert verdict.bottleneck == "compute", (verdict, compute["steady_stall_fraction"])
    assert compute["steady_stall_fraction"] < 0.05


def test_a_prefetcher_keeping_files_in_flight_is_accounted_by_its_slots(tmp_path):
    # One process fetching 8 files at once: its busy seconds are summed over 8 slots, never over 1.
    out = stager_run(tmp_path / "threads", open_ms=30, prefetchers=1, compute_ms=1, in_flight=8)
    report = json.loads(out.read_text())
    p = report["stages"]["prefetch"]
    assert (p["workers"], p["in_flight"], p["slots"]) == (1, 8, 8)
    assert p["files"] == 120 and p["seconds_per_file"] >= 0.03
    assert 0 < p["utilization"] <= 1.0, p
    assert p["capacity_files_per_s"] == pytest.approx(8 / p["seconds_per_file"], rel=1e-3)
    # Each file's 30 ms open is a wait on the source, not time on a core or queued for one.
    assert p["timed_busy_s"] == pytest.approx(p["busy_s"], rel=1e-3)
    split = fetch_split(p)  # the last share: waiting on the source (or for a core, where the kernel does not say)
    assert sum(share for _, share in split) == pytest.approx(1.0)
    assert split[0][0] == "on a core" and split[-1][0].startswith("waiting on the source")
    assert 0 < split[0][1] < split[-1][1] and split[-1][1] > 0.5, split
    proc = subprocess.run(stager_cmd("report", str(out)), capture_output=True, text=True, timeout=120,
                          env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.strip().startswith("prefetch "))
    assert row[1:4] == ["1", "x", "8/node"], row
    assert f"{p['capacity_files_per_s']:,.1f}" in proc.stdout
    assert f"prefetchers' fetch time: {split[0][1]:.0%} on a core, " in proc.stdout


def test_a_loop_waiting_on_stages_that_keep_up_is_told_to_ask_beyond_the_depth_auto_reached(runs):
    report = load_report(str(runs["source"]))
    assert report["steady_stall_fraction"] > 0.5
    for node in report["nodes_accounting"].values():  # prefetchers that could deliver far more than the demand
        node["prefetch"]["slots"] = 10_000
    verdict = judge(report)
    assert verdict.bottleneck == "lookahead", verdict
    assert verdict.advice == ["ask further ahead: staging.lookahead: 8 (now 4)"]
    report["config"]["staging"]["lookahead"] = "auto"
    first = report["counts_timeline"][0]
    report["counts_timeline"] = [dict(first, lookahead=16), dict(first, t=1.0, lookahead=24)]
    assert judge(report).advice == ["ask further ahead: staging.lookahead: 48 (now auto, which reached 24)"]


def test_stages_that_keep_up_but_queue_for_the_cores_are_named_cores_not_asked_to_look_further(runs):
    report = load_report(str(runs["source"]))
    for node in report["nodes_accounting"].values():  # prefetchers that could deliver far more than the demand
        node["prefetch"]["slots"] = 10_000
    prefetch = report["stages"]["prefetch"]
    assert prefetch["timed_busy_s"] > 0 and prefetch["queued_s"] is not None, prefetch
    # The same run's fetches, as a full node would have queued them: a third of their time waiting for a core.
    prefetch["queued_s"] = prefetch["timed_busy_s"] / 3
    verdict = judge(report)
    assert verdict.bottleneck == "cores", verdict
    assert "33% of their time queued for a core" in verdict.reason and "prefetch " in verdict.reason
    assert "reader.workers, now 2" in verdict.advice[0] and "lookahead" not in verdict.advice[0], verdict.advice
    # Where the kernel does not say how long they queued, the wait is not put on the cores.
    prefetch["queued_s"] = None
    assert judge(report).bottleneck == "lookahead"
    prefetch["queued_s"] = prefetch["timed_busy_s"] / 20
    assert judge(report).bottleneck == "lookahead"


def test_report_prints_the_summary_and_draws_every_plot(runs, tmp_path):
    plots = tmp_path / "plots"
    proc = subprocess.run(stager_cmd("report", str(runs["source"]), "--plots", str(plots)), capture_output=True,
                          text=True, timeout=120, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    report = json.loads(runs["source"].read_text())
    assert f"stall: {report['stall_fraction']:.1%}" in out
    assert f"time to first minibatch: {report['first_batch_s']:.2f} s" in out
    assert "bottleneck: prefetch: " in out and "staging.prefetchers: " in out
    assert "the source delivers" in out and "with 1 prefetchers" in out
    import matplotlib.image

    names = sorted(os.listdir(plots))
    assert names == ["counts.png", "ranks.png", "stalls.png", "timeline.png"]
    for name in names:
        path = plots / name
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) > 1000, name
        width, height = struct.unpack(">II", data[16:24])
        image = matplotlib.image.imread(str(path))
        assert image.shape[:2] == (height, width) and width > 100 and height > 100, name
        assert str(path) in out


def test_report_says_plainly_when_matplotlib_is_missing(runs, tmp_path):
    # A directory that shadows matplotlib with a package that fails to import, as on a machine without it.
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = env_for(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shadow"), env["PYTHONPATH"]])
    proc = subprocess.run(stager_cmd("report", str(runs["compute"]), "--plots", str(tmp_path / "p")),
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "no plots: matplotlib is not installed" in proc.stdout
    assert "bottleneck: compute" in proc.stdout
    assert not (tmp_path / "p").exists()


def test_report_of_a_missing_or_older_file_is_a_clear_error(tmp_path):
    proc = subprocess.run(stager_cmd("report", str(tmp_path / "none.json")), capture_output=True, text=True,
                          timeout=60, env=env_for(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"stager: error: {tmp_path / 'none.json'}: no such file" in proc.stderr
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"batches": 3, "wall_s": 1.0}))
    proc = subprocess.run(stager_cmd("report", str(old)), capture_output=True, text=True, timeout=60,
                          env=env_for(tmp_path))
    assert proc.returncode == 2 and "'steady_stall_fraction'" in proc.stderr and str(old) in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ReportError, match="not JSON"):
        load_report(str(bad))


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")
def test_every_rank_of_two_nodes_is_accounted_in_the_report(tmp_path):
    job = write_job(tmp_path, open_ms=2, prefetchers=2, compute_ms=10, samples=160)
    out = tmp_path / "run.json"
    cmd = [MPIEXEC]
    for i, node in enumerate(("a", "b")):
        cmd += ([":"] if i else []) + ["-n", "2", "-env", "STAGER_NODE_ID", node, sys.executable, "-m", "stager",
                                       "run", job, "--report", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = load_report(str(out))
    assert [r["rank"] for r in report["per_rank"]] == [0, 1, 2, 3]
    assert {r["rank"]: r["node"] for r in report["per_rank"]} == {0: "a", 1: "a", 2: "b", 3: "b"}
    for rank in range(4):
        assert_adds_up(report, rank, 10, other=1.0)
        r = report["per_rank"][rank]
        # The loop asks for its first minibatch at once; on 2 cores shared by 4 ranks, their prefetchers and
        # the emulator, the scheduler may hold it back a few ms, which in a 0.2 s loop is more than 5%.
        assert r["before_s"] <= 0.05 * r["wall_s"] + 0.05, r
    nodes = report["nodes_accounting"]
    assert sorted(nodes) == ["a", "b"] and [nodes[n]["ranks"] for n in "ab"] == [[0, 1], [2, 3]]
    # Each node's leader accounts for its node's prefetchers: together they fetched every file once.
    assert all(nodes[n]["prefetch"]["workers"] == 2 for n in "ab")
    assert sum(nodes[n]["prefetch"]["files"] for n in "ab") == report["stages"]["prefetch"]["files"] == 160
    assert ["prefetch" in r["stages"] for r in report["per_rank"]] == [True, False, True, False]
    assert report["stages"]["read"]["samples"] == report["stages"]["consume"]["samples"] == 160
    proc = subprocess.run(stager_cmd("report", str(out), "--no-plots"), capture_output=True, text=True,
                          timeout=60, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "imbalance: waits from" in proc.stdout and "4 rank(s)" in proc.stdout


def test_staged_loader_report_accounts_for_the_training_loop(slow_source, tmp_path):
    pytest.importorskip("torch")
    from iterators.pytorch import StagedLoader

    cfg = make_config(slow_source, tmp_path / "local")
    out = tmp_path / "loader.json"
    with StagedLoader(cfg) as loader:
        steps = 0
        for _ in loader:
            time.sleep(0.02)  # the training step
            steps += 1
        report = loader.report(str(out))
    assert steps == 13
    assert load_report(str(out)) == json.loads(json.dumps(report))
    r = report["per_rank"][0]
    assert r["steps"] == steps and r["samples"] == 100
    assert r["compute_s"] >= 0.02 * steps
    assert abs(r["wait_s"] + r["compute_s"] + r["other_s"] - r["wall_s"]) <= 1e-3 * r["wall_s"] + 1e-5
    assert report["stages"]["prefetch"]["files"] == 100 and report["mode"] == "staged"
    assert judge(report).bottleneck in ("compute", "prefetch", "read", "lookahead")


def test_progress_line_shows_rates_on_a_terminal(tmp_path):
    job = write_job(tmp_path, open_ms=1, prefetchers=2, compute_ms=20, samples=80)
    term = Terminal()
    proc = subprocess.Popen(stager_cmd("run", job), stderr=term.slave, stdout=subprocess.PIPE, text=True,
                            env=env_for(tmp_path))
    term.started()
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        term.close()
    assert proc.returncode == 0, term.text()
    line = term.text().replace("\r", "\n").splitlines()
    final = [x for x in line if "staged run" in x and "10/10" in x]
    assert final, term.text()
    assert "samples/s" in final[-1] and "stall " in final[-1] and "staged 0.2 MB" in final[-1], final[-1]


def test_chainer_iterator_report_accounts_for_its_epoch(slow_source, tmp_path):
    chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
    cfg = make_config(slow_source, tmp_path / "local")
    out = tmp_path / "chainer.json"
    with chainer_front.StagingIterator(cfg, 10, repeat=False) as it:
        steps = 0
        for batch in it:
            time.sleep(0.02)  # the training step
            steps += 1
        report = it.report(str(out))
        assert it.stats.batches == steps == 10
    r = load_report(str(out))["per_rank"][0]
    assert r["steps"] == steps and r["samples"] == 100 and r["compute_s"] >= 0.02 * (steps - 1)
    assert abs(r["wait_s"] + r["compute_s"] + r["other_s"] - r["wall_s"]) <= 1e-3 * r["wall_s"] + 1e-5
    assert report["stages"]["read"]["samples"] == 100
