"""Loaders for the peer tests, importable by workers as ``peerchecks:NAME``."""

import json
import os
import signal
import time

import numpy as np

_calls = [0]


def same_as_source(path):
    """Decodes ``.npy`` after checking the staged bytes against the source's (``STAGER_TEST_SOURCE``)."""
    rel = os.path.join(*path.split(os.sep)[-2:])  # <class>/<file> in the synthetic layout
    with open(path, "rb") as staged, open(os.path.join(os.environ["STAGER_TEST_SOURCE"], rel), "rb") as source:
        if staged.read() != source.read():
            raise ValueError(f"staged {rel} differs from the source")
    return np.load(path)


def kill_leader_of_b(path):
    """Decodes ``.npy``; on global rank 2 (node b's leader), SIGKILLs that rank at its 150th sample,
    after writing the moment to ``STAGER_TEST_KILLED``."""
    _calls[0] += 1
    if os.environ.get("PMI_RANK") == "2" and _calls[0] == 150:
        with open(os.environ["STAGER_TEST_KILLED"], "w") as fh:
            fh.write(repr(time.time()))
        os.kill(os.getppid(), signal.SIGKILL)
    return np.load(path)


def stop_leader_of_c(path):
    """``same_as_source``, 20 ms a sample on every rank but 2 (a costly decode: they stay behind it); on
    global rank 2 (node c's leader, one rank a node), at its reader's ``STAGER_TEST_AT``-th sample: SIGSTOPs
    that rank, waits (inotify, at most 120 s) until every other rank's record file
    (``$STAGER_TEST_RECORDS/rank-<r>.jsonl``) holds ``STAGER_TEST_UNTIL`` minibatches, then SIGCONTs it, and
    writes the records before and after the stop to ``STAGER_TEST_STOPPED`` (JSON)."""
    from watch import lines_in, wait_for_lines

    _calls[0] += 1
    if os.environ.get("PMI_RANK") != "2":
        time.sleep(0.02)  # stands in for a costly decode, not a wait
    elif _calls[0] == int(os.environ["STAGER_TEST_AT"]):
        records, size = os.environ["STAGER_TEST_RECORDS"], int(os.environ["PMI_SIZE"])
        files = [os.path.join(records, f"rank-{r}.jsonl") for r in range(size)]
        os.kill(os.getppid(), signal.SIGSTOP)
        try:
            before, start = [lines_in(f) for f in files], time.monotonic()
            for r, f in enumerate(files):
                if r != 2:
                    wait_for_lines(f, int(os.environ["STAGER_TEST_UNTIL"]),
                                   timeout=max(0.0, start + 120 - time.monotonic()))
            after, stopped_s = [lines_in(f) for f in files], time.monotonic() - start
        finally:
            os.kill(os.getppid(), signal.SIGCONT)
        with open(os.environ["STAGER_TEST_STOPPED"], "w") as fh:
            json.dump({"before": before, "after": after, "seconds": stopped_s}, fh)
    return same_as_source(path)


def hold_rank_2(path):
    """``same_as_source``; on global rank 2 (node b's second rank), at its reader's ``STAGER_TEST_AT``-th
    sample: holds that reader (so the rank stalls while its node leader goes on answering) until rank 0's
    record file holds ``STAGER_TEST_UNTIL`` minibatches or ``STAGER_TEST_HOLD_S`` seconds passed (inotify),
    and writes the records before and after to ``STAGER_TEST_STOPPED`` (JSON)."""
    from watch import lines_in, wait_for_lines

    _calls[0] += 1
    if os.environ.get("PMI_RANK") == "2" and _calls[0] == int(os.environ["STAGER_TEST_AT"]):
        records, size = os.environ["STAGER_TEST_RECORDS"], int(os.environ["PMI_SIZE"])
        files = [os.path.join(records, f"rank-{r}.jsonl") for r in range(size)]
        before, start = [lines_in(f) for f in files], time.monotonic()
        wait_for_lines(files[0], int(os.environ["STAGER_TEST_UNTIL"]),
                       timeout=float(os.environ["STAGER_TEST_HOLD_S"]))
        after, held_s = [lines_in(f) for f in files], time.monotonic() - start
        with open(os.environ["STAGER_TEST_STOPPED"], "w") as fh:
            json.dump({"before": before, "after": after, "seconds": held_s}, fh)
    return same_as_source(path)
