"""The decoded tier in a ``staging.share`` group: jobs of one loader read what the group kept, others read encoded.

Each job is its own process (``helpers/decoded_job.py``), as a user starts
them; the first holds the group open after its first epoch, so the others
join a group whose tier already holds every sample. Every job's tensors
are compared, sample by sample and epoch by epoch, with DataLoader's.
"""

import hashlib
import json
import os
import subprocess
import sys
import uuid

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import REPO
from helpers.decoded_job import EPOCHS, FIXED, gray
from helpers.watch import still_running, wait_for_lines
from test_decoded import write_images
from test_mpi_run import processes_mentioning

pytest.importorskip("torchvision")
from torchvision.datasets import ImageFolder  # noqa: E402

JOB = os.path.join(REPO, "tests", "helpers", "decoded_job.py")


def want(root, **kwargs):
    """What DataLoader gives for one epoch, as the job writes it."""
    loader = DataLoader(ImageFolder(root, transform=FIXED, **kwargs), batch_size=5)
    return [[hashlib.sha256(x.numpy().tobytes()).hexdigest(), int(y)] for xs, ys in loader for x, y in zip(xs, ys)]


def test_jobs_of_a_group_build_the_groups_decoded_copies_and_another_loaders_job_reads_encoded(tmp_path):
    root = write_images(str(tmp_path / "train"))
    local, fifo, name = tmp_path / "local", str(tmp_path / "hold"), f"t{uuid.uuid4().hex[:10]}"
    local.mkdir()
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), REPO]), TMPDIR=str(tmp_path))
    procs = {}

    def start(label, loader, *hold):
        procs[label] = subprocess.Popen([sys.executable, JOB, root, str(local), name, str(tmp_path / label), loader,
                                         *hold], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(label):
        out = procs[label].communicate(timeout=240)[0]
        assert procs[label].returncode == 0, out
        lines = [json.loads(line) for line in open(tmp_path / label)]
        return lines, json.loads((tmp_path / f"{label}.report.json").read_text())["decoded"]

    try:
        start("first", "default", fifo)
        assert wait_for_lines(str(tmp_path / "first"), 1, pid=procs["first"].pid), procs["first"].communicate()[0]
        start("same", "default")
        start("other", "gray")
        same, same_report = finish("same")
        other, other_report = finish("other")
        release = os.open(fifo, os.O_RDWR)  # a writer: the first job's wait ends, now or when it gets there
        try:
            first, first_report = finish("first")
        finally:
            os.close(release)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    n = len(ImageFolder(root))
    assert first == same == [want(root)] * EPOCHS
    assert other == [want(root, loader=gray)] * EPOCHS
    # The first job kept every sample in its first epoch; the second built all of its samples from those copies
    # (its readers may have read ahead into a fourth epoch the loader plans on: those count too).
    assert first_report["samples_kept"] >= n and first_report["samples_from_decoded"] >= (EPOCHS - 1) * n - (
        first_report["samples_kept"] - n), first_report
    assert same_report["samples_kept"] == 0 and same_report["samples_from_decoded"] >= EPOCHS * n, same_report
    assert "shared by its jobs" in same_report["note"], same_report
    assert other_report["samples_kept"] == other_report["samples_from_decoded"] == 0, other_report
    assert other_report["note"].startswith("none: the group's decoded copies are another loader's"), other_report
    assert not still_running([p for p in processes_mentioning(name) if p != os.getpid()], 30), "the service outlived"
    assert os.listdir(local) == [], "the group left its directory behind"
