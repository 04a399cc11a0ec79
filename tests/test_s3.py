"""Staging from an S3-compatible bucket: a real moto server on loopback, the latency proxy, boto3."""

import json
import os
import random
import subprocess
import time

import boto3
import pytest
from conftest import load_catalog, make_config, stager_cmd

from stager import plan
from stager.catalog import Catalog
from stager.config import load_config
from stager.engine import Pipeline
from stager.errors import CatalogError, StageError
from stager.slows3 import Fault, ObjectStore, SlowProxy
from stager.slows3.server import CREDENTIALS
from stager.sources import S3Source, open_source

BUCKET = "stager-data"
SAMPLES = 300


def make_objects(seed=5, n=SAMPLES, classes=4):
    rng = random.Random(seed)
    return {f"c{i % classes}/s{i:04d}.bin": rng.randbytes(rng.randint(500, 3000)) for i in range(n)}


@pytest.fixture(scope="module")
def store():
    """A moto server holding ``s3://stager-data/train/`` (300 objects in 4 class "directories")."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in CREDENTIALS.items():
            env.setenv(name, value)
        with ObjectStore() as server:
            s3 = boto3.client("s3", endpoint_url=server.endpoint_url)
            s3.create_bucket(Bucket=BUCKET)
            objects = make_objects()
            for rel, data in objects.items():
                s3.put_object(Bucket=BUCKET, Key=f"train/{rel}", Body=data)
            server.objects, server.s3 = objects, s3
            yield server


def s3_config(endpoint, local_dir, source=f"s3://{BUCKET}/train", **sections):
    dataset = {"source": source, "manifest": None, "loader": "raw", "endpoint_url": endpoint,
               "requests_in_flight": 8, "retries": 3, "request_timeout_s": 5.0}
    dataset.update(sections.pop("dataset", {}))
    plan_cfg = {"batch_size": 8, "epochs": 2}
    plan_cfg.update(sections.pop("plan", {}))
    return make_config("", local_dir, dataset=dataset, plan=plan_cfg, **sections)


def run(cfg, catalog=None):
    catalog = catalog or load_catalog(cfg)
    seen, samples = [], []
    with Pipeline(cfg, catalog) as pipe:
        for batch in pipe:
            seen.append((batch.epoch, batch.step, batch.indices.tolist()))
            samples.append(batch.samples)
        return catalog, seen, samples, pipe.stats


def check_delivery(cfg, catalog, seen, samples, objects):
    """Every sample once per epoch, in plan order, with the bucket's bytes and its directory's label."""
    assert seen == [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    for epoch in range(cfg.plan.epochs):
        assert sorted(i for e, _, idx in seen if e == epoch for i in idx) == list(range(len(catalog)))
    for (_, _, idx), batch in zip(seen, samples):
        for i, (data, label) in zip(idx, batch):
            rel = catalog.path(i)
            assert data == objects[rel], rel
            assert label == int(rel.split("/")[0][1:])


def test_a_bucket_prefix_survives_config_loading_and_the_catalog(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(f"dataset:\n  source: s3://{BUCKET}/train/\n  endpoint_url: http://127.0.0.1:9\n")
    cfg = load_config(str(path))
    assert cfg.dataset.source == f"s3://{BUCKET}/train/"
    source = open_source(cfg.dataset.source, cfg.dataset)
    assert isinstance(source, S3Source) and source.root == f"s3://{BUCKET}/train"
    assert source.describe("c0/x.bin") == f"s3://{BUCKET}/train/c0/x.bin" and source.local_root is None
    assert Catalog.from_paths(source.root, ["a"], [1]).root == f"s3://{BUCKET}/train"


def test_listing_pages_through_more_objects_than_one_page_and_reads_a_manifest(store):
    source = S3Source(f"s3://{BUCKET}/train", store.endpoint_url, page_size=50)
    listing = source.scan()
    assert listing.paths == sorted(store.objects, key=lambda rel: rel.split("/"))
    assert listing.sizes == [len(store.objects[p]) for p in listing.paths]
    assert listing.labels == [int(p[1]) for p in listing.paths]
    chosen = listing.paths[::-7]
    store.s3.put_object(Bucket=BUCKET, Key="lists/some.tsv",
                        Body="".join(f"{rel}\t{n}\n" for n, rel in enumerate(chosen)).encode())
    from_manifest = source.read_manifest(f"s3://{BUCKET}/lists/some.tsv")
    assert from_manifest.paths == chosen and from_manifest.labels == list(range(len(chosen)))
    assert from_manifest.sizes == [len(store.objects[p]) for p in chosen]
    store.s3.put_object(Bucket=BUCKET, Key="lists/bad.tsv", Body=b"c0/s0000.bin\nc9/none.bin\n")
    with pytest.raises(CatalogError, match=rf"lists/bad.tsv:2: no object s3://{BUCKET}/train/c9/none.bin"):
        source.read_manifest(f"s3://{BUCKET}/lists/bad.tsv")
    with pytest.raises(CatalogError, match=rf"s3://{BUCKET}/empty holds no samples"):
        S3Source(f"s3://{BUCKET}/empty", store.endpoint_url).scan()


@pytest.mark.parametrize("capacity", [None, "25%"])
def test_staged_samples_are_the_buckets_bytes_in_plan_order(store, tmp_path, capacity):
    with SlowProxy(store.port, latency_ms=5) as proxy:
        staging = {"capacity": None}
        if capacity:
            staging["capacity"] = str(sum(map(len, store.objects.values())) // 4)
        cfg = s3_config(proxy.endpoint_url, tmp_path / "local", staging=staging)
        catalog, seen, samples, stats = run(cfg)
    assert catalog.root == f"s3://{BUCKET}/train" and len(catalog) == SAMPLES
    check_delivery(cfg, catalog, seen, samples, store.objects)
    if capacity:  # a quarter of the bytes stays local: the second epoch fetches most again
        assert stats.files_staged > SAMPLES
    else:
        assert stats.files_staged == SAMPLES and stats.bytes_staged == catalog.total_bytes
    assert not os.listdir(tmp_path / "local"), "the job directory must be removed"


def test_one_prefetcher_with_many_tasks_in_flight_delivers_the_buckets_bytes_in_plan_order(store, tmp_path):
    # One file per task: a prefetcher holds up to requests_in_flight tasks
    # at once, and they finish in any order.
    with SlowProxy(store.port, latency_ms=5) as proxy:
        staging = {"prefetchers": 1, "files_per_task": 1,
                   "capacity": str(sum(map(len, store.objects.values())) // 4)}
        cfg = s3_config(proxy.endpoint_url, tmp_path / "local", staging=staging)
        catalog, seen, samples, stats = run(cfg)
    check_delivery(cfg, catalog, seen, samples, store.objects)
    assert stats.files_staged > SAMPLES
    assert not os.listdir(tmp_path / "local"), "the job directory must be removed"


def test_direct_reading_gets_each_object_from_the_bucket(store, tmp_path):
    with SlowProxy(store.port, latency_ms=5) as proxy:
        cfg = s3_config(proxy.endpoint_url, tmp_path / "local", staging={"enabled": False}, plan={"epochs": 1})
        catalog, seen, samples, stats = run(cfg)
    check_delivery(cfg, catalog, seen, samples, store.objects)
    assert stats.files_staged == 0 and not os.path.exists(tmp_path / "local")


def test_a_burst_of_503_slowdown_is_retried_and_every_sample_arrives(store, tmp_path):
    with SlowProxy(store.port, faults=[Fault(503, 12, r"/train/c[0-3]/")]) as proxy:
        cfg = s3_config(proxy.endpoint_url, tmp_path / "local", plan={"epochs": 1},
                        dataset={"retries": 4})
        catalog, seen, samples, stats = run(cfg)
        injected = proxy.log().count("injected 503")
    check_delivery(cfg, catalog, seen, samples, store.objects)
    assert injected == 12, "the whole burst must have been answered, and recovered from"


def small_bucket(store, name, n=40):
    store.s3.create_bucket(Bucket=name)
    objects = make_objects(seed=len(name), n=n)
    for rel, data in objects.items():
        store.s3.put_object(Bucket=name, Key=rel, Body=data)
    return objects


def expect_stage_error(cfg, catalog, match):
    with pytest.raises(StageError, match=match) as info:
        run(cfg, catalog)
    assert info.value.stage == "prefetch"
    return info.value


def test_a_missing_object_is_an_error_naming_the_key_and_the_bucket(store, tmp_path):
    small_bucket(store, "stager-missing")
    cfg = s3_config(store.endpoint_url, tmp_path / "local", source="s3://stager-missing")
    catalog = load_catalog(cfg)
    store.s3.delete_object(Bucket="stager-missing", Key="c1/s0005.bin")
    error = expect_stage_error(cfg, catalog, r"s3://stager-missing/c1/s0005.bin.*no such object \(404")
    assert error.path == "c1/s0005.bin"


def test_a_denied_object_is_an_error_naming_the_key_and_the_bucket(store, tmp_path):
    with SlowProxy(store.port, faults=[Fault(403, -1, r"/train/c2/s0006\.bin")]) as proxy:
        cfg = s3_config(proxy.endpoint_url, tmp_path / "local")
        expect_stage_error(cfg, None, rf"s3://{BUCKET}/train/c2/s0006.bin.*access denied \(403")


def test_a_server_killed_mid_run_is_a_clear_error_soon_and_leaves_nothing_partial(tmp_path):
    with pytest.MonkeyPatch.context() as env:
        for name, value in CREDENTIALS.items():
            env.setenv(name, value)
        with ObjectStore() as server:
            s3 = boto3.client("s3", endpoint_url=server.endpoint_url)
            s3.create_bucket(Bucket="stager-doomed")
            objects = make_objects(seed=9, n=200)
            for rel, data in objects.items():
                s3.put_object(Bucket="stager-doomed", Key=rel, Body=data)
            with SlowProxy(server.port, latency_ms=20) as proxy:
                cfg = s3_config(proxy.endpoint_url, tmp_path / "local", source="s3://stager-doomed",
                                dataset={"retries": 2, "request_timeout_s": 2.0},
                                plan={"batch_size": 4}, staging={"keep": True, "job_id": "doomed"})
                catalog = load_catalog(cfg)
                started = time.monotonic()
                with pytest.raises(StageError, match=r"s3://stager-doomed/.*gave up after 3 attempts") as info:
                    with Pipeline(cfg, catalog) as pipe:
                        for n, _ in enumerate(pipe):
                            if n == 2:
                                server.kill()
                waited = time.monotonic() - started
    assert info.value.stage == "prefetch" and info.value.path in objects
    assert waited < 60, f"the error took {waited:.0f} s"
    local = tmp_path / "local" / "stager-doomed"
    staged = [os.path.join(d, f) for d, _, files in os.walk(local) for f in files
              if f not in (".lock", ".service.sock")]  # the job directory's own files
    assert staged, "some minibatches were staged before the server went"
    for path in staged:  # whole objects only: no temporary file, no short copy
        rel = os.path.relpath(path, local)
        assert rel in objects, f"unexpected file {rel}"
        with open(path, "rb") as fh:
            assert fh.read() == objects[rel]


def test_stager_run_reads_a_bucket_from_the_command_line(store, tmp_path):
    report = tmp_path / "report.json"
    config = tmp_path / "job.yaml"
    config.write_text(f"dataset:\n  source: s3://{BUCKET}/train\n  loader: raw\n  endpoint_url: {store.endpoint_url}\n"
                      f"staging:\n  local_dir: {tmp_path / 'local'}\n  prefetchers: 2\n")
    done = subprocess.run(stager_cmd("run", str(config), "--report", str(report), "--set", "plan.batch_size=20"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    totals = json.loads(report.read_text())
    assert totals["samples"] == SAMPLES and totals["files_staged"] == SAMPLES


def test_a_bucket_scan_skips_its_own_manifest_and_a_manifest_listing_a_key_twice_is_refused(store):
    objects = small_bucket(store, "stager-listed", n=12)
    store.s3.put_object(Bucket="stager-listed", Key="manifest.tsv",
                        Body="".join(f"{rel}\n" for rel in objects).encode())
    source = S3Source("s3://stager-listed", store.endpoint_url)
    assert sorted(source.scan().paths) == sorted(objects)  # manifest.tsv is no sample
    assert source.read_manifest("manifest.tsv").paths == list(objects)
    first = next(iter(objects))
    store.s3.put_object(Bucket="stager-listed", Key="twice.tsv", Body=f"{first}\nc1/s0001.bin\n./{first}\n".encode())
    with pytest.raises(CatalogError, match=rf"twice.tsv:3: '{first}' is already listed at line 1"):
        source.read_manifest("twice.tsv")
