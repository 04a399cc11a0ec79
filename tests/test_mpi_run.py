"""``stager run`` under the mpich wheel's mpiexec: 1 rank, and 4 ranks as two
emulated nodes of two ranks (``STAGER_NODE_ID``)."""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections import Counter

import pytest

from conftest import REPO, child_pids, make_job_data
from helpers.watch import wait_for_lines
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
SAMPLES = 200

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")


def write_job(tmp_path):
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv}}
synthetic: {{samples: {SAMPLES}, bytes: 3000}}
slowfs: {{enabled: true, open_ms: 1}}
plan: {{batch_size: 8, epochs: 2, seed: 7}}
staging: {{local_dir: local, lookahead: 4}}
""")
    return make_job_data(tmp_path / "job.yaml")


def mpirun(nodes, args, tmp_path, timeout=180, env=None):
    """Runs ``stager ARGS`` on ``nodes`` (a list of (node id, ranks)) with one mpiexec,
    temporary directories (the emulator's mount point) under ``tmp_path``."""
    env = dict(env or os.environ, TMPDIR=str(tmp_path))
    cmd = [MPIEXEC]
    for i, (node, ranks) in enumerate(nodes):
        if i:
            cmd.append(":")
        cmd += ["-n", str(ranks), "-env", "STAGER_NODE_ID", node, sys.executable, "-m", "stager", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def processes_mentioning(text):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def assert_nothing_left(tmp_path, marker):
    for pid in processes_mentioning(marker):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], 15)[0], f"process {pid} outlived the job"
        finally:
            os.close(fd)
    assert os.listdir(tmp_path / "local") == [], "staging directories left behind"
    with open("/proc/self/mounts") as fh:
        assert not [m for m in fh if m.split()[1].startswith(str(tmp_path))]


def read_records(rec):
    reads = {}
    for name in os.listdir(rec):
        if name.startswith("rank-"):
            reads[int(name[5:-6])] = [json.loads(x) for x in open(os.path.join(rec, name))]
    staged = {name[7:-6]: [json.loads(x) for x in open(os.path.join(rec, name))]
              for name in os.listdir(rec) if name.startswith("staged-")}
    return reads, staged


LAYOUTS = {"1 rank": [("a", 1)], "4 ranks on 2 nodes": [("a", 2), ("b", 2)]}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ranks_split_each_epoch_and_nodes_stage_only_their_ranks_files(tmp_path, layout):
    nodes = LAYOUTS[layout]
    size = sum(r for _, r in nodes)
    job = write_job(tmp_path)
    sequences = []
    for prefetchers, readers in ((1, 1), (4, 3)):
        rec = tmp_path / f"rec-{prefetchers}-{readers}"
        proc = mpirun(nodes, ["run", job, "--quiet", "--record", str(rec), "--report", str(rec / "r.json"),
                              "--set", f"staging.prefetchers={prefetchers}", "--set", f"reader.workers={readers}"],
                      tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reads, staged = read_records(rec)
        assert sorted(reads) == list(range(size))
        assert sorted(staged) == sorted(n for n, _ in nodes)
        sequences.append(reads)

        catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
        rank_node = {}
        rank = 0
        for node, ranks in nodes:
            for _ in range(ranks):
                rank_node[rank] = node
                rank += 1
        for epoch in (0, 1):
            union = Counter(p for r in reads for line in reads[r] if line["epoch"] == epoch for p in line["samples"])
            assert sorted(union) == sorted(catalog.paths()) and set(union.values()) == {1}
        cfg = PlanConfig(batch_size=8, epochs=2, seed=7)
        for r, lines in reads.items():
            expected = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=size)]
            assert [line["samples"] for line in lines] == expected, f"rank {r} did not follow the plan"
        for node, files in staged.items():
            read_here = {p for r, lines in reads.items() if rank_node[r] == node for line in lines
                         for p in line["samples"]}
            paths = [f["path"] for f in files]
            assert set(paths) <= read_here, f"node {node} staged files its ranks never read"
            assert len(paths) == len(set(paths)), f"node {node} staged a file twice"
        report = json.loads((rec / "r.json").read_text())
        assert report["world_size"] == size and report["samples"] == 2 * SAMPLES
        assert report["files_staged"] == sum(len(f) for f in staged.values())
        assert_nothing_left(tmp_path, job)
    assert sequences[0] == sequences[1], "the sequence changed with prefetcher or reader counts"


def test_one_rank_failing_mid_epoch_ends_the_job(tmp_path):
    job = write_job(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "helpers"))
    proc = mpirun(LAYOUTS["4 ranks on 2 nodes"],
                  ["run", job, "--quiet", "--set", "dataset.loader=faults:fail_on_rank_2",
                   "--set", "run.compute_ms=5", "--set", "plan.epochs=0"], tmp_path, timeout=120, env=env)
    assert proc.returncode != 0
    assert "injected failure on rank 2" in proc.stderr
    assert "aborting the MPI job" in proc.stderr
    assert_nothing_left(tmp_path, job)


def test_a_run_saved_on_one_rank_resumes_on_four_at_the_same_global_position(tmp_path):
    job = write_job(tmp_path)
    state = tmp_path / "state.json"
    first = mpirun(LAYOUTS["1 rank"], ["run", job, "--quiet", "--record", str(tmp_path / "rec1"),
                                       "--set", f"run.state_file={state}", "--set", "run.max_batches=5"], tmp_path)
    assert first.returncode == 0, first.stderr
    saved = json.loads(state.read_text())
    assert (saved["epoch"], saved["position"]) == (0, 5 * 8)
    second = mpirun(LAYOUTS["4 ranks on 2 nodes"], ["run", job, "--quiet", "--record", str(tmp_path / "rec2"),
                                                    "--set", f"run.state_file={state}"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert not state.exists() and not list(tmp_path.glob("state.json*")), "a completed run removes its state"
    reads, _ = read_records(tmp_path / "rec2")
    assert sorted(reads) == [0, 1, 2, 3]
    steps = {len(lines) for lines in reads.values()}
    assert len(steps) == 1, "every rank must resume with the same number of steps"
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=8, epochs=2, seed=7)
    for r, lines in reads.items():
        expected = [(m.epoch, m.step, [catalog.path(i) for i in m.indices])
                    for m in plan.iterate(SAMPLES, cfg, 0, 5 * 8, rank=r, size=4)]
        assert [(x["epoch"], x["step"], x["samples"]) for x in lines] == expected
    (done,) = read_records(tmp_path / "rec1")[0].values()
    resumed_epoch0 = [p for r in range(4) for x in reads[r] if x["epoch"] == 0 for p in x["samples"]]
    first_epoch0 = [p for x in done for p in x["samples"]]
    assert sorted(first_epoch0 + resumed_epoch0) == sorted(catalog.paths()), \
        "the first run and the resumed one together read epoch 0 exactly once"
    assert_nothing_left(tmp_path, job)


def test_a_bounded_cache_reports_per_node_and_epoch_in_records_and_report(tmp_path):
    job = write_job(tmp_path)
    per_node_share_bytes = SAMPLES // 2 * 3000  # two nodes; samples of about 3,000 bytes
    rec = tmp_path / "rec"
    proc = mpirun(LAYOUTS["4 ranks on 2 nodes"],
                  ["run", job, "--quiet", "--record", str(rec), "--report", str(rec / "r.json"),
                   "--set", f"staging.capacity={per_node_share_bytes // 2}", "--set", "staging.lookahead=2",
                   "--set", "reader.ahead=2",
                   # Agreeing on a position after each step keeps the ranks in step, so a rank
                   # running ahead into epoch 1 does not fetch files its node's other rank has yet
                   # to ask for in epoch 0 (they would count as epoch 1's misses).
                   "--set", f"run.state_file={tmp_path / 'state.json'}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reads, staged = read_records(rec)
    report = json.loads((rec / "r.json").read_text())
    for node in ("a", "b"):
        rows = [json.loads(x) for x in (rec / f"cache-{node}.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in rows] == [0, 1]
        fetched = Counter(f["epoch"] for f in staged[node])
        assert [r["files_from_source"] for r in rows] == [fetched[0], fetched[1]]
        assert rows[0]["misses"] == SAMPLES // 2, "epoch 0 reads each of the node's files from the source"
        assert rows[1]["misses"] < SAMPLES // 2, "epoch 1 finds some of them kept"
        assert rows[1]["evictions"] > 0 and max(r["peak_bytes"] for r in rows) <= per_node_share_bytes // 2
        assert report["node_cache"][node] == rows
    assert report["cache"][1]["misses"] == sum(report["node_cache"][n][1]["misses"] for n in ("a", "b"))
    assert_nothing_left(tmp_path, job)


RESUME_LAYOUTS = {"2 ranks": [("a", 2)], "4 ranks on 2 nodes": [("a", 2), ("b", 2)]}


def sigterm_mpirun(nodes, args, tmp_path, env, records, after_lines=2):
    """Starts ``stager ARGS`` under mpiexec, sends mpiexec SIGTERM (which it passes to every rank) once
    rank 0 has recorded ``after_lines`` minibatches in ``records``, and returns (exit code, stderr)."""
    cmd = [MPIEXEC]
    for i, (node, ranks) in enumerate(nodes):
        cmd += ([":"] if i else []) + ["-n", str(ranks), "-env", "STAGER_NODE_ID", node, sys.executable, "-m",
                                       "stager", *args]
    os.makedirs(records, exist_ok=True)
    with open(tmp_path / "mpiexec.err", "w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
        timer = watchdog(proc)
        try:
            if wait_for_lines(os.path.join(records, "rank-0.jsonl"), after_lines, proc.pid):
                proc.send_signal(signal.SIGTERM)  # what Slurm's --signal or scancel does
            code = proc.wait(timeout=120)
        finally:
            timer.cancel()
            kill_job(proc)
        err.seek(0)
        return code, err.read()


@pytest.mark.parametrize("first,second", [("4 ranks on 2 nodes", "4 ranks on 2 nodes"),
                                          ("2 ranks", "4 ranks on 2 nodes")])
def test_sigterm_saves_one_agreed_position_that_resumes_exactly_on_any_number_of_ranks(tmp_path, first, second):
    job = write_job(tmp_path)
    state = tmp_path / "state.json"
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "tests", "helpers"), os.environ.get("PYTHONPATH", "")]))
    common = ["--quiet", "--set", f"run.state_file={state}", "--set", "plan.epochs=4"]
    # Rank 1 decodes slowly, so the others run ahead of it and the ranks stop at different steps.
    code, err = sigterm_mpirun(RESUME_LAYOUTS[first], ["run", job, "--record", str(tmp_path / "rec1"), *common,
                                                       "--set", "run.compute_ms=40",
                                                       "--set", "dataset.loader=faults:slow_on_rank_1"],
                               tmp_path, env, tmp_path / "rec1")
    assert code == 128 + signal.SIGTERM, err
    assert "stopped; the job resumes from epoch" in err
    assert sorted(p.name for p in tmp_path.glob("state.json*")) == ["state.json"], "one state file, written once"
    saved = json.loads(state.read_text())
    agreed = plan.Position(saved["epoch"], saved["position"])
    assert agreed.epoch < 4, "stopped mid-way"
    assert_nothing_left(tmp_path, job)

    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=8, epochs=4, seed=7)
    size1 = sum(r for _, r in RESUME_LAYOUTS[first])
    reads1, _ = read_records(tmp_path / "rec1")
    before = {}  # per rank: what the first run read up to the agreed position
    reached = []
    for r, lines in reads1.items():
        planned = list(plan.iterate(SAMPLES, cfg, rank=r, size=size1))
        assert [x["samples"] for x in lines] == [[catalog.path(i) for i in m.indices] for m in planned[:len(lines)]]
        position = plan.Position()
        for m in planned[:len(lines)]:
            position = position.after(m)
            if (position.epoch, position.consumed) <= (agreed.epoch, agreed.consumed):
                before.setdefault(r, []).append(m)
        reached.append(position)
    assert min(reached, key=lambda p: (p.epoch, p.consumed)) == agreed, "the position is the smallest any rank reached"

    second_run = mpirun(RESUME_LAYOUTS[second], ["run", job, "--record", str(tmp_path / "rec2"), *common], tmp_path,
                        env=env)
    assert second_run.returncode == 0, second_run.stderr
    assert not list(tmp_path.glob("state.json*")), "a completed run removes its state"
    size2 = sum(r for _, r in RESUME_LAYOUTS[second])
    reads2, _ = read_records(tmp_path / "rec2")
    assert sorted(reads2) == list(range(size2))
    assert len({len(lines) for lines in reads2.values()}) == 1, "every rank takes the same number of steps"
    for r, lines in reads2.items():
        expected = [(m.epoch, m.step, [catalog.path(i) for i in m.indices])
                    for m in plan.iterate(SAMPLES, cfg, agreed.epoch, agreed.consumed, rank=r, size=size2)]
        assert [(x["epoch"], x["step"], x["samples"]) for x in lines] == expected
    for epoch in range(4):
        union = Counter([catalog.path(i) for ms in before.values() for m in ms if m.epoch == epoch for i in m.indices]
                        + [p for lines in reads2.values() for x in lines if x["epoch"] == epoch for p in x["samples"]])
        assert sorted(union) == sorted(catalog.paths()) and set(union.values()) == {1}, \
            f"epoch {epoch}: the two runs together read every sample exactly once"
    assert_nothing_left(tmp_path, job)


@pytest.mark.parametrize("fault", ["fail", "kill"])
def test_a_job_ended_by_one_rank_keeps_the_records_of_every_delivered_minibatch(tmp_path, fault):
    job = write_job(tmp_path)
    rec = tmp_path / "rec"
    env = dict(os.environ, STAGER_TEST_RECORDS=str(rec), STAGER_TEST_FAULT=fault, PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "tests", "helpers"), os.environ.get("PYTHONPATH", "")]))
    state = tmp_path / "state.json"
    proc = mpirun(LAYOUTS["4 ranks on 2 nodes"],
                  ["run", job, "--quiet", "--record", str(rec),
                   "--set", "dataset.loader=faults:hold_then_fail_on_rank_2", "--set", "reader.workers=1", "--set", "staging.prefetchers=2", "--set", "plan.epochs=0", "--set", f"run.state_file={state}"],
                  tmp_path, timeout=120, env=env)
    assert proc.returncode != 0
    if fault == "fail":
        assert "injected failure on rank 2" in proc.stderr and "aborting the MPI job" in proc.stderr
    catalog = Catalog.from_manifest(str(tmp_path / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=8, epochs=0, seed=7)
    reads, staged = read_records(rec)
    for r in range(4):
        planned = [[catalog.path(i) for i in m.indices] for m, _ in zip(plan.iterate(SAMPLES, cfg, rank=r, size=4),
                                                                         range(2))]
        # Each rank's one reader decoded two minibatches and held (or failed) in the third.
        assert [x["samples"] for x in reads.get(r, [])] == planned, f"rank {r}'s delivered minibatches"
    for node, ranks in (("a", (0, 1)), ("b", (2, 3))):
        delivered = {p for r in ranks for x in reads[r] for p in x["samples"]}
        assert delivered <= {f["path"] for f in staged[node]}, f"node {node}'s staged files of those minibatches"
    # The ranks agreed after each step; the job ended before or after rank 0 wrote the second agreement.
    saved = json.loads(state.read_text())
    assert saved["epoch"] == 0 and saved["position"] in (4 * 8, 2 * 4 * 8)
    # A kill can cut rank 0's write of the next one short: its temporary file stays, the state is whole.
    assert sorted(p.name for p in tmp_path.glob("state.json*")) in (["state.json"], ["state.json", "state.json.part"])
    assert_nothing_left(tmp_path, job)


def kill_job(proc, close=True):
    """Ends a job that outlived its test: its ranks first (one stuck in MPI_Init ignores mpiexec's end), then mpiexec."""
    if proc.poll() is None:
        for pid in rank_pids(proc.pid).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    if close and proc.stderr is not None:
        proc.stderr.close()


def watchdog(proc, seconds=120):
    """A started timer that ends the job after ``seconds``: a job that never prints must not hang its test."""
    timer = threading.Timer(seconds, kill_job, [proc, False])
    timer.daemon = True
    timer.start()
    return timer


def rank_pids(mpiexec):
    """``{rank: pid}`` of the ranks of the job ``mpiexec`` (a pid) started: its proxies' children, by ``PMI_RANK``."""
    ranks = {}
    for proxy in child_pids(mpiexec) if os.path.exists(f"/proc/{mpiexec}") else ():
        for pid in child_pids(proxy):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    env = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
            except OSError:  # gone meanwhile
                continue
            ranks[int(env[b"PMI_RANK"])] = pid
    return ranks


def test_sigterm_to_one_rank_stops_every_rank_at_one_agreed_step(tmp_path):
    job = write_job(tmp_path)
    state = tmp_path / "state.json"
    cmd = [MPIEXEC, "-n", "2", "-env", "STAGER_NODE_ID", "a", sys.executable, "-m", "stager", "run", job,
           "--record", str(tmp_path / "rec"), "--set", f"run.state_file={state}", "--set", "plan.epochs=20",
           "--set", "run.compute_ms=40"]
    os.makedirs(tmp_path / "rec")
    with open(tmp_path / "mpiexec.err", "w+") as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors, text=True,
                                env=dict(os.environ, TMPDIR=str(tmp_path)))
        timer = watchdog(proc)
        try:
            # Rank 0 has recorded two steps: the ranks are in their loops.
            assert wait_for_lines(tmp_path / "rec" / "rank-0.jsonl", 2, proc.pid)
            os.kill(rank_pids(proc.pid)[1], signal.SIGTERM)  # rank 1 alone, as a stray kill would
            code = proc.wait(timeout=120)
        finally:
            timer.cancel()
            kill_job(proc)
        errors.seek(0)
        err = errors.read()
    assert code == 128 + signal.SIGTERM, err
    saved = json.loads(state.read_text())
    reads, _ = read_records(tmp_path / "rec")
    steps = [len(reads[r]) for r in (0, 1)]
    # Rank 0 learnt of the stop at the next agreement (after each step), so it went at most one step further.
    assert saved["epoch"] < 20 and 0 < min(steps) and max(steps) - min(steps) <= 1, steps
    planned = list(plan.iterate(SAMPLES, PlanConfig(batch_size=8, epochs=20, seed=7), rank=0, size=2))
    after = plan.Position().after(planned[min(steps) - 1])
    assert (saved["epoch"], saved["position"]) == (after.epoch, after.consumed), "the step both ranks reached"
    assert_nothing_left(tmp_path, job)
