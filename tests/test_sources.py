"""The source room: choosing a source by scheme, and the POSIX source's fetch."""

import os

import pytest

from stager.errors import ConfigError
from stager.sources import PosixSource, SourceChanged, open_source


def test_a_plain_path_or_file_url_is_a_posix_source_and_other_schemes_are_named(tmp_path):
    assert isinstance(open_source(str(tmp_path)), PosixSource)
    assert open_source(f"file://{tmp_path}").root == str(tmp_path)
    with pytest.raises(ConfigError, match=r"no source for scheme 'gopher'.*file://"):
        open_source("gopher://host/data")


def test_a_source_that_changed_size_is_refused_and_nothing_is_published(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.bin").write_bytes(b"abc")
    source = PosixSource(str(tmp_path / "src"))
    with pytest.raises(SourceChanged, match="catalog says 5"):
        source.fetch("x.bin", 5, None, str(tmp_path / "dst"))
    assert not os.path.exists(tmp_path / "dst" / "x.bin")
    assert source.fetch("x.bin", 3, None, str(tmp_path / "dst")) == 3
    assert source.describe("x.bin") == str(tmp_path / "src" / "x.bin")


def test_publishing_never_writes_outside_the_staging_directory(tmp_path):
    from stager.sources import publish

    for rel in ("../escape.bin", "/tmp/escape.bin", "a/../../escape.bin"):
        with pytest.raises(ValueError, match="would leave the staging directory"):
            publish(str(tmp_path / "dst"), rel, 1, lambda fd: os.write(fd, b"x"))
    assert not (tmp_path / "escape.bin").exists() and not (tmp_path / "dst").exists()


def test_publishing_makes_missing_directories_and_leaves_no_temporary_file(tmp_path):
    from stager.sources import publish

    dst = tmp_path / "dst"
    for rel, body in (("a/b/one.bin", b"1"), ("a/b/two.bin", b"22"), ("a/c/three.bin", b"333"), ("top.bin", b"")):
        assert publish(str(dst), rel, len(body), lambda fd, body=body: os.write(fd, body)) == len(body)
        assert (dst / rel).read_bytes() == body
    assert (os.stat(dst / "a" / "b").st_mode & 0o777) == 0o700
    # The first file of a directory removed since (by hand) makes it again.
    os.remove(dst / "a" / "c" / "three.bin")
    os.rmdir(dst / "a" / "c")
    assert publish(str(dst), "a/c/four.bin", 1, lambda fd: os.write(fd, b"4")) == 1
    left = sorted(os.path.relpath(os.path.join(d, f), dst) for d, _, fs in os.walk(dst) for f in fs)
    assert left == ["a/b/one.bin", "a/b/two.bin", "a/c/four.bin", "top.bin"]
