"""The CPU ledger: each epoch's CPU by process kind, marked by the rank, in the report and ``stager report``."""

import time

import numpy as np
from conftest import make_config

from stager.engine import Pipeline
from stager.job.synth import make_dataset
from stager.slowfs import SlowFS
from stager.telemetry import pipeline_report, render
from stager.telemetry.collect import combine_epochs
from stager.telemetry.ledger import BEFORE, PREFETCHERS, RANK, READERS, SAMPLES, by_epoch, ledger_lines

SPIN_S = 0.003  # CPU a sample the loader burns in a reader


def spinning_loader(path):
    """``np.load``, after burning ``SPIN_S`` of the reader's own CPU: a known cost the ledger must find."""
    begin = time.thread_time()
    while time.thread_time() - begin < SPIN_S:
        pass
    return np.load(path)


def test_each_epoch_s_cpu_is_put_on_the_process_kind_that_spent_it(tmp_path):
    """Three epochs, the readers burning a known CPU a sample: every epoch has its row, with its samples; the
    readers' seconds hold what the loader burned (over the run: the workers run ahead of the consumer's epoch
    boundaries, so a few minibatches' work fall in the row before); the prefetchers spend in epoch 1, where
    they copy, more than in the epochs that read the copies; ``stager report``'s text shows the table."""
    # Files large enough that copying them costs the prefetchers many of the kernel's 10 ms ticks.
    make_dataset(str(tmp_path / "data"), 160, nbytes=256 << 10, classes=4, seed=4, progress=False)
    (tmp_path / "mnt").mkdir()
    with SlowFS(str(tmp_path / "data"), str(tmp_path / "mnt"), open_ms=1.0, mbps=0) as mnt:
        cfg = make_config(mnt, tmp_path / "local", plan={"epochs": 3, "batch_size": 8})
        with Pipeline(cfg, loader=spinning_loader) as pipe:
            samples = [0, 0, 0]
            for batch in pipe:
                samples[batch.epoch] += len(batch.indices)
            report = pipeline_report(pipe, cfg)
    rows = report["cpu_by_epoch"]
    assert [(r["epoch"], r["samples"]) for r in rows] == [(0, samples[0]), (1, samples[1]), (2, samples[2])]
    assert rows == report["per_rank"][0]["cpu_by_epoch"]
    burned = sum(samples) * SPIN_S
    # Clock ticks of 10 ms, read per reader: each may round down by one.
    assert burned - 0.01 * cfg.reader.workers <= sum(r["readers_s"] for r in rows) <= 3 * burned + 0.5, rows
    assert all(r["readers_s"] >= 0.3 * r["samples"] * SPIN_S for r in rows), rows
    assert rows[0]["prefetchers_s"] > 0 and all(r["prefetchers_s"] < rows[0]["prefetchers_s"] for r in rows[1:])
    text = render(report)
    assert "CPU a sample, by epoch" in text
    table = text.split("CPU a sample, by epoch", 1)[1].splitlines()
    assert [line.split()[:2] for line in table[2:5]] == [["0", str(samples[0])], ["1", str(samples[1])],
                                                         ["2", str(samples[2])]]


def test_the_marks_become_each_epoch_s_seconds_and_the_ranks_rows_add_up():
    """The pure part: each epoch's seconds are its mark less the one before (the start's for the first); an
    epoch marked only in part is left out; the job's rows sum the ranks'."""
    marks = [(BEFORE, RANK, 1.0), (BEFORE, READERS, 0.0), (BEFORE, PREFETCHERS, 0.0), (BEFORE, SAMPLES, 0),
             (0, RANK, 1.5), (0, READERS, 2.0), (0, PREFETCHERS, 0.4), (0, SAMPLES, 100),
             (1, RANK, 1.6), (1, READERS, 3.0), (1, PREFETCHERS, 0.4), (1, SAMPLES, 100),
             (2, RANK, 1.7)]
    rows = by_epoch(marks)
    assert rows == [{"epoch": 0, "samples": 100, "rank_s": 0.5, "readers_s": 2.0, "prefetchers_s": 0.4},
                    {"epoch": 1, "samples": 100, "rank_s": 0.1, "readers_s": 1.0, "prefetchers_s": 0.0}]
    other = [dict(r, prefetchers_s=0.0) for r in rows]  # a rank that does not lead its node
    job = combine_epochs([rows, other])
    assert job[0] == {"epoch": 0, "samples": 200, "rank_s": 1.0, "readers_s": 4.0, "prefetchers_s": 0.4}
    assert ledger_lines(job)[3].split() == ["0", "200", "5.00", "20.00", "2.00", "27.00"]
    assert by_epoch([]) == [] and ledger_lines([]) == []
