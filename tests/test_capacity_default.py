"""The local disk never fills by default: ``staging.capacity: auto`` sizes the cache from the free space at start."""

import os
import subprocess

import numpy as np
import pytest
from conftest import load_catalog, make_config, size_limited_tmpfs, stager_cmd

from stager import Pipeline, plan
from stager.config import StagingConfig
from stager.job.synth import make_dataset
from stager.storage import auto_capacity


@pytest.fixture
def data(tmp_path):
    """400 samples of about 100 KB: 40 MB (10^6 bytes), more than 80% of a 40 MiB disk."""
    root = tmp_path / "data"
    make_dataset(str(root), 400, nbytes=100_000, classes=4, seed=3, progress=False)
    return str(root)


def test_auto_is_the_default_and_names_itself():
    assert StagingConfig().capacity == "auto"


def test_a_default_run_on_a_40_mb_disk_evicts_instead_of_failing(data, tmp_path, caplog):
    with size_limited_tmpfs(str(tmp_path / "small"), "40M") as local:
        cfg = make_config(data, local, plan={"epochs": 2}, staging={"lookahead": 4})
        catalog = load_catalog(cfg)
        caplog.set_level("INFO", logger="stager")
        seen = []
        with Pipeline(cfg, catalog) as pipe:
            for batch in pipe:
                seen.append(batch)
            cache = pipe.stats.cache_table()
        assert os.listdir(local) == []
    note = [r.getMessage() for r in caplog.records if "staging.capacity auto" in r.getMessage()]
    assert len(note) == 1 and "80% of the" in note[0] and "free on" in note[0], note
    assert [(b.epoch, b.step, b.indices.tolist()) for b in seen] == [
        (m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    for batch in seen:
        for i, (sample, label) in zip(batch.indices, batch.samples):
            assert np.array_equal(sample, np.load(os.path.join(data, catalog.path(i)))) and label == catalog.label(i)
    assert sum(row["evictions"] for row in cache) > 0, "a cache that fits 32 MB of 40 must have evicted"


def test_the_look_ahead_is_cut_to_what_a_tiny_disk_holds_and_said(data, tmp_path, caplog):
    # 8 MB: a capacity of 6.4 MB; 16 minibatches of 8 x 100 KB would need 12.8 MB.
    with size_limited_tmpfs(str(tmp_path / "tiny"), "8M") as local:
        cfg = make_config(data, local, plan={"epochs": 1}, staging={"lookahead": 16}, reader={"ahead": 2})
        caplog.set_level("INFO", logger="stager")
        with Pipeline(cfg) as pipe:
            count = sum(1 for _ in pipe)
            assert pipe._staging.lookahead < 16
    assert count == 50
    assert any("look-ahead cut from 16 to" in r.getMessage() for r in caplog.records)


def test_a_disk_too_small_for_one_minibatch_is_refused_naming_the_free_space(data, tmp_path):
    with size_limited_tmpfs(str(tmp_path / "tiny"), "512k") as local:
        cfg = make_config(data, local)
        with pytest.raises(Exception, match=r"staging.capacity auto is .*too small for even one minibatch per rank"):
            with Pipeline(cfg) as pipe:
                next(iter(pipe))
        assert os.listdir(local) == []


def test_a_dataset_that_fits_is_unbounded(tmp_path):
    capacity, why = auto_capacity(str(tmp_path), 1000)
    assert capacity is None and why.startswith("unbounded: the whole dataset (1000 B) fits")


def test_unbounded_stays_available_by_name_and_the_command_says_what_it_chose(data, tmp_path):
    cfg = make_config(data, tmp_path / "local", staging={"capacity": "unbounded"})
    assert cfg.staging.capacity == "unbounded"
    with size_limited_tmpfs(str(tmp_path / "small"), "36M") as local:  # 37.7 MB: less than the 40 MB dataset
        job = tmp_path / "job.yaml"
        job.write_text(f"dataset: {{source: {data}, manifest: manifest.tsv}}\nplan: {{batch_size: 8}}\n"
                       f"staging: {{local_dir: {local}, lookahead: 4}}\n")
        proc = subprocess.run(stager_cmd("run", str(job), "--quiet"), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert any(line.startswith("stager: staging.capacity auto: ") for line in proc.stderr.splitlines()[:2]), \
            proc.stderr
        unbounded = subprocess.run(stager_cmd("run", str(job), "--quiet", "--set", "staging.capacity=unbounded"),
                                   capture_output=True, text=True, timeout=300)
        assert unbounded.returncode == 2 and "No space left on device" in unbounded.stderr
        assert os.listdir(local) == []
