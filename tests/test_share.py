"""Separate ``stager run`` launches on one node sharing a group's staging service (``staging.share``).

Each job is its own process tree, started as a user would; the service is
the process the first job starts. The source is the real FUSE emulator; an
inotify watch on its backing tree counts every open of a sample file by
anyone, and the test loader logs every decode call and checks each staged
file's bytes against a copy of the source.
"""

import collections
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import uuid

import pytest

from conftest import REPO, stager_cmd
from helpers.opens import Opens
from helpers.watch import lines_in, still_running, wait_for_lines
from stager import plan
from stager.catalog import Catalog
from stager.config import PlanConfig
from stager.job.synth import make_dataset
from stager.slowfs import SlowFS
from test_mpi_run import MPIEXEC, processes_mentioning

SAMPLES, BATCH, EPOCHS = 96, 8, 3


@pytest.fixture
def group(tmp_path):
    """A dataset behind the emulator (2 ms an open), a copy to check bytes against, and a fresh group name."""
    data = tmp_path / "data"
    make_dataset(str(data), SAMPLES, nbytes=4096, classes=4, seed=5, progress=False)
    shutil.copytree(data, tmp_path / "copy")
    (tmp_path / "mnt").mkdir()
    (tmp_path / "local").mkdir()
    (tmp_path / "decodes").mkdir()
    name = f"t{uuid.uuid4().hex[:10]}"
    g = {"tmp": tmp_path, "name": name, "procs": []}
    with SlowFS(str(data), str(tmp_path / "mnt"), open_ms=2.0, mbps=0) as mounted:
        g["source"] = mounted
        try:
            yield g
        finally:
            for proc in g["procs"]:  # a test that failed half way
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGCONT)
                    proc.kill()
                proc.communicate()
    for pid in processes_mentioning(name):  # a test that failed half way: its service must not outlive it
        os.kill(pid, signal.SIGKILL)


def write_job(g, label, seed=1, compute_ms=60, window=1000, readers=2, **staging):
    staging = {"local_dir": str(g["tmp"] / "local"), "prefetchers": 2, "lookahead": 4, "share": g["name"],
               "share_window": window, **staging}
    path = g["tmp"] / f"{label}.yaml"
    path.write_text(f"""
dataset: {{source: {g['source']}, manifest: manifest.tsv, loader: "groupchecks:counted"}}
plan: {{batch_size: {BATCH}, epochs: {EPOCHS}, seed: {seed}}}
staging: {json.dumps(staging)}
reader: {{workers: {readers}}}
run: {{compute_ms: {compute_ms}}}
processes: {{shutdown_timeout_s: 10}}
""")
    return str(path)


def start(g, label, ranks=0, env=None, **job):
    """Starts ``stager run`` alone, or under ``mpiexec -n RANKS`` (one emulated node).

    Args:
        env: More environment for this job alone (the loader's hold, ``groupchecks.counted``).
    """
    rec = g["tmp"] / f"rec-{label}"
    rec.mkdir()
    env = dict(os.environ, TMPDIR=str(g["tmp"]), STAGER_TEST_COPY=str(g["tmp"] / "copy"),
               STAGER_TEST_DECODES=str(g["tmp"] / "decodes"),
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "helpers"), os.environ.get("PYTHONPATH", REPO)]),
               **(env or {}))
    cmd = stager_cmd("run", write_job(g, label, **job), "--quiet", "--record", str(rec), "--report", str(rec / "r.json"))
    if ranks:
        cmd = [MPIEXEC, "-n", str(ranks), "-env", "STAGER_NODE_ID", "a", *cmd]
    proc = subprocess.Popen(cmd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: the test may stop it whole
    proc.rec = rec
    g["procs"].append(proc)
    return proc


def start_staggered(g, labels, **job):
    """Starts one job per label, each once the one before has delivered its first minibatch."""
    procs = []
    for label in labels:
        if procs:
            assert wait_for_lines(str(procs[-1].rec / "rank-0.jsonl"), 1, pid=procs[-1].pid), \
                procs[-1].communicate()[1]
        procs.append(start(g, label, **job))
    return procs


def finish(proc, timeout=180):
    out, err = proc.communicate(timeout=timeout)
    proc.stderr_text = err
    assert proc.returncode == 0, out + err
    return json.loads((proc.rec / "r.json").read_text())


def records(proc, rank=0):
    return [json.loads(line) for line in open(proc.rec / f"rank-{rank}.jsonl")]


def expected_order(g, seed, rank=0, size=1):
    catalog = Catalog.from_manifest(str(g["tmp"] / "data"), "manifest.tsv")
    cfg = PlanConfig(batch_size=BATCH, epochs=EPOCHS, seed=seed)
    return [[catalog.name(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=rank, size=size)]


def decode_calls(g):
    calls = collections.Counter()
    for path in glob.glob(str(g["tmp"] / "decodes" / "*")):
        calls.update(line.strip() for line in open(path))
    return calls


def service_pids(g):
    return [pid for pid in processes_mentioning(g["name"]) if pid != os.getpid()]


def assert_service_gone(g, timeout=30):
    """The group's service ends with its last job and leaves no directory behind."""
    late = still_running(service_pids(g), timeout)
    assert not late, f"the group's service (pids {late}) outlived its jobs"
    assert os.listdir(g["tmp"] / "local") == [], "the group left staged files behind"
    assert not glob.glob(f"/dev/shm/stager-share-{os.getuid()}-{g['name']}-*"), "the group left its shelf behind"


def test_four_jobs_read_each_file_once_and_decode_each_minibatch_once(group):
    with Opens(group["tmp"] / "data") as opens:
        procs = start_staggered(group, ["a", "b", "c", "d"])
        reports = [finish(p) for p in procs]
        assert_service_gone(group)
        read = {path: n for path, n in opens.count().items() if path.endswith(".npy")}
    catalog = Catalog.from_manifest(str(group["tmp"] / "data"), "manifest.tsv")
    assert sorted(read) == sorted(catalog.paths()) and set(read.values()) == {1}, \
        "each file must be read from the shared file system once for the four jobs"
    order = expected_order(group, seed=1)
    for proc in procs:  # each sample once per epoch, in plan order (the loader checked the bytes)
        assert [r["samples"] for r in records(proc)] == order
    calls = decode_calls(group)
    assert sum(calls.values()) == SAMPLES * EPOCHS and set(calls.values()) == {EPOCHS}, \
        "four jobs with the same order and loader decode as much as one"
    groups = [r["group"] for r in reports]
    assert sum(g["files_fetched"] for g in groups) == SAMPLES
    assert sum(g["batches_published"] for g in groups) == len(order)
    steps = [g["batches_from_group"] + g["batches_published"] for g in groups]
    assert steps == [len(order)] * 4, "every minibatch was decoded by its job or taken from the group"
    for g in groups[1:]:
        assert g["files_from_group"] > 0 and g["batches_from_group"] > 0
    shown = subprocess.run(stager_cmd("report", str(procs[1].rec / "r.json")), capture_output=True, text=True,
                           check=True).stdout
    assert f"{groups[1]['files_from_group']} files" in shown and "source reads the group saved it" in shown
    for proc, g in zip(procs, groups):  # what the others' decoding spared each job, in its report
        shown = subprocess.run(stager_cmd("report", str(proc.rec / "r.json")), capture_output=True, text=True,
                               check=True).stdout
        if g["batches_from_group"]:
            assert g["decoding_spared_s"] > 0
            assert (f"decoding the {g['samples_from_group']} samples the others decoded for this job took their "
                    f"readers {g['decoding_spared_s']:.1f} s") in shown, shown
        else:
            assert g["decoding_spared_s"] == 0 and "the others decoded for this job" not in shown


COUNTS = re.compile(r"stager: auto counts( \(the group's, (\d+) jobs\))?: (\d+) prefetchers x (\d+) files in flight, "
                    r"(\d+) readers (\(probe: .*\))")


@pytest.mark.parametrize("jobs", [2, 4])
def test_jobs_on_the_defaults_probe_once_for_the_group_and_read_each_file_once(group, jobs):
    # Nothing set but the group: ``auto`` counts, files in flight, look-ahead. The first job probes the
    # plan's first files into the group's directory; every later one takes the group's measurements.
    labels = "abcd"[:jobs]
    defaults = {"prefetchers": "auto", "lookahead": "auto", "readers": "auto"}
    with Opens(group["tmp"] / "data") as opens:
        procs = start_staggered(group, labels, **defaults)
        reports = [finish(p) for p in procs]
        assert_service_gone(group)
        read = {path: n for path, n in opens.count().items() if path.endswith(".npy")}
    catalog = Catalog.from_manifest(str(group["tmp"] / "data"), "manifest.tsv")
    assert sorted(read) == sorted(catalog.paths()) and set(read.values()) == {1}, \
        f"{sum(read.values())} opens of {len(read)} files: each once for the {jobs} jobs, the probe's included"
    said = [COUNTS.search(p.stderr_text) for p in procs]
    assert all(said), [p.stderr_text for p in procs]
    assert said[0].group(1) is None and all(m.group(1) for m in said[1:]), "the joiners take the group's counts"
    assert {m.group(6) for m in said} == {said[0].group(6)}, "one probe's measurements for the whole group"
    for m, report in zip(said, reports):
        start_counts = report["counts_timeline"][0]
        assert (start_counts["prefetchers"], start_counts["in_flight"]) == (int(m.group(3)), int(m.group(4)))
    for k, m in enumerate(said[1:], 2):  # the k-th finds the group with itself and at most k - 1 others
        attached = int(m.group(2))
        assert 2 <= attached <= k and int(m.group(5)) == max(1, int(said[0].group(5)) // attached), \
            "a joiner's readers are its share of one job's: the group decodes each minibatch once"
    order = expected_order(group, seed=1)
    for proc in procs:
        assert [r["samples"] for r in records(proc)] == order
    assert sum(r["group"]["files_fetched"] for r in reports) == SAMPLES


def test_jobs_started_at_once_on_the_defaults_probe_once(group):
    # No service runs when they start: one job at a time holds the group's founding claim, so one
    # probes and starts the service, and the others wait for it and take its measurements.
    defaults = {"prefetchers": "auto", "lookahead": "auto", "readers": "auto"}
    with Opens(group["tmp"] / "data") as opens:
        procs = [start(group, label, **defaults) for label in "abc"]
        for proc in procs:
            finish(proc)
        assert_service_gone(group)
        read = {path: n for path, n in opens.count().items() if path.endswith(".npy")}
    assert len(read) == SAMPLES and set(read.values()) == {1}, f"{sum(read.values())} opens of {len(read)} files"
    said = [COUNTS.search(p.stderr_text) for p in procs]
    assert all(said) and sum(m.group(1) is None for m in said) == 1, [p.stderr_text for p in procs]
    assert len({m.group(6) for m in said}) == 1
    for proc in procs:
        assert [r["samples"] for r in records(proc)] == expected_order(group, seed=1)


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC} (install .[mpich])")
def test_two_mpi_jobs_of_two_ranks_share_files_and_decoding_rank_by_rank(group):
    """Under mpiexec every rank attaches on its own; rank r of one job and rank r of the other
    read the same stream, so each minibatch is decoded once.

    Job a is held inside a minibatch (its loader waits on a FIFO) until job b's first minibatch came,
    so b attaches to a's running service however long two ranks take to start: an event decides it,
    not the length of a step. b takes a's earlier minibatches from the shelf; the held one is
    published as soon as a goes on, about a second before b would stop waiting for it."""
    held = expected_order(group, 1, rank=0, size=2)[5][0]  # in rank 0's last minibatch of epoch 1: its first use
    fifo = str(group["tmp"] / "hold")
    os.mkfifo(fifo)
    hold = None
    try:
        with Opens(group["tmp"] / "data") as opens:
            a = start(group, "a", ranks=2, env={"STAGER_TEST_HOLD": fifo, "STAGER_TEST_HOLD_AT": held})
            assert wait_for_lines(str(a.rec / "rank-0.jsonl"), 1, pid=a.pid), a.communicate()[1]
            b = start(group, "b", ranks=2)
            assert wait_for_lines(str(b.rec / "rank-0.jsonl"), 1, pid=b.pid), b.communicate()[1]
            assert lines_in(str(a.rec / "rank-0.jsonl")) <= 5, "job a was not held"
            hold = os.open(fifo, os.O_RDWR)  # a writer: a's held decoding goes on
            reports = [finish(p) for p in (a, b)]
            assert_service_gone(group)
            read = {path: n for path, n in opens.count().items() if path.endswith(".npy")}
    finally:
        os.close(hold if hold is not None else os.open(fifo, os.O_RDWR))  # never leave a reader held
    assert len(read) == SAMPLES and set(read.values()) == {1}
    for proc in (a, b):
        for rank in (0, 1):
            assert [r["samples"] for r in records(proc, rank)] == expected_order(group, 1, rank, 2)
    calls = decode_calls(group)
    assert sum(calls.values()) == SAMPLES * EPOCHS, "two jobs of two ranks decode as much as one"
    assert reports[1]["group"]["batches_from_group"] > 0 and reports[1]["world_size"] == 2


def test_jobs_with_other_seeds_share_files_but_not_decoding(group):
    with Opens(group["tmp"] / "data") as opens:
        procs = start_staggered(group, ["a", "b"], seed=1) + start_staggered(group, ["c"], seed=2)
        reports = [finish(p) for p in procs]
        assert_service_gone(group)
        read = {path: n for path, n in opens.count().items() if path.endswith(".npy")}
    assert len(read) == SAMPLES and set(read.values()) == {1}
    for proc, seed in zip(procs, (1, 1, 2)):
        assert [r["samples"] for r in records(proc)] == expected_order(group, seed)
    calls = decode_calls(group)
    assert sum(calls.values()) == 2 * SAMPLES * EPOCHS, "seed 2 decodes for itself; seeds 1 decode once"
    assert reports[2]["group"]["batches_from_group"] == 0 and reports[2]["group"]["files_from_group"] > 0


@pytest.mark.parametrize("counts", ["fixed", "defaults"])
def test_a_job_killed_mid_epoch_leaves_the_others_whole(group, counts):
    settings = {"prefetchers": "auto", "lookahead": "auto", "readers": "auto"} if counts == "defaults" else {}
    with Opens(group["tmp"] / "data") as opens:
        procs = start_staggered(group, ["a", "b", "c"], compute_ms=80, **settings)
        victim = procs[1]
        assert wait_for_lines(str(victim.rec / "rank-0.jsonl"), 5, pid=victim.pid)
        victim.kill()  # SIGKILL: no goodbye, its readers and connections just go
        victim.communicate()
        for proc in (procs[0], procs[2]):
            finish(proc)
            assert [r["samples"] for r in records(proc)] == expected_order(group, seed=1)
        assert_service_gone(group)
        late = still_running(processes_mentioning(str(victim.rec)), 30)  # its readers follow their parent
        assert not late, f"readers of the killed job (pids {late}) live on"
        read = {path: n for path, n in opens.count().items() if path.endswith(".npy")}
    assert len(read) == SAMPLES and set(read.values()) == {1}


def test_a_stopped_job_does_not_hold_the_others_back(group):
    """Job a is frozen (SIGSTOP to its whole process group) with minibatches it claimed to decode:
    b waits for them only a few times the usual decoding, decodes them itself and finishes."""
    a, b = start_staggered(group, ["a", "b"], compute_ms=60)
    assert wait_for_lines(str(b.rec / "rank-0.jsonl"), 3, pid=b.pid)
    os.killpg(a.pid, signal.SIGSTOP)
    try:
        report_b = finish(b, timeout=120)
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    report_a = finish(a)
    order = expected_order(group, seed=1)
    assert [r["samples"] for r in records(a)] == order and [r["samples"] for r in records(b)] == order
    for report in (report_a, report_b):
        g = report["group"]
        assert g["samples_decoded"] + g["samples_from_group"] == SAMPLES * EPOCHS
    assert report_b["group"]["samples_decoded"] > 0
    assert_service_gone(group)


def test_a_job_with_conflicting_settings_is_refused_naming_the_setting(group):
    first = start(group, "a", compute_ms=80)
    assert wait_for_lines(str(first.rec / "rank-0.jsonl"), 1, pid=first.pid), first.communicate()[1]
    second = start(group, "b", prefetchers=3)
    out, err = second.communicate(timeout=120)
    assert second.returncode != 0
    assert "staging.prefetchers" in err and "= 2" in err and "has 3" in err, err
    finish(first)
    assert [r["samples"] for r in records(first)] == expected_order(group, seed=1)
    assert_service_gone(group)


def test_the_service_serves_its_own_user_only(group):
    """A process of another user is hung up on; the group's directories are 0700."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    first = start(group, "a", compute_ms=80)
    assert wait_for_lines(str(first.rec / "rank-0.jsonl"), 1, pid=first.pid), first.communicate()[1]
    (shelf,) = glob.glob(f"/dev/shm/stager-share-{os.getuid()}-{group['name']}-*")
    (local,) = os.listdir(group["tmp"] / "local")
    assert os.stat(shelf).st_mode & 0o777 == 0o700
    assert os.stat(group["tmp"] / "local" / local).st_mode & 0o777 == 0o700
    probe = subprocess.run([os.sys.executable, "-c", f"""
import os, multiprocessing.connection as mpc
from stager.engine.messages import Join
os.setgid(65534); os.setuid(65534)
conn = mpc.Client("\\0stager-share-0-{group['name']}", family="AF_UNIX")
try:
    conn.send(Join("intruder rank 0", {{}}))
    print("answered", conn.recv())
except (EOFError, OSError):
    print("hung up")
"""], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert probe.stdout.strip() == "hung up", probe.stdout + probe.stderr
    finish(first)
    assert_service_gone(group)
