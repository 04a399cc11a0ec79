import os

import pytest

from stager.catalog import Catalog
from stager.errors import CatalogError


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


@pytest.fixture
def tree(tmp_path):
    for rel in ("cat/a.npy", "cat/b.npy", "dog/c.npy"):
        write(str(tmp_path / "root" / rel), "x" * (len(rel) + 1))
    return tmp_path / "root"


def test_manifest_with_labels(tree):
    write(str(tree / "list.tsv"), "# comment\ncat/a.npy\t0\n\ndog/c.npy\t1\n")
    cat = Catalog.from_manifest(str(tree), "list.tsv")
    assert cat.paths() == ["cat/a.npy", "dog/c.npy"]
    assert cat.labels.tolist() == [0, 1]
    assert cat.sizes.tolist() == [10, 10]


@pytest.mark.parametrize("line,message", [
    ("../etc/passwd", "contains '..'"),
    ("cat/../../x", "contains '..'"),
    ("/etc/passwd", "absolute path"),
    ("cat/missing.npy", "not readable"),
    ("cat/a.npy\tnotanint", "not an integer"),
    ("cat/a.npy\t1\t2", "3 fields"),
    ("cat/a\0.npy\t1", "holds a NUL byte, which no file name can"),
])
def test_manifest_rejects_bad_lines_with_their_line_number(tree, line, message):
    write(str(tree / "list.tsv"), f"cat/b.npy\t0\n{line}\n")
    with pytest.raises(CatalogError, match=message) as info:
        Catalog.from_manifest(str(tree), "list.tsv")
    assert "list.tsv:2" in str(info.value)


def test_manifest_rejects_a_symlink_leaving_the_root(tree, tmp_path):
    write(str(tmp_path / "outside.npy"), "secret")
    os.symlink(tmp_path / "outside.npy", tree / "cat" / "link.npy")
    write(str(tree / "list.tsv"), "cat/link.npy\n")
    with pytest.raises(CatalogError, match=r"list.tsv:1: 'cat/link.npy' resolves to .* outside the dataset root"):
        Catalog.from_manifest(str(tree), "list.tsv")


def test_manifest_mixing_labelled_and_unlabelled_lines(tree):
    write(str(tree / "list.tsv"), "cat/a.npy\t0\ncat/b.npy\n")
    with pytest.raises(CatalogError, match="list.tsv:2: every line needs a label or none does"):
        Catalog.from_manifest(str(tree), "list.tsv")


def test_empty_manifest_and_empty_directory(tmp_path):
    write(str(tmp_path / "list.tsv"), "# nothing\n")
    with pytest.raises(CatalogError, match="lists no samples"):
        Catalog.from_manifest(str(tmp_path), "list.tsv")
    os.mkdir(tmp_path / "empty")
    with pytest.raises(CatalogError, match="has no samples"):
        Catalog.from_directory(str(tmp_path / "empty"))
    with pytest.raises(CatalogError, match="not a directory"):
        Catalog.from_directory(str(tmp_path / "absent"))


def test_directory_scan_labels_by_class_directory(tree):
    write(str(tree / ".hidden" / "x.npy"), "x")
    cat = Catalog.from_directory(str(tree), extensions=[".npy"])
    assert cat.paths() == ["cat/a.npy", "cat/b.npy", "dog/c.npy"]
    assert cat.labels.tolist() == [0, 0, 1]


def test_directory_scan_without_classes_has_no_labels(tmp_path):
    write(str(tmp_path / "a.bin"), "1")
    write(str(tmp_path / "sub" / "b.bin"), "22")
    cat = Catalog.from_directory(str(tmp_path))
    assert cat.paths() == ["a.bin", "sub/b.bin"] and cat.labels is None
    assert cat.total_bytes == 3
