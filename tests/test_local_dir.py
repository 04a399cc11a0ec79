"""Node-local directories stager must not stage into: each refused at start by a ``stager`` error that names
the key and the path, with no traceback and nothing staged."""

import os
import subprocess

import pytest

from conftest import make_job_data, stager_cmd
from test_cli import own_tmp


def run(tmp_path, local, *args, env=None):
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: data, manifest: manifest.tsv}}
synthetic: {{samples: 20, bytes: 2000}}
plan: {{batch_size: 4, epochs: 1}}
staging: {{local_dir: {local}}}
""")
    if not (tmp_path / "data").exists():
        make_job_data(tmp_path / "job.yaml")
    return subprocess.run(stager_cmd("run", str(tmp_path / "job.yaml"), "--quiet", *args), capture_output=True,
                          text=True, timeout=120, env=dict(own_tmp(tmp_path), **(env or {})))


def refused(proc, *texts):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("stager: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for text in texts:
        assert text in proc.stderr


def test_a_file_is_refused(tmp_path):
    (tmp_path / "nvme").write_text("not a directory")
    refused(run(tmp_path, tmp_path / "nvme"), f"staging.local_dir {tmp_path / 'nvme'} is not a directory")
    assert (tmp_path / "nvme").read_text() == "not a directory"


def test_a_missing_base_is_created_but_not_a_missing_parent(tmp_path):
    missing = tmp_path / "no" / "such"
    refused(run(tmp_path, missing), f"staging.local_dir {missing} does not exist, nor does its parent {missing.parent}")
    assert not missing.parent.exists()
    proc = run(tmp_path, tmp_path / "nvme")
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path / "nvme") == [] and (os.stat(tmp_path / "nvme").st_mode & 0o777) == 0o700


def test_a_read_only_file_system_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], check=True)
    try:
        refused(run(tmp_path, mnt), f"staging.local_dir {mnt} is not writable: Read-only file system")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_base_of_another_user_is_refused(tmp_path):
    other = tmp_path / "theirs"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    refused(run(tmp_path, other), f"staging.local_dir {other} belongs to", "uid 65534", "not to you or root")
    assert os.listdir(other) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a link owned by another user needs root")
def test_a_symbolic_link_of_another_user_is_refused_and_ones_own_followed(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.lchown(tmp_path / "link", 65534, 65534)
    refused(run(tmp_path, tmp_path / "link"), f"staging.local_dir {tmp_path / 'link'} is a symbolic link owned by")
    assert os.listdir(tmp_path / "real") == []
    os.lchown(tmp_path / "link", os.getuid(), os.getgid())
    proc = run(tmp_path, tmp_path / "link")
    assert proc.returncode == 0, proc.stderr


def test_a_world_writable_base_needs_the_sticky_bit(tmp_path):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    refused(run(tmp_path, tmp_path / "open"), f"staging.local_dir {tmp_path / 'open'} is writable by every user "
                                              "but lacks the sticky bit (mode 777)")
    assert os.listdir(tmp_path / "open") == []
    os.chmod(tmp_path / "open", 0o1777)  # as /tmp
    proc = run(tmp_path, tmp_path / "open")
    assert proc.returncode == 0, proc.stderr


def test_the_environment_variable_is_named_when_it_chose_the_base(tmp_path):
    (tmp_path / "nvme").write_text("")
    refused(run(tmp_path, tmp_path / "unused", env={"STAGER_LOCAL_DIR": str(tmp_path / "nvme")}),
            f"$STAGER_LOCAL_DIR {tmp_path / 'nvme'} is not a directory")


def test_a_job_directory_holding_files_stager_did_not_write_is_refused_and_kept(tmp_path):
    mine = tmp_path / "nvme" / "stager-results"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my own work")
    refused(run(tmp_path, tmp_path / "nvme", "--set", "staging.job_id=results"),
            f"staging directory {mine} exists and holds files stager did not write (notes.txt); "
            "stager never deletes them")
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "my own work"
