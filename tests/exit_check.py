"""Runs a script that exits while a front end is still alive, and reports what it left."""

import os
import subprocess
import sys

from conftest import REPO

_PRELUDE = """
import os, sys
def report_children():
    # Direct children of this process, from /proc, for the test to check after the exit.
    pids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as fh:
                pids.update(fh.read().split())
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    print("CHILDREN", " ".join(sorted(pids)), flush=True)
"""


def running(pid):
    """Whether ``pid`` is a process that still runs (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def run_to_exit(script, *args, timeout=120):
    """Runs ``script`` (which calls ``report_children()``) with this interpreter from the repository root.

    Returns:
        ``(returncode, stdout, stderr, children)``: ``children`` are those it
        reported that still ran the moment it exited (a process that shuts
        its workers down has reaped them by then).
    """
    env = dict(os.environ, SETUPTOOLS_USE_DISTUTILS="stdlib")
    proc = subprocess.Popen([sys.executable, "-c", _PRELUDE + script, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        proc.wait(timeout)
        pids = first.split()[1:] if first.startswith("CHILDREN") else []
        left = [p for p in pids if running(p)]
        # Orphaned workers keep the pipes open until they end.
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, first + out, err, left
