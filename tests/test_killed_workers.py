"""A prefetcher killed mid-run: the job ends with an error naming it, soon, and leaves nothing behind."""

import os
import signal
import time

import pytest

from conftest import make_config, stager_workers
from stager.errors import StageError
from stager.pipeline import Pipeline


def test_a_prefetcher_killed_mid_run_ends_the_job_with_its_name(slow_source, tmp_path):
    cfg = make_config(slow_source, tmp_path / "local", plan={"epochs": 0}, staging={"prefetchers": 2})
    pipe = Pipeline(cfg)
    with pytest.raises(StageError, match=r"stager-prefetch-\d \(pid \d+\) died") as info:
        with pipe:
            it = iter(pipe)
            next(it)
            victim = stager_workers("stager-prefetch")[0]
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            for _ in it:  # ends with the error, not a hang
                pass
    assert time.monotonic() - killed < 30, "the death must be noticed, not waited out"
    assert info.value.stage == "prefetch" and info.value.cause == "WorkerDied"
    assert str(victim) in str(info.value)
    assert not stager_workers() and not os.path.exists(pipe.local_dir)
