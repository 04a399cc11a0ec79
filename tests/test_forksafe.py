"""A SIGTERM that lands while the main thread forks workers is not lost.

Right after ``fork()`` the parent runs Python's at-fork callbacks; a handler
raising ``SystemExit`` there is reported as "Exception ignored" and dropped,
and the run would go on to the end with exit code 0. The test sends SIGTERM
from exactly that place (an at-fork callback of its own).
"""

import os
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
