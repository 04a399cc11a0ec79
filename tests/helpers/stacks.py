"""Running a training stack's launcher the way a job runs, for the Lightning and Accelerate tests."""

import json
import os
import signal
import socket
import subprocess

import pytest

from stager.bench.cpu import descendants


def free_port():
    """A TCP port free on 127.0.0.1 now, for a launcher's rendezvous (a fixed one may be taken on a shared host)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(command, cwd, env, out, tag, ranks=2, expect_kill=False, timeout=300):
    """Runs ``command`` in a process group of its own, ended whatever happens; returns each rank's records.

    The training script appends one JSON line per step to ``OUT/TAG-rank<r>.jsonl``.

    Args:
        expect_kill: The script kills its own job (a scheduler's SIGKILL):
            a non-zero exit is then the expected outcome, not a failure.
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = None
    finally:
        # MPICH's proxy starts the ranks in sessions of their own: the launcher's group alone would leave them.
        left = descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the run left (nothing, when it ended well)
        except ProcessLookupError:
            pass
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        late, _ = proc.communicate()  # after a timeout, all it printed: communicate loses nothing
    if output is None:  # what it printed until then says where it stood
        pytest.fail(f"{command[0]} did not end within {timeout} s; its output until then:\n{late}")
    if expect_kill:
        assert proc.returncode != 0, output
    else:
        assert proc.returncode == 0, output
    return [[json.loads(line) for line in (out / f"{tag}-rank{r}.jsonl").read_text().splitlines()]
            for r in range(ranks)]
