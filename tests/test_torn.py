"""Torn copies: a source file rewritten in place while it is copied is never published torn.

The copy is made slow by the FUSE emulator's bandwidth cap; the file is
rewritten (at the same size) in the tree under the emulator once the copy
is under way, so what the emulator serves changes mid-copy.
"""

import contextlib
import glob
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import REPO, make_config, stager_workers

from stager.catalog import Catalog
from stager.engine import Pipeline
from stager.errors import ConfigError, StageError
from stager.slowfs import SlowFS
from stager.sources import PosixSource, SourceChanged
from stager.sources.verify import check_mode

SIZE = 4 << 20  # 0.5 s through the emulator at 8 MB/s


def _write_file(path, seed):
    data = np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    with open(path, "wb") as fh:
        fh.write(data)
    os.utime(path, ns=(10**18, 10**18))  # times well in the past: any write moves them
    return data


def rewrite(path):
    """In place: same inode, same size, new content and times."""
    with open(path, "r+b") as fh:
        fh.write(os.urandom(SIZE))


def truncate(path):
    os.truncate(path, SIZE // 2)


def extend(path):
    with open(path, "ab") as fh:
        fh.write(os.urandom(1 << 20))


CHANGES = {"truncated": truncate, "extended": extend, "rewritten": rewrite}


class Rewriter(threading.Thread):
    """Changes a file (``change``, by default ``rewrite``) once a copy of it (``pattern``'s temporary file) passes 256 KiB."""

    def __init__(self, path, pattern, timeout_s=60.0, change=rewrite):
        super().__init__(daemon=True)
        self.path, self.pattern, self.deadline = path, pattern, time.monotonic() + timeout_s
        self.change = change
        self.new = None

    def run(self):
        while time.monotonic() < self.deadline:
            if any(_size(p) >= 256 << 10 for p in glob.glob(self.pattern, recursive=True)):
                break
            time.sleep(0.001)  # polls the copy's progress: no event tells another process's file size
        else:
            return
        self.change(self.path)
        with open(self.path, "rb") as fh:
            self.new = fh.read()


def _size(path):
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


@pytest.fixture
def slow_tree(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    old = _write_file(root / "big.bin", 1)
    (tmp_path / "mnt").mkdir()
    with SlowFS(str(root), str(tmp_path / "mnt"), open_ms=0, mbps=8) as mnt:
        yield str(root), mnt, old


@pytest.mark.parametrize("verify", ["size", "xxhash"])
def test_a_file_rewritten_during_its_copy_is_copied_again_whole(slow_tree, tmp_path, verify):
    root, mnt, old = slow_tree
    dst = str(tmp_path / "dst")
    writer = Rewriter(os.path.join(root, "big.bin"), os.path.join(dst, ".big.bin.*.part"))
    writer.start()
    assert PosixSource(mnt, verify).fetch("big.bin", SIZE, None, dst) == SIZE
    writer.join()
    assert writer.new is not None and writer.new != old, "the rewrite did not happen during the copy"
    with open(os.path.join(dst, "big.bin"), "rb") as fh:
        assert fh.read() == writer.new  # the second attempt, after the writer was done
    assert os.listdir(dst) == ["big.bin"]


def test_without_checks_the_same_rewrite_publishes_a_torn_copy(slow_tree, tmp_path):
    # The fault itself, so the test above is known to race: verify: none
    # publishes the old head and the new tail, matching neither version.
    root, mnt, old = slow_tree
    dst = str(tmp_path / "dst")
    writer = Rewriter(os.path.join(root, "big.bin"), os.path.join(dst, ".big.bin.*.part"))
    writer.start()
    PosixSource(mnt, "none").fetch("big.bin", SIZE, None, dst)
    writer.join()
    with open(os.path.join(dst, "big.bin"), "rb") as fh:
        copy = fh.read()
    assert copy[:256 << 10] == old[:256 << 10] and copy[-1024:] == writer.new[-1024:]


def _catalog_entry(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("where", ["emulator", "directory"])
def test_a_file_changed_after_the_catalog_is_never_copied(slow_tree, tmp_path, change, where):
    # The open's own attributes (one plain fstat, as a direct read asks) tell
    # the change; on the emulator the kernel cached the old ones at the
    # catalog's stat, as a Lustre client does until a writer revokes them.
    root, mnt, _ = slow_tree
    source_root = mnt if where == "emulator" else root
    size, mtime_ns = _catalog_entry(os.path.join(source_root, "big.bin"))
    CHANGES[change](os.path.join(root, "big.bin"))
    dst = str(tmp_path / "dst")
    with pytest.raises(SourceChanged) as info:
        PosixSource(source_root).fetch("big.bin", size, mtime_ns, dst)
    assert os.path.join(source_root, "big.bin") in str(info.value)
    assert "changed since the catalog was made" in str(info.value)
    assert not os.path.exists(dst) or not os.listdir(dst)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_file_changed_during_its_copy_through_the_emulator_is_never_published(slow_tree, tmp_path, change):
    root, mnt, _ = slow_tree
    size, mtime_ns = _catalog_entry(os.path.join(mnt, "big.bin"))
    dst = str(tmp_path / "dst")
    writer = Rewriter(os.path.join(root, "big.bin"), os.path.join(dst, ".big.bin.*.part"), change=CHANGES[change])
    writer.start()
    with pytest.raises(SourceChanged) as info:
        PosixSource(mnt).fetch("big.bin", size, mtime_ns, dst)
    writer.join()
    assert writer.new is not None, "the change did not happen during the copy"
    assert f"{os.path.join(mnt, 'big.bin')} changed during the copy" in str(info.value)
    assert "changed since the catalog was made" in str(info.value)
    assert os.listdir(dst) == []


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_file_changed_during_its_copy_from_a_directory_is_never_published(tmp_path, monkeypatch, change):
    # A local copy is over in a millisecond: the change is made between the
    # copy's first 256 KiB and the rest, by the real sendfile's caller.
    path = tmp_path / "data" / "big.bin"
    path.parent.mkdir()
    _write_file(path, 3)
    size, mtime_ns = _catalog_entry(path)
    sendfile, changed = os.sendfile, []

    def sendfile_then_change(out_fd, in_fd, offset, count):
        if changed:
            return sendfile(out_fd, in_fd, offset, count)
        sent = sendfile(out_fd, in_fd, offset, min(count, 256 << 10))
        CHANGES[change](str(path))
        changed.append(sent)
        return sent

    monkeypatch.setattr(os, "sendfile", sendfile_then_change)
    dst = str(tmp_path / "dst")
    with pytest.raises(SourceChanged) as info:
        PosixSource(str(tmp_path / "data")).fetch("big.bin", size, mtime_ns, dst)
    assert changed == [256 << 10]
    assert f"{path} changed during the copy" in str(info.value)
    assert os.listdir(dst) == []


def test_a_job_whose_file_is_rewritten_during_its_copy_fails_naming_it(tmp_path):
    # With a catalog, the rewritten file also differs from it: the retry
    # cannot succeed, and the job stops with the file named, nothing torn published.
    root = tmp_path / "data"
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        _write_file(root / name / "x.bin", ord(name))
    (tmp_path / "mnt").mkdir()
    with SlowFS(str(root), str(tmp_path / "mnt"), open_ms=0, mbps=8) as mnt:
        cfg = make_config(mnt, tmp_path / "local", dataset={"manifest": None, "loader": "raw"},
                          plan={"batch_size": 1, "shuffle": False}, staging={"prefetchers": 1, "lookahead": 1})
        catalog = Catalog.load(cfg.dataset)
        assert catalog.paths() == ["a/x.bin", "b/x.bin", "c/x.bin"]
        writer = Rewriter(str(root / "b" / "x.bin"), str(tmp_path / "local" / "**" / "b" / ".x.bin.*.part"))
        writer.start()
        pipe = Pipeline(cfg, catalog)
        with pytest.raises(StageError) as info:
            with pipe:
                list(pipe)
        writer.join()
    err = info.value
    assert writer.new is not None
    assert err.path == "b/x.bin" and os.path.join(mnt, "b/x.bin") in str(err)
    assert "changed during the copy" in err.message and "catalog" in err.message
    assert not stager_workers() and not os.path.exists(pipe.local_dir)


@contextlib.contextmanager
def flipfs(root, mnt, bad_opens):
    """Mounts tests/flipfs.py (reads of a file's first ``bad_opens`` opens are corrupt) for a block."""
    os.mkdir(mnt)
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "flipfs.py"), root, mnt,
                             "--bad-opens", str(bad_opens), "--ready-fd", str(ready_w)], pass_fds=[ready_w])
    os.close(ready_w)
    try:
        with os.fdopen(ready_r, "rb") as ready:
            assert ready.readline() == b"ready\n", "flipfs did not mount"
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        proc.wait(timeout=30)


@pytest.mark.parametrize("bad_opens,outcome", [(3, "whole"), (100, "refused")])
def test_verify_xxhash_catches_bytes_that_differ_between_reads(tmp_path, bad_opens, outcome):
    (tmp_path / "data").mkdir()
    good = _write_file(tmp_path / "data" / "s.bin", 7)
    with flipfs(str(tmp_path / "data"), str(tmp_path / "mnt"), bad_opens) as mnt:
        # Size and times never move here: the stat checks publish the bad read.
        PosixSource(mnt, "size").fetch("s.bin", SIZE, None, str(tmp_path / "by-size"))
        with open(tmp_path / "by-size" / "s.bin", "rb") as fh:
            assert fh.read() != good
        source = PosixSource(mnt, "xxhash")
        if outcome == "whole":
            assert source.fetch("s.bin", SIZE, None, str(tmp_path / "dst")) == SIZE
            with open(tmp_path / "dst" / "s.bin", "rb") as fh:
                assert fh.read() == good
        else:
            with pytest.raises(SourceChanged, match=r"/s\.bin changed during each of 3 copies.*xxh3 of the copy "
                                                    r"[0-9a-f]+ differs from a second read's"):
                source.fetch("s.bin", SIZE, None, str(tmp_path / "dst"))
            assert not os.listdir(tmp_path / "dst")


def test_verify_modes_are_checked_by_name(monkeypatch):
    with pytest.raises(ConfigError, match=r"staging.verify must be one of \['none', 'size', 'xxhash'\], not 'md5'"):
        make_config("/data", "/tmp", staging={"verify": "md5"})
    monkeypatch.setitem(sys.modules, "xxhash", None)  # as if not installed
    with pytest.raises(ConfigError, match="staging.verify: xxhash needs the xxhash package: pip install xxhash"):
        check_mode("xxhash")
