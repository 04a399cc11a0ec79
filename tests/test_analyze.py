"""``stager analyze``: DS-Analyzer's differential method, run as a user would on the FUSE emulator."""

import json
import os
import signal
import subprocess

import numpy as np
import pytest

from conftest import REPO, make_job_data, stager_cmd
from stager.analyze import attribute
from stager.analyze.synthetic import synthetic_like

HELPERS = os.path.join(REPO, "tests", "helpers")


def slowfs_mounts(root):
    with open("/proc/self/mounts") as fh:
        return [line for line in fh if line.startswith("stager-slowfs") and line.split()[1].startswith(str(root))]


def write_config(tmp_path, open_ms, prefetchers, readers, loader="npy", lookahead=2):
    path = tmp_path / "job.yaml"
    path.write_text(f"""
dataset:
  source: data
  manifest: manifest.tsv
  loader: "{loader}"
synthetic:
  samples: 80
  bytes: 3000
slowfs:
  enabled: true
  open_ms: {open_ms}
plan:
  batch_size: 4
  seed: 5
staging:
  local_dir: local
  prefetchers: {prefetchers}
  lookahead: {lookahead}
reader:
  workers: {readers}
run:
  compute_ms: 2
""")
    return make_job_data(path)


def analyze(tmp_path, config, *args):
    """Runs ``stager analyze`` in its own process; the emulator's mount point goes under ``tmp_path``."""
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([REPO, HELPERS, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "analysis.json"
    proc = subprocess.run(stager_cmd("analyze", config, "--json", str(out), *args), capture_output=True, text=True,
                          timeout=180, env=env, cwd=tmp_path)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def check_clean_run(tmp_path, proc, result, batches):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    for name in ("synthetic", "staged", "cold"):
        phase = result["phases"][name]
        assert phase["batches"] == batches and phase["samples"] == 4 * batches, (name, phase)
    # The cold phase staged every file of the timed minibatches and their warm-up.
    assert result["phases"]["cold"]["extra"]["files_staged"] >= 4 * (batches + result["settings"]["warmup"])
    assert not slowfs_mounts(tmp_path)
    assert os.listdir(tmp_path / "local") == []  # the kept copy of the cold phase is gone


def test_a_slow_source_is_attributed_to_fetch(tmp_path):
    # 25 ms per open, one prefetcher: 100 ms to fetch a minibatch of 4 files;
    # decoding 4 small arrays and a 2 ms step cost almost nothing.
    config = write_config(tmp_path, open_ms=25, prefetchers=1, readers=2, lookahead=1)
    proc, result = analyze(tmp_path, config, "--batches", "10")
    check_clean_run(tmp_path, proc, result, 10)
    stall = result["stall"]
    assert stall["bottleneck"] == "fetch"
    assert stall["fetch_stall_s"] > stall["prep_stall_s"]
    assert result["step"].startswith("simulated (2 ms")
    assert isinstance(result["page_cache_dropped"], bool)
    assert "bottleneck: fetch" in proc.stdout and "staging.prefetchers" in proc.stdout


def test_a_slow_decoder_is_attributed_to_preparation(tmp_path):
    # One reader decoding 4 files at 25 ms each: 100 ms per minibatch, from a
    # local copy as from the source; 4 prefetchers open 4 files in about 1 ms.
    # The step is a real PyTorch step over default_collate's tensors, also in
    # the synthetic phase, so the synthetic batches have the real structure.
    config = write_config(tmp_path, open_ms=1, prefetchers=4, readers=1, loader="analyze_helpers:slow_npy",
                          lookahead=4)
    proc, result = analyze(tmp_path, config, "--batches", "10", "--step", "analyze_helpers:torch_step",
                           "--collate", "torch", "--keep-page-cache")
    check_clean_run(tmp_path, proc, result, 10)
    stall = result["stall"]
    assert stall["bottleneck"] == "preparation"
    assert stall["prep_stall_s"] > stall["fetch_stall_s"]
    assert result["step"] == "analyze_helpers:torch_step" and result["page_cache_dropped"] is False
    assert "bottleneck: preparation" in proc.stdout and "reader.workers" in proc.stdout


@pytest.mark.parametrize("step, named", [("no_such_module_xyz:step", "cannot import module 'no_such_module_xyz'"),
                                         ("analyze_helpers:no_such_step", "has no function 'no_such_step'"),
                                         ("analyze_helpers", "is not of the form module:function")])
def test_a_step_that_does_not_exist_is_named(tmp_path, step, named):
    config = write_config(tmp_path, open_ms=1, prefetchers=2, readers=1)
    before = sorted(os.listdir(tmp_path))
    proc, result = analyze(tmp_path, config, "--step", step)
    assert proc.returncode == 2 and result is None
    assert f"stager: error: --step {step!r}" in proc.stderr and named in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == before and not slowfs_mounts(tmp_path)  # refused before anything was made


def test_synthetic_batches_keep_structure_shape_type_and_range():
    rng = np.random.default_rng(0)
    images = np.random.default_rng(1).integers(10, 200, (3, 5, 4), dtype=np.uint8)
    floats = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
    real = [(images, 7), {"x": floats, "raw": b"abcdef", "name": "s1"}, (np.array([0, 9, 4]),)]
    fake = synthetic_like(real, rng)
    assert type(fake) is list and len(fake) == 3
    (img, label), d, (labels,) = fake
    assert img.shape == images.shape and img.dtype == np.uint8 and not np.shares_memory(img, images)
    assert img.min() >= 10 and img.max() <= 200 and not np.array_equal(img, images)
    assert label == 7 and d["name"] == "s1" and len(d["raw"]) == 6 and d["raw"] != b"abcdef"
    assert d["x"].dtype == np.float32 and d["x"].shape == (3, 4) and -1.0 <= d["x"].min() <= d["x"].max() <= 1.0
    assert labels.dtype == np.array([0]).dtype and labels.min() >= 0 and labels.max() <= 9


def test_attribution_is_the_clipped_differences():
    a = attribute(synthetic_s=1.0, staged_s=3.0, cold_s=10.0)
    assert (a["prep_stall_s"], a["fetch_stall_s"], a["bottleneck"]) == (2.0, 7.0, "fetch")
    assert a["prep_fraction"] == 0.2 and a["fetch_fraction"] == 0.7 and a["stall_fraction"] == 0.9
    assert a["compute_s"] == 1.0 and a["compute_fraction"] == 0.1
    a = attribute(synthetic_s=1.0, staged_s=8.0, cold_s=7.5)  # cold faster than staged: noise, not a gain
    assert (a["prep_stall_s"], a["fetch_stall_s"], a["bottleneck"]) == (6.5, 0.0, "preparation")
    assert a["stall_fraction"] <= 1.0
    assert attribute(synthetic_s=10.0, staged_s=10.2, cold_s=10.3)["bottleneck"] == "compute"


def test_sigterm_while_analysing_unmounts_and_removes_the_local_copy(tmp_path):
    # Stopped in the staged phase, when the cold phase's copy is kept on disk
    # and readers run: every process, the mount and the copy must go. The
    # signal goes once the phase's first step ran, after its readers were
    # forked: one arriving during a fork is lost (see the report).
    config = write_config(tmp_path, open_ms=1, prefetchers=4, readers=1, loader="analyze_helpers:slow_npy")
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([REPO, HELPERS, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(stager_cmd("analyze", config, "--batches", "15", "--keep-page-cache",
                                       "--step", "analyze_helpers:announcing_step"),
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        staged = False
        for line in proc.stderr:
            staged = staged or line.startswith("stager analyze: staged:")
            if staged and line.startswith("analyze_helpers: step"):
                break
        assert os.listdir(tmp_path / "local"), "the cold phase's copy should be there during the staged phase"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert not slowfs_mounts(tmp_path)
    assert os.listdir(tmp_path / "local") == []
