"""Signals around forked workers.

A SIGTERM that lands while the main thread forks workers is not lost. Right
after ``fork()`` the parent runs Python's at-fork callbacks; a handler
raising ``SystemExit`` there is reported as "Exception ignored" and dropped,
and the run would go on to the end with exit code 0. The test sends SIGTERM
from exactly that place (an at-fork callback of its own).

A worker never runs the Python handlers of the process it was forked from:
a training framework's (Lightning's SIGTERM handler joins a broadcast of the
parent's process group), run in a worker, hung the training process at exit,
where ``multiprocessing`` terminates its daemonic workers and joins them.
"""

import os
import signal
import subprocess
import sys
import textwrap

from conftest import REPO

SCRIPT = textwrap.dedent("""
    import multiprocessing, os, signal, sys
    from stager.engine.workers.pool import WorkerPool

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    def idle(index, parent, tasks, reply, stop):
        stop.wait(30)

    signal.signal(signal.SIGTERM, on_term)
    if sys.argv[1] == "during-fork":
        os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGTERM))
    pool = WorkerPool(multiprocessing.get_context("fork"), "read", "stager-test", 3, idle, ())
    print("pool started", flush=True)
    pool.stop(5.0)
    print("ran to the end", flush=True)
""")


def _run(mode):
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_a_sigterm_during_fork_ends_the_process_and_its_workers():
    result = _run("during-fork")
    assert result.returncode == 128 + 15, (result.returncode, result.stdout, result.stderr)
    assert "ran to the end" not in result.stdout and "pool started" not in result.stdout
    assert "Exception ignored" not in result.stderr, result.stderr
    assert not _workers_named("stager-test-")


def _workers_named(prefix):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if fh.read().startswith(prefix):
                    found.append(int(pid))
        except OSError:
            pass  # gone meanwhile
    return found


def test_without_a_signal_the_pool_starts_and_stops():
    result = _run("quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["pool started", "ran to the end"]


FOREIGN = textwrap.dedent("""
    import multiprocessing, os, signal, sys, threading
    from stager.engine.workers.pool import WorkerPool

    def framework_handler(signum, frame):
        # What a training framework's handler may do for the whole job: here, note it and wait for
        # the other ranks, which never come.
        with open(sys.argv[1], "a") as fh:
            fh.write(f"{os.getpid()} {signum}\\n")
        threading.Event().wait()

    def echo(index, parent, tasks, reply, stop):
        reply.send("ready")
        for task in iter(tasks.get, None):
            reply.send(task)

    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, framework_handler)
    pool = WorkerPool(multiprocessing.get_context("fork"), "read", "stager-foreign", 2, echo, ())
    assert [conn.recv() for conn in pool.conns] == ["ready", "ready"]
    for proc in pool.procs:
        os.kill(proc.pid, signal.SIGUSR1)
        os.kill(proc.pid, signal.SIGHUP)
    for i in range(len(pool.procs)):
        pool.tasks.put(i)
    # A worker that ran the handler would never answer.
    answers = sorted(conn.recv() for conn in pool.conns if conn.poll(30))
    print("answers", answers, flush=True)
    # Left running on purpose, as by a loader nobody closed: multiprocessing's exit handler
    # terminates the daemonic workers, then joins them without a timeout.
""")


def test_a_worker_never_runs_the_handlers_of_the_process_it_was_forked_from(tmp_path):
    marker = tmp_path / "handled"
    proc = subprocess.Popen([sys.executable, "-c", FOREIGN, str(marker)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the process did not exit: {out} {err} "
                             f"handled in a worker: {marker.read_text() if marker.exists() else 'nothing'}")
    assert proc.returncode == 0, err
    assert "answers [0, 1]" in out, (out, err)
    assert not marker.exists(), marker.read_text()
    assert not _workers_named("stager-foreign-")
