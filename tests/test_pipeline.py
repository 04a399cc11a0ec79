"""The three-stage pipeline on the real FUSE slow file system."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading

import h5py
import numpy as np
import pytest
from conftest import REPO, child_pids, load_catalog, make_config, stager_workers

from stager import plan
from stager.engine import Pipeline
from stager.errors import StageError
from stager.job.synth import make_dataset


def expected_sequence(cfg, n):
    return [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(n, cfg.plan)]


def delivered(cfg, **kwargs):
    catalog = load_catalog(cfg)
    seen, payload = [], []
    with Pipeline(cfg, catalog, **kwargs) as pipe:
        for batch in pipe:
            seen.append((batch.epoch, batch.step, batch.indices.tolist()))
            payload.append(batch.samples)
        stats = pipe.stats
        local = pipe.local_dir
    return catalog, seen, payload, stats, local


@pytest.mark.parametrize("prefetchers,readers", [(1, 1), (8, 1), (1, 4), (8, 4)])
def test_every_sample_once_per_epoch_in_plan_order_with_source_bytes(
        slow_source, dataset, tmp_path, prefetchers, readers):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 2},
                      dataset={"loader": "raw"},
                      staging={"prefetchers": prefetchers, "lookahead": 3}, reader={"workers": readers})
    catalog, seen, payload, stats, local = delivered(cfg)
    assert seen == expected_sequence(cfg, len(catalog))
    for epoch in (0, 1):
        flat = [i for e, _, idx in seen if e == epoch for i in idx]
        assert sorted(flat) == list(range(len(catalog)))
    root, _ = dataset
    for (_, _, idx), samples in zip(seen, payload):
        for i, (data, label) in zip(idx, samples):
            with open(os.path.join(root, catalog.path(i)), "rb") as fh:
                assert data == fh.read()
            assert label == catalog.label(i)
    # Each file is copied once; the second epoch reads the staged copies.
    assert stats.files_staged == len(catalog)
    assert stats.bytes_staged == catalog.total_bytes
    assert stats.batches == len(seen) and stats.samples == 2 * len(catalog)
    assert not os.path.exists(local), "the job's staging directory must be removed at close"


def test_direct_mode_delivers_the_same_sequence_and_stages_nothing(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", staging={"enabled": False}, reader={"workers": 3})
    catalog, seen, payload, stats, local = delivered(cfg)
    assert seen == expected_sequence(cfg, len(catalog))
    assert stats.files_staged == 0 and local is None
    assert not os.path.exists(tmp_path / "local")
    sample, label = payload[0][0]
    assert np.array_equal(sample, np.load(os.path.join(catalog.root, catalog.path(seen[0][2][0]))))


def test_spawn_start_method_gives_the_same_sequence(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", processes={"start_method": "spawn"},
                      plan={"drop_last": True, "shuffle": False})
    catalog, seen, *_ = delivered(cfg)
    assert seen == expected_sequence(cfg, len(catalog))
    assert len(seen) == len(catalog) // 8


def test_resume_from_a_position_continues_the_plan(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 2})
    catalog, seen, *_ = delivered(cfg, start=(1, 3 * 8))
    full = expected_sequence(cfg, len(catalog))
    assert seen == full[full.index(next(x for x in full if x[:2] == (1, 3))):]


def test_close_mid_epoch_leaves_no_process_and_no_directory(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", staging={"prefetchers": 3})
    pipe = Pipeline(cfg)
    it = iter(pipe)
    first = next(it)
    next(it)
    pids = stager_workers()
    assert len(pids) == 3 + 2 and set(pids) <= child_pids()
    local = pipe.local_dir
    assert os.path.isdir(local) and (os.stat(local).st_mode & 0o777) == 0o700
    assert os.path.exists(os.path.join(local, pipe.catalog.path(first.indices[0])))
    pipe.close()
    pipe.close()  # idempotent
    assert not set(pids) & child_pids()
    assert not os.path.exists(local)
    with pytest.raises(StopIteration):
        next(it)


def failing_loader(path):
    if path.endswith("/" + FAIL_ON[0]):
        raise ValueError("corrupt sample")
    return np.load(path)


FAIL_ON = [""]


def test_loader_error_reaches_the_caller_with_its_context(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local")
    catalog = load_catalog(cfg)
    epoch_batches = plan.epoch_minibatches(len(catalog), 8, seed=3, epoch=0)
    victim = int(epoch_batches[2][5])
    FAIL_ON[0] = catalog.path(victim)  # inherited by the forked readers
    pipe = Pipeline(cfg, catalog, loader=failing_loader)
    got = []
    with pytest.raises(StageError) as info:
        with pipe:
            for batch in pipe:
                got.append(batch.step)
    err = info.value
    assert (err.stage, err.epoch, err.step, err.path, err.cause) == ("read", 0, 2, catalog.path(victim), "ValueError")
    assert "corrupt sample" in str(err) and "failing_loader" in err.remote_traceback
    assert got == [0, 1]
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


def test_source_file_vanishing_after_the_catalog_names_the_file(tmp_path):
    root = str(tmp_path / "data")
    make_dataset(root, 20, nbytes=2048, progress=False)
    cfg = make_config(root, tmp_path / "local", plan={"shuffle": False, "batch_size": 4})
    catalog = load_catalog(cfg)
    os.unlink(os.path.join(root, catalog.path(13)))
    pipe = Pipeline(cfg, catalog)
    with pytest.raises(StageError) as info:
        with pipe:
            list(pipe)
    err = info.value
    assert (err.stage, err.epoch, err.step, err.path, err.cause) == ("prefetch", 0, 3, catalog.path(13),
                                                                      "FileNotFoundError")
    assert os.path.join(root, catalog.path(13)) in str(err)
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


def test_source_file_changing_size_is_never_published(tmp_path):
    root = str(tmp_path / "data")
    make_dataset(root, 8, nbytes=2048, progress=False)
    cfg = make_config(root, tmp_path / "local", plan={"shuffle": False, "batch_size": 4},
                      staging={"keep": True, "job_id": "sizecheck"})
    catalog = load_catalog(cfg)
    with open(os.path.join(root, catalog.path(5)), "ab") as fh:
        fh.write(b"grown")
    pipe = Pipeline(cfg, catalog)
    with pytest.raises(StageError, match=rf"source changed .*: size {catalog.sizes[5] + 5} "
                                         rf"\(catalog says {catalog.sizes[5]}\)") as info:
        with pipe:
            list(pipe)
    assert info.value.path == catalog.path(5)
    # keep=True leaves the directory for inspection: the bad file is absent,
    # and no temporary file remains either.
    staged = [os.path.relpath(os.path.join(d, f), pipe.local_dir)
              for d, _, files in os.walk(pipe.local_dir) for f in files if f != ".lock"]
    assert catalog.path(5) not in staged
    assert not [f for f in staged if f.endswith(".part")]
    assert set(staged) <= set(catalog.paths())


def test_hdf5_loader(tmp_path):
    root = tmp_path / "h5"
    os.makedirs(root)
    for i in range(6):
        with h5py.File(root / f"s{i}.h5", "w") as fh:
            fh["pixels"] = np.full((4, 4), i, dtype=np.int16)
    cfg = make_config(str(root), tmp_path / "local", plan={"batch_size": 3, "shuffle": False},
                      dataset={"manifest": None, "loader": "hdf5", "hdf5_key": "pixels"})
    _, seen, payload, *_ = delivered(cfg)
    values = [int(s[0, 0]) for batch in payload for s in batch]
    assert values == [0, 1, 2, 3, 4, 5]


def test_workers_exit_when_their_parent_is_killed(slow_source, tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.join(REPO, 'tests')!r})
        from conftest import make_config, stager_workers
        from stager import Pipeline
        cfg = make_config({slow_source!r}, {str(tmp_path / 'local')!r}, plan={{"epochs": 0}})
        pipe = Pipeline(cfg)
        next(iter(pipe))
        print(" ".join(map(str, stager_workers())), flush=True)
        print(pipe._jobdir._janitor.proc.pid, pipe.local_dir, os.path.isdir(pipe.local_dir), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = proc.stdout.splitlines()
    pids = [int(p) for p in lines[0].split()]
    janitor, local, existed = lines[1].split()
    assert len(pids) == 4 and existed == "True"
    pids.append(int(janitor))  # it removes the job directory, then exits
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass  # already gone
    try:
        for fd in fds:
            ready, _, _ = select.select([fd], [], [], 10.0)  # readable when the process exits
            assert ready, "a worker outlived its parent by more than 10 s"
    finally:
        for fd in fds:
            os.close(fd)
    assert not os.path.exists(local), "the janitor must remove the staging directory of a killed owner"


def test_a_reader_killed_mid_run_is_reported_not_waited_for(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 0}, reader={"workers": 2})
    pipe = Pipeline(cfg)
    with pytest.raises(StageError, match=r"stager-read-\d \(pid \d+\) died") as info:
        with pipe:
            it = iter(pipe)
            next(it)
            os.kill(stager_workers("stager-read")[0], signal.SIGKILL)
            for _ in it:  # ends with the error, not a hang
                pass
    assert info.value.stage == "read" and info.value.cause == "WorkerDied"
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


def test_a_failing_staged_callback_reaches_the_consumer(slow_source, tmp_path):
    def on_staged(rel, nbytes, epoch):
        raise OSError(28, "No space left on device", "records/staged.jsonl")

    cfg = make_config(slow_source, tmp_path / "local")
    pipe = Pipeline(cfg, on_staged=on_staged)
    with pytest.raises(StageError, match="staging service failed: OSError") as info:
        with pipe:
            list(pipe)
    assert "on_staged" in info.value.remote_traceback
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


class Finish:
    """A ``finish`` that records the thread it ran in and fails at one step."""

    def __init__(self, fail_at):
        self.fail_at, self.threads = fail_at, set()

    def __call__(self, batch):
        self.threads.add(threading.get_ident())
        if batch.step == self.fail_at:
            raise MemoryError("cannot pin")
        return [("finished", sample) for sample in batch.samples]


def test_finish_runs_outside_the_consumers_thread_and_its_error_reaches_the_consumer(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 1}, dataset={"loader": "raw"})
    catalog = load_catalog(cfg)
    finish = Finish(fail_at=3)
    pipe = Pipeline(cfg, catalog, finish=finish)
    got = []
    with pytest.raises(StageError) as info:
        with pipe:
            for batch in pipe:
                assert all(tag == "finished" for tag, _ in batch.samples)
                with open(os.path.join(catalog.root, catalog.path(int(batch.indices[0]))), "rb") as fh:
                    assert batch.samples[0][1][0] == fh.read()
                got.append(batch.step)
    assert got == [0, 1, 2]
    assert finish.threads and threading.get_ident() not in finish.threads
    err = info.value
    assert (err.stage, err.epoch, err.step, err.cause) == ("deliver", 0, 3, "MemoryError")
    assert "cannot finish minibatch 3 of epoch 0" in str(err) and "cannot pin" in str(err)
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


def test_an_abandoned_pipeline_is_collected_and_closed(slow_source, tmp_path):
    import gc
    import weakref

    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 0})
    pipe = Pipeline(cfg)
    for _ in pipe:
        break
    pids, local, ref = stager_workers(), pipe.local_dir, weakref.ref(pipe)
    del pipe
    gc.collect()
    assert ref() is None, "the coordinator thread must not keep the pipeline alive"
    assert not set(pids) & child_pids() and not os.path.exists(local)


def test_no_thread_of_the_pipeline_outlives_the_close_at_the_end_of_the_plan(slow_source, tmp_path):
    """A daemon thread still running at interpreter exit is ended inside whatever C++ frame it is in,
    and torch's then abort the process (``terminate called without an active exception``): the last
    ``next()`` returns only once the coordinator, which ran the shutdown, has ended."""
    import threading
    import time

    def slow_end(frame, event, arg):
        # Widens the window after the coordinator's shutdown said "done" and before its thread ends.
        if event == "return" and frame.f_code.co_name == "_protocol" and \
                threading.current_thread().name == "stager-coordinator":
            time.sleep(0.5)
        return slow_end if event == "call" and frame.f_code.co_name == "_protocol" else None

    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 1}, staging={"prefetchers": 2})
    threading.settrace(slow_end)
    try:
        with Pipeline(cfg) as pipe:
            batches = sum(1 for _ in pipe)
            alive = [t.name for t in threading.enumerate() if t.name.startswith("stager-")]
    finally:
        threading.settrace(None)
    assert batches > 0 and pipe.closed
    assert alive == [], f"threads still running after the last next(): {alive}"


def test_a_kept_copy_of_a_changed_source_is_staged_again(tmp_path):
    root = tmp_path / "data"
    make_dataset(str(root), 4, nbytes=2048, progress=False)
    cfg = make_config(str(root), tmp_path / "local", plan={"shuffle": False, "batch_size": 2},
                      dataset={"loader": "raw"}, staging={"keep": True, "job_id": "kept"})
    with Pipeline(cfg) as pipe:
        list(pipe)
        assert pipe.stats.files_staged == 4
    catalog = load_catalog(cfg)
    victim = root / catalog.path(2)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # same size, new content and modification time
    victim.write_bytes(bytes(data))
    with Pipeline(cfg) as pipe:
        batches = list(pipe)
        stats = pipe.stats
    assert (stats.files_staged, stats.files_present) == (1, 3)
    assert batches[1].samples[0][0] == bytes(data)


def _hung_up_service(*said):
    """A rank's ``Channels`` whose service sent ``said`` and then closed its end."""
    import multiprocessing

    from stager.engine.rank.coordinator import Channels

    ours, theirs = multiprocessing.Pipe()
    for msg in said:
        theirs.send(msg)
    theirs.close()
    ch = Channels(wake=None)
    ch.client = ours
    return ch


def test_a_rank_whose_service_hung_up_reports_the_failure_it_was_sent_last_not_the_broken_pipe():
    from stager.engine.messages import Failure, Need, Ready

    cause = Failure("pipeline", "node leader", cause="PeerFailed", message="rank 2 failed: RuntimeError: injected")
    ch = _hung_up_service(Ready(0, 0.1), cause)
    with pytest.raises(StageError, match="rank 2 failed: RuntimeError: injected") as info:
        ch.send(Need(1, 0, 1, np.arange(4)))
    assert info.value.cause == "PeerFailed"
    ch.client.close()


def test_a_rank_whose_service_hung_up_without_a_word_says_it_is_gone():
    from stager.engine.messages import Need, Ready

    ch = _hung_up_service(Ready(0, 0.1))
    with pytest.raises(StageError, match="staging service .* is gone") as info:
        ch.send(Need(1, 0, 1, np.arange(4)))
    assert info.value.cause == "ServiceGone"
    ch.client.close()
