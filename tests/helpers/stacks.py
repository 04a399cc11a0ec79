"""Running a training stack's launcher the way a job runs, for the Lightning and Accelerate tests."""

import json
import os
import signal
import subprocess


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
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the run left (nothing, when it ended well)
        except ProcessLookupError:
            pass
        proc.communicate()
    if expect_kill:
        assert proc.returncode != 0, output
    else:
        assert proc.returncode == 0, output
    return [[json.loads(line) for line in (out / f"{tag}-rank{r}.jsonl").read_text().splitlines()]
            for r in range(ranks)]
