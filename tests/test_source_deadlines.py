"""Every read of the source has a deadline, whichever path touches it first (the emulator at 600 s an open).

The prefetchers' stall board is tested in ``test_stalls.py``; here the reads
made before staging starts: the manifest and the catalog file on rank 0
(and the other ranks waiting in its broadcast), the probe of ``auto``
counts, and a run whose prefetchers then stall, as a user meets them from
the command line and under MPI.
"""

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, stager_cmd

from stager.catalog import Catalog, write_catalog
from stager.job.synth import make_dataset
from stager.slowfs import SlowFS
from stager.sources.deadline import Deadline, SourceStalled, reading

HUNG_MS = 600_000
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


@pytest.fixture
def hung(tmp_path):
    """A dataset of 40 samples, and the same tree behind the emulator whose opens never return (a hung server)."""
    data = tmp_path / "data"
    make_dataset(str(data), 40, nbytes=2000, classes=2, seed=1, progress=False)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with SlowFS(str(data), str(mnt), open_ms=HUNG_MS) as mounted:
        yield str(data), mounted


def job(tmp_path, source, **dataset):
    lines = [f"  {k}: {v}" for k, v in {"source": source, **dataset}.items()]
    path = tmp_path / "job.yaml"
    path.write_text("dataset:\n" + "\n".join(lines) + f"""
plan: {{batch_size: 4, epochs: 1}}
staging: {{local_dir: {tmp_path / 'local'}, prefetchers: 2, stall_timeout_s: 2}}
processes: {{shutdown_timeout_s: 2}}
""")
    return str(path)


def run(tmp_path, config, launcher=None, timeout=120):
    """``stager run CONFIG`` (or the ``launcher`` command line); its process and seconds."""
    begin = time.monotonic()
    proc = subprocess.run(launcher or stager_cmd("run", config, "--quiet"), capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=REPO))
    return proc, time.monotonic() - begin


def stalled(what, path, stderr):
    return re.search(rf"{what} {re.escape(path)} has not returned after [2-9] s, more than "
                     r"staging.stall_timeout_s = 2: the source does not answer", stderr)


def test_a_manifest_on_a_hung_source_ends_the_run_naming_it(tmp_path, hung):
    _, mnt = hung
    proc, took = run(tmp_path, job(tmp_path, mnt, manifest="manifest.tsv"))
    assert proc.returncode == 2, proc.stderr
    assert stalled("open", os.path.join(mnt, "manifest.tsv"), proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 2 + 1 + 15, took  # the limit, a second to notice, and the exit
    assert not (tmp_path / "local").exists() or os.listdir(tmp_path / "local") == []


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec (install .[mpich])")
def test_under_mpi_every_rank_leaves_when_rank_0_stalls_on_the_source(tmp_path, hung):
    # Two emulated nodes of two ranks: rank 0 lists the source and the others wait in its broadcast.
    _, mnt = hung
    config = job(tmp_path, mnt, manifest="manifest.tsv")
    rank = [sys.executable, "-m", "stager", "run", config, "--quiet"]
    launcher = [MPIEXEC, "-n", "2", "-env", "STAGER_NODE_ID", "a", *rank, ":", "-n", "2", "-env", "STAGER_NODE_ID",
                "b", *rank]
    proc, took = run(tmp_path, config, launcher)
    assert proc.returncode != 0
    assert stalled("open", os.path.join(mnt, "manifest.tsv"), proc.stderr), proc.stderr
    assert took < 2 + 1 + 30, took
    left = subprocess.run(["pgrep", "-f", f"stager run {config}"], capture_output=True, text=True)
    assert not left.stdout.strip(), "ranks outlived the job"


def test_a_catalog_file_on_a_hung_source_ends_the_run_naming_it(tmp_path, hung):
    data, mnt = hung
    write_catalog(Catalog.from_manifest(data, "manifest.tsv"), os.path.join(data, "catalog.bin"))
    proc, _ = run(tmp_path, job(tmp_path, mnt, catalog=os.path.join(mnt, "catalog.bin")))
    assert proc.returncode == 2
    assert stalled("open", os.path.join(mnt, "catalog.bin"), proc.stderr), proc.stderr


def test_the_probe_of_auto_counts_on_a_hung_source_ends_the_start_naming_a_file(tmp_path, hung):
    data, mnt = hung
    config = job(tmp_path, mnt, manifest=os.path.join(data, "manifest.tsv"))  # the listing is local: the probe opens
    with open(config, "a") as fh:
        fh.write("reader: {workers: auto}\n")
    proc, _ = run(tmp_path, config)
    assert proc.returncode == 2
    assert re.search(rf"open {re.escape(mnt)}/c00\d/\d+\.npy has not returned after [2-9] s", proc.stderr), proc.stderr


def test_a_run_whose_listing_is_local_then_fails_in_its_prefetchers(tmp_path, hung):
    # The case: the manifest on local disk, the samples behind the hung mount. Counts set: with
    # auto ones the start's probe meets the hung source first (the test above).
    data, mnt = hung
    config = job(tmp_path, mnt, manifest=os.path.join(data, "manifest.tsv"))
    with open(config, "a") as fh:
        fh.write("reader: {workers: 2}\n")
    proc, took = run(tmp_path, config)
    assert proc.returncode == 2
    assert re.search(r"stager-prefetch-\d \(pid \d+\) has waited [2-9] s for " + re.escape(mnt), proc.stderr)
    assert took < 2 + 1 + 2 + 6 + 10, took


def _helpers():
    return {t for t in threading.enumerate() if t.name == "stager-source-read"}


def _opened(path, idents=None):
    """Reads ``path`` as a source read, noting which thread read it."""
    with reading("open", path):
        if idents is not None:
            idents.append(threading.current_thread())  # not its ident: an ended thread's is reused
        with open(path, "rb") as fh:
            return fh.read()


def test_a_deadline_runs_call_after_call_on_one_helper_and_close_ends_it(tmp_path):
    # A peer fetch falling back to the source reads file after file under one deadline: one thread, not one a file.
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    before, idents = _helpers(), []
    with Deadline(5) as deadline:
        assert all(deadline.run(_opened, str(path), idents) == b"x" * 100 for _ in range(200))
        mine = _helpers() - before
        assert len(set(idents)) == 1 and len(mine) == 1, (len(set(idents)), mine)
        assert threading.current_thread() not in idents
    for helper in mine:
        helper.join(timeout=5)
        assert not helper.is_alive(), "close() must end the idle helper"


def test_concurrent_callers_each_get_their_result_and_helpers_stay_as_many_as_callers(tmp_path):
    paths = []
    for i in range(8):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(bytes([i]) * (1000 + i))
    before, idents = _helpers(), []
    errors, results = [], {}
    deadline = Deadline(5)
    start = threading.Barrier(4)

    def caller(k):
        try:
            start.wait()
            for n in range(50):
                i = (k + n) % len(paths)
                results[(k, n)] = deadline.run(_opened, str(paths[i]), idents) == bytes([i]) * (1000 + i)
        except BaseException as exc:
            errors.append(exc)

    callers = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=30)
    made = _helpers() - before
    deadline.close()
    assert not errors, errors
    assert len(results) == 200 and all(results.values())
    assert 1 <= len(set(idents)) <= 4 and len(made) <= 4, (len(set(idents)), len(made))
    for helper in made:
        helper.join(timeout=5)
        assert not helper.is_alive()


def test_a_read_past_the_deadline_raises_and_its_helper_is_not_reused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"y" * 10)
    release, entered, idents = threading.Event(), threading.Event(), []

    def hung_read():
        with reading("open", str(path)):
            idents.append(threading.current_thread())
            entered.set()
            release.wait(30)
        return b"late"

    deadline = Deadline(0.5)
    before = _helpers()
    with pytest.raises(SourceStalled, match=r"open .*/f has not returned after \d s, more than "
                                            r"staging.stall_timeout_s = 0.5"):
        deadline.run(hung_read)
    stuck = _helpers() - before
    assert entered.is_set() and len(stuck) == 1
    release.set()  # the file system answers: the helper left in the read ends, and runs nothing more
    for helper in stuck:
        helper.join(timeout=5)
        assert not helper.is_alive()
    assert deadline.run(_opened, str(path), idents) == b"y" * 10
    assert idents[0] is not idents[1] and idents[0] in stuck
    deadline.close()


def test_a_forked_child_runs_its_calls_on_a_helper_of_its_own(tmp_path):
    # The parent's idle helper is not in the child: using it would wait for ever.
    path = tmp_path / "f"
    path.write_bytes(b"z" * 10)
    deadline = Deadline(5)
    assert deadline.run(_opened, str(path)) == b"z" * 10
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write_end, deadline.run(_opened, str(path)))
        finally:
            os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 20)
    try:
        assert ready, "the child's call never returned"
        assert os.read(read_end, 100) == b"z" * 10
    finally:
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.close(read_end)
        os.waitpid(pid, 0)
        deadline.close()
