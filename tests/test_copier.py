"""Copying one file: atomic publication, skip when present, full disks."""

import errno
import os

import pytest
from conftest import load_catalog, make_config, size_limited_tmpfs

from stager.engine import Pipeline
from stager.errors import StageError
from stager.sources import PosixSource


def stage_file(src_root, dst_root, rel, size):
    return PosixSource(src_root).fetch(rel, size, None, dst_root)


def test_copy_publishes_once_and_skips_a_complete_copy(tmp_path):
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "x.bin").write_bytes(b"a" * 5000)
    dst = tmp_path / "dst"
    assert stage_file(str(tmp_path / "src"), str(dst), "d/x.bin", 5000) == 5000
    assert (dst / "d" / "x.bin").read_bytes() == b"a" * 5000
    assert os.listdir(dst / "d") == ["x.bin"]
    assert stage_file(str(tmp_path / "src"), str(dst), "d/x.bin", 5000) is None


@pytest.fixture
def tiny_tmpfs(tmp_path):
    with size_limited_tmpfs(tmp_path / "nvme", "64k") as mnt:
        yield mnt


def test_full_local_disk_names_the_file_and_leaves_no_partial_copy(tmp_path, tiny_tmpfs):
    # With staging.capacity unbounded (by name) nothing is evicted, and a full disk ends the run.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"s{i}.bin").write_bytes(bytes([i]) * 20_000)
    cfg = make_config(str(src), tiny_tmpfs, dataset={"manifest": None, "loader": "raw"},
                      plan={"shuffle": False, "batch_size": 2},
                      staging={"prefetchers": 1, "keep": True, "capacity": "unbounded"})  # asked not to bound it
    pipe = Pipeline(cfg, load_catalog(cfg))
    with pytest.raises(StageError) as info:
        with pipe:
            list(pipe)
    err = info.value
    assert err.stage == "prefetch" and err.cause == "OSError" and os.strerror(errno.ENOSPC) in str(err)
    assert err.path.startswith("s")
    listing = sorted(os.listdir(pipe.local_dir))
    assert not [f for f in listing if f.endswith(".part")]
    staged = [f for f in listing if not f.startswith(".")]  # .lock is the directory's own
    assert err.path not in staged
    for name in staged:
        assert (tmp_path / "src" / name).read_bytes() == (tiny_tmpfs / pipe.local_dir / name).read_bytes()


def test_a_staging_directory_in_use_is_refused(tmp_path):
    from stager.config import StagingConfig
    from stager.errors import ConfigError
    from stager.storage import JobDir
    from stager.world import World

    staging = StagingConfig(local_dir=str(tmp_path / "nvme"), job_id="42.0")
    first = JobDir(staging, str(tmp_path / "src"), "42.0", World())
    path = first.create()
    assert os.path.basename(path) == "stager-42.0" and (os.stat(path).st_mode & 0o777) == 0o700
    second = JobDir(staging, str(tmp_path / "src"), "42.0", World())
    with pytest.raises(ConfigError, match="in use by another job or job step"):
        second.create()
    first.remove()
    assert not os.path.exists(path)
    assert second.create() == path
    second.remove()
    second.remove()
