"""The examples, run as the README says, on a small synthetic dataset behind
the emulated slow file system."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def overrides(tmp_path):
    return ["--set", "synthetic.samples=96", "--set", "synthetic.bytes=20000", "--set",
            f"dataset.source={tmp_path / 'data'}", "--set", f"staging.local_dir={tmp_path / 'local'}",
            "--set", "slowfs.open_ms=1"]


def jpeg_folder(tmp_path, samples=96):
    """An ImageFolder of real JPEGs, made by the command that exists to make one."""
    data = str(tmp_path / "imgs")
    subprocess.run([sys.executable, "-m", "stager", "make-dataset", data, "--samples", str(samples), "--format", "jpeg",
                    "--bytes", "20000", "--classes", "4", "--quiet"], check=True, timeout=120)
    return data


def torch_example(data, tmp_path, *extra):
    return [os.path.join(REPO, "examples", "train_torch.py"), data, "--epochs", "2", "--batch-size", "16",
            "--image-size", "32", "--set", f"staging.local_dir={tmp_path / 'local'}", *extra]


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec (install .[mpich])")
@pytest.mark.parametrize("loader", ["stager", "dataloader"])
def test_torch_example_trains_with_ddp_on_two_ranks(tmp_path, loader):
    (tmp_path / "local").mkdir()
    cmd = [MPIEXEC, "-n", "2", sys.executable, *torch_example(jpeg_folder(tmp_path), tmp_path, "--loader", loader)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "epoch 1: loss" in proc.stdout and "48 samples on rank 0" in proc.stdout and f"({loader})" in proc.stdout
    assert "2 replicas in sync after 2 epoch(s)" in proc.stdout
    assert os.listdir(tmp_path / "local") == []


def test_chainer_example_trains_with_a_trainer(tmp_path):
    pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
    # The demo config's dataset, made by the command that makes it (a run never does).
    subprocess.run([sys.executable, "-m", "stager", "make-dataset", "--config", os.path.join(REPO, "configs", "demo.yaml"),
                    "--quiet", *overrides(tmp_path)], check=True, timeout=120)
    cmd = [sys.executable, os.path.join(REPO, "examples", "train_chainer.py"),
           os.path.join(REPO, "configs", "demo.yaml"), "--epochs", "2", "--batch-size", "16",
           "--out", str(tmp_path / "result"), *overrides(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # PrintReport starts each row with a terminal escape (ESC [J).
    lines = [line.replace("\x1b[J", "") for line in proc.stdout.splitlines() if line.strip()]
    assert lines[0].split()[:3] == ["epoch", "iteration", "main/loss"]
    assert lines[-1].split()[:2] == ["2", "12"]  # 96 samples / 16 per batch x 2 epochs
    assert os.listdir(tmp_path / "local") == []


@pytest.mark.parametrize("launch", ["ddp", "mpiexec"])
def test_lightning_example_trains_with_its_datamodule(tmp_path, launch):
    pytest.importorskip("lightning", reason="Lightning is not installed (extra 'stacks')")
    if launch == "mpiexec" and not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec (install .[mpich])")
    (tmp_path / "local").mkdir()
    script = [sys.executable, os.path.join(REPO, "examples", "train_lightning.py"), jpeg_folder(tmp_path),
              "--epochs", "2", "--batch-size", "8", "--image-size", "32", "--devices", "2"]
    cmd = [MPIEXEC, "-n", "2", *script] if launch == "mpiexec" else script
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, STAGER_LOCAL_DIR=str(tmp_path / "local")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 96 samples, 2 ranks, 8 a batch, drop_last: 6 steps an epoch on each rank.
    assert "trained 2 epoch(s) of 6 steps on 2 process(es) (stager)" in proc.stdout
    assert os.listdir(tmp_path / "local") == []
