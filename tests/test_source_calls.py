"""What a staged file costs its source: the calls of a direct read, counted under strace.

One epoch of 64 JPEGs behind the emulator, read once by DataLoader and once
by StagedLoader on its defaults (tests/source_calls.py), each under
``strace -f -y``. Two sides of every file are counted: the loader's calls
naming it through the mount (what the client asks), and the emulator
daemon's calls naming it in the tree beneath (what reaches the servers:
opens, attribute requests, reads).
"""

import collections
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from stager.job.synth import make_dataset

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")

FILES = 64
CALL = re.compile(r"^\d+\s+(?:<\.\.\. )?(\w+)[( ]")


def per_file(trace, prefix):
    """``{file: Counter(call kind)}`` of the trace's calls naming a ``.jpg`` under ``prefix``.

    A call interrupted by another thread's appears twice in strace's output
    (``unfinished ...`` then ``<... resumed>``); it is counted once, where it starts.
    """
    named = re.compile(re.escape(prefix) + r"/([^\s\"<>]+\.jpg)")
    out = collections.defaultdict(collections.Counter)
    with open(trace) as fh:
        for line in fh:
            found, call = named.search(line), CALL.match(line)
            if found is None or call is None or "resumed>" in line:
                continue
            kind = call.group(1)
            if kind == "statx" and "AT_STATX_FORCE_SYNC" in line:
                kind = "statx(AT_STATX_FORCE_SYNC)"
            out[found.group(1)][kind] += 1
    return out


def traced_epoch(method, data, work):
    os.mkdir(work)
    trace = os.path.join(work, "trace")
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run(["strace", "-f", "-y", "-qq", "-o", trace,
                           "-e", "trace=%file,%desc,sendfile,splice,copy_file_range",
                           sys.executable, os.path.join(REPO, "tests", "source_calls.py"), method, data, work],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split()[-1] == str(FILES)
    return per_file(trace, os.path.join(work, "mnt")), per_file(trace, data)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    work = tmp_path_factory.mktemp("calls")
    data = str(work / "imgs")
    make_dataset(data, FILES, nbytes=20_000, classes=4, seed=3, progress=False, fmt="jpeg")
    os.remove(os.path.join(data, "manifest.tsv"))  # an ImageFolder: class directories only
    return {method: traced_epoch(method, data, str(work / method)) for method in ("dataloader", "staged")}


def without_reads(calls):
    """The calls other than reading bytes (how many reads a file takes depends on their sizes)."""
    return {kind: n for kind, n in calls.items() if kind not in ("read", "pread64", "sendfile", "lseek")}


def test_the_servers_get_from_a_staged_epoch_what_a_direct_epoch_gives_them(traces):
    staged, direct = traces["staged"][1], traces["dataloader"][1]
    assert len(staged) == len(direct) == FILES
    for name, calls in staged.items():
        assert calls["openat"] == 1 and calls["close"] == 1, (name, calls)
        assert without_reads(calls) == without_reads(direct[name]), (name, calls, direct[name])


def test_a_staged_file_is_opened_once_and_never_asked_for_fresh_attributes(traces):
    staged, direct = traces["staged"][0], traces["dataloader"][0]
    assert len(staged) == FILES
    for name, calls in staged.items():
        assert calls["openat"] == 1 and calls["close"] == 1, (name, calls)
        assert not any(kind.startswith("statx") for kind in calls), (name, calls)
        # The catalog's one stat by path, then the calls a direct read makes.
        assert sum(calls.values()) <= sum(direct[name].values()) + 1, (name, calls, direct[name])
