"""The catalog file: built once (serially or by MPI ranks in parallel), mapped read-only, or broadcast when small."""

import logging
import os

import numpy as np
import pytest
from conftest import make_config
from test_mpi_run import MPIEXEC, SAMPLES, mpirun, read_records, write_job

from stager import plan
from stager.catalog import Catalog, MappedCatalog, agreed_catalog, build_catalog, write_catalog
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.errors import CatalogError, ConfigError


@pytest.mark.parametrize("labelled,timed", [(True, True), (False, False), (True, False)])
def test_a_written_catalog_maps_back_equal(tmp_path, labelled, timed):
    paths = ["a/x.npy", "b/é.npy", "c/longer/name.npy"]
    catalog = Catalog.from_paths(str(tmp_path), paths, [10, 2**40, 0], [0, 1, 2] if labelled else None,
                                 [5, 6, 7] if timed else None)
    write_catalog(catalog, str(tmp_path / "c.cat"))
    mapped = MappedCatalog(str(tmp_path / "c.cat"))
    assert mapped == catalog and mapped.paths() == paths and mapped.total_bytes == catalog.total_bytes
    assert [mapped.label(i) for i in range(3)] == [catalog.label(i) for i in range(3)]
    assert [mapped.mtime(i) for i in range(3)] == [catalog.mtime(i) for i in range(3)]
    assert not mapped.sizes.flags.owndata and not mapped.sizes.flags.writeable  # a view of the mapping
    assert mapped.rooted("/elsewhere").root == "/elsewhere" and mapped.rooted("/elsewhere").path(1) == "b/é.npy"
    assert os.listdir(tmp_path) == ["c.cat"]  # no temporary file left


def test_a_damaged_catalog_file_is_refused_naming_it(tmp_path):
    catalog = Catalog.from_paths(str(tmp_path), ["a", "b"], [1, 2])
    good = str(tmp_path / "c.cat")
    write_catalog(catalog, good)
    cut = tmp_path / "cut.cat"
    cut.write_bytes(open(good, "rb").read()[:-1])
    with pytest.raises(CatalogError, match=r"cut\.cat: .* truncated or damaged"):
        MappedCatalog(str(cut))
    (tmp_path / "other.cat").write_bytes(b"x" * 100)
    with pytest.raises(CatalogError, match=r"other\.cat is not a stager catalog file"):
        MappedCatalog(str(tmp_path / "other.cat"))
    with pytest.raises(CatalogError, match=r"cannot read catalog file .*missing\.cat"):
        MappedCatalog(str(tmp_path / "missing.cat"))


def test_a_serial_build_lists_what_a_scan_lists(dataset, tmp_path):
    root, _ = dataset
    out = str(tmp_path / "c.cat")
    assert build_catalog(root, out, [".npy"])[0] == 100
    scanned = Catalog.load(config_from_dict({"dataset": {"source": root, "extensions": [".npy"]}}).dataset)
    assert MappedCatalog(out) == scanned and scanned.labels is not None


@pytest.mark.parametrize("broadcast_max,said", [(1000, "read on rank 0 and broadcast"),
                                                 (10, "memory-mapped on every rank")])
def test_the_catalog_path_is_chosen_by_size_and_logged(dataset, tmp_path, caplog, broadcast_max, said):
    root, manifest = dataset
    out = str(tmp_path / "c.cat")
    build_catalog(root, out, manifest=manifest)
    cfg = config_from_dict({"dataset": {"source": "/mnt/elsewhere", "catalog": out, "broadcast_max": broadcast_max}})
    with caplog.at_level(logging.INFO, logger="stager"):
        catalog = agreed_catalog(None, cfg.dataset)
    assert said in caplog.text and "100 entries" in caplog.text
    assert catalog.root == "/mnt/elsewhere"  # samples are read where dataset.source says
    assert catalog.rooted(root) == Catalog.from_manifest(root, manifest)


def test_catalog_keys_are_checked():
    with pytest.raises(ConfigError, match="dataset.broadcast_max"):
        config_from_dict({"dataset": {"broadcast_max": -1}})


def test_a_pipeline_reads_through_a_mapped_catalog(slow_source, dataset, tmp_path):
    root, manifest = dataset
    out = str(tmp_path / "c.cat")
    build_catalog(root, out, manifest=manifest)
    cfg = make_config(slow_source, tmp_path / "local", dataset={"loader": "raw", "catalog": out, "broadcast_max": 0},
                      plan={"epochs": 2, "shuffle_algorithm": "feistel"})
    seen = []
    with Pipeline(cfg) as pipe:
        assert isinstance(pipe.catalog, MappedCatalog) and pipe.catalog.root == slow_source
        for batch in pipe:
            seen.append((batch.epoch, batch.step, batch.indices.tolist()))
            for i, (data, label) in zip(batch.indices, batch.samples):
                with open(os.path.join(root, pipe.catalog.path(i)), "rb") as fh:
                    assert data == fh.read()
                assert label == pipe.catalog.label(i)
    assert seen == [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(100, cfg.plan)]


needs_mpi = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec at {MPIEXEC}")


@needs_mpi
def test_ranks_build_the_same_file_in_parallel_and_fail_together(dataset, tmp_path):
    root, _ = dataset
    serial, parallel = str(tmp_path / "serial.cat"), str(tmp_path / "parallel.cat")
    build_catalog(root, serial)
    for ranks in (2, 3, 7):  # 7 ranks for 5 class directories: some ranks scan nothing
        proc = mpirun([("a", ranks)], ["catalog", "build", root, "-o", parallel], tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{ranks} rank(s)" in proc.stdout
        assert open(serial, "rb").read() == open(parallel, "rb").read()
    proc = mpirun([("a", 3)], ["catalog", "build", root, "-o", str(tmp_path / "no" / "c.cat")], tmp_path,
                  timeout=120)
    assert proc.returncode != 0 and "rank 0" in proc.stderr and "No such file or directory" in proc.stderr
    assert not os.path.exists(tmp_path / "no")


@needs_mpi
def test_four_ranks_on_two_nodes_follow_the_plan_through_a_mapped_catalog(tmp_path):
    job = write_job(tmp_path)
    first = mpirun([("a", 1)], ["run", job, "--quiet", "--set", "run.max_batches=1"], tmp_path)  # makes the data
    assert first.returncode == 0, first.stderr
    out = str(tmp_path / "c.cat")
    proc = mpirun([("a", 2)], ["catalog", "build", str(tmp_path / "data"), "-o", out, "--manifest", "manifest.tsv"],
                  tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = tmp_path / "rec"
    proc = mpirun([("a", 2), ("b", 2)], ["run", job, "--quiet", "--record", str(rec), "--set", f"dataset.catalog={out}",
                                         "--set", "dataset.broadcast_max=10", "--set", "plan.shuffle_algorithm=feistel"],
                  tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("memory-mapped on every rank") == 1  # rank 0 says so, once
    reads, _ = read_records(rec)
    catalog = MappedCatalog(out)
    cfg = config_from_dict({"plan": {"batch_size": 8, "epochs": 2, "seed": 7, "shuffle_algorithm": "feistel"}}).plan
    for r, lines in reads.items():
        expected = [[catalog.path(i) for i in m.indices] for m in plan.iterate(SAMPLES, cfg, rank=r, size=4)]
        assert [line["samples"] for line in lines] == expected, f"rank {r} did not follow the plan"
