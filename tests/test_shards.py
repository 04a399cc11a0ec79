"""Samples packed in containers: tar shards (checked against webdataset's own reading) and HDF5 (against h5py)."""

import glob
import io
import os
import shutil
import subprocess
import sys
import tarfile

import h5py
import numpy as np
import pytest
import webdataset

from stager import Pipeline, ShardCatalog, plan
from stager.catalog import Catalog, load_catalog
from stager.config import config_from_dict
from stager.errors import CatalogError, ConfigError, StageError
from stager.job.packing import make_shards
from stager.model.misses import step_misses
from stager.plan.shuffles import ShardShuffle

from test_cache import belady_misses
from test_pack import assert_webdataset_reads_back
from test_s3 import s3_config, store  # noqa: F401  (the moto server fixture)

SAMPLES, PER_SHARD = 240, 24


@pytest.fixture(scope="module")
def tar_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("shards") / "tar")
    make_shards(out, "tar", SAMPLES, 3000, 5, 7, PER_SHARD, progress=False)
    return out


@pytest.fixture(scope="module")
def h5_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("shards") / "h5")
    make_shards(out, "hdf5", SAMPLES, 3000, 5, 7, PER_SHARD, progress=False)
    return out


def shard_config(source, local, fmt="tar", **sections):
    data = {"dataset": {"source": source, "manifest": "manifest.tsv", "format": fmt, "loader": "raw"},
            "plan": {"batch_size": 8, "epochs": 2, "seed": 5, "shuffle_algorithm": "shards", "shard_window": 2},
            "staging": {"local_dir": str(local), "prefetchers": 2, "lookahead": 4},
            "reader": {"workers": 2},
            "processes": {"shutdown_timeout_s": 10.0}}
    if fmt == "hdf5":
        data["dataset"]["keys"] = ["x", "y"]
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def webdataset_samples(directory):
    """Every sample of the shards as webdataset itself reads them, by (shard, key)."""
    urls = sorted(glob.glob(os.path.join(directory, "*.tar")))
    out = {}
    for sample in webdataset.WebDataset(urls, shardshuffle=False):
        out[(os.path.basename(sample["__url__"]), sample["__key__"])] = sample
    return out


def run(cfg, catalog=None):
    """Runs a pipeline to its end: ``(catalog, [(epoch, indices, samples)], stats)``."""
    got = []
    with Pipeline(cfg, catalog) as pipe:
        for batch in pipe:
            got.append((batch.epoch, batch.indices.copy(), batch.samples))
        return pipe.catalog, got, pipe.stats


def check_epochs(catalog, got, cfg):
    """Each epoch holds every sample once, in plan order."""
    spec = plan.PlanSpec.from_config(len(catalog), cfg.plan, 1, containers=catalog.containers)
    assert [b[1].tolist() for b in got] == [m.indices.tolist() for m in spec.minibatches(0)]
    for epoch in range(cfg.plan.epochs):
        seen = np.concatenate([b[1] for b in got if b[0] == epoch])
        assert sorted(seen.tolist()) == list(range(len(catalog)))


def test_tar_samples_equal_what_webdataset_reads(tar_dir, tmp_path):
    cfg = shard_config(tar_dir, tmp_path / "local")
    catalog, got, _ = run(cfg)
    assert isinstance(catalog, ShardCatalog) and len(catalog) == SAMPLES and len(catalog.files) == 10
    check_epochs(catalog, got, cfg)
    reference = webdataset_samples(tar_dir)
    assert len(reference) == SAMPLES
    for _, indices, samples in got:
        for index, sample in zip(indices.tolist(), samples):
            want = reference[(catalog.path(index), catalog.key(index))]
            assert sample["__key__"] == want["__key__"]
            assert set(sample) - {"__key__"} == {"npy", "cls"}
            assert sample["npy"] == want["npy"] and sample["cls"] == want["cls"]
    assert os.listdir(tmp_path / "local") == []


def test_hdf5_rows_equal_what_h5py_reads(h5_dir, tmp_path):
    cfg = shard_config(h5_dir, tmp_path / "local", "hdf5")
    catalog, got, _ = run(cfg)
    assert len(catalog) == SAMPLES and catalog.format == "hdf5"
    check_epochs(catalog, got, cfg)
    for _, indices, samples in got:
        for index, sample in zip(indices.tolist(), samples):
            row = int(catalog.key(index))
            with h5py.File(os.path.join(h5_dir, catalog.path(index)), "r") as fh:
                assert np.array_equal(sample["x"], fh["x"][row]) and sample["x"].dtype == fh["x"].dtype
                assert sample["y"] == fh["y"][row]


def test_a_tar_loader_decodes_the_parts_of_its_kind(tar_dir, tmp_path):
    cfg = shard_config(tar_dir, tmp_path / "local", dataset={"loader": "npy"}, plan={"epochs": 1})
    catalog, got, _ = run(cfg)
    reference = webdataset_samples(tar_dir)
    index, sample = int(got[0][1][0]), got[0][2][0]
    want = np.load(io.BytesIO(reference[(catalog.path(index), catalog.key(index))]["npy"]))
    assert np.array_equal(sample["npy"], want) and isinstance(sample["cls"], bytes)


def test_the_shards_shuffle_draws_each_window_from_its_containers():
    file_of = np.repeat(np.arange(10), [5, 3, 7, 1, 9, 4, 4, 4, 6, 2])
    shuffle = ShardShuffle.of(file_of, 3)
    n = len(file_of)
    order = shuffle.permutation(n, 11, 0)
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(order, ShardShuffle.of(file_of, 3).permutation(n, 11, 0)), "a pure function"
    assert not np.array_equal(order, shuffle.permutation(n, 11, 1)), "each epoch its own order"
    # Cut the order where the containers change window: each run holds whole containers, at most 3 of them.
    containers = file_of[order]
    at, runs = 0, []
    while at < n:
        group, members = set(), []
        while at < n and (containers[at] in group or len(group) < 3):
            group.add(int(containers[at]))
            members.append(int(order[at]))
            at += 1
        runs.append((group, members))
    for group, members in runs[:-1]:
        assert sorted(members) == sorted(np.flatnonzero(np.isin(file_of, list(group))).tolist())
    # Unsorted containers (a dataset whose samples name their files in any order) group the same way.
    mixed = np.random.default_rng(0).permutation(n)
    shuffled = ShardShuffle.of(file_of[mixed], 3).permutation(n, 11, 0)
    assert sorted(shuffled.tolist()) == list(range(n))
    assert all(len(set(file_of[mixed][shuffled[i:i + 6]].tolist())) <= 6 for i in range(0, n, 6))


def test_ranks_share_the_shards_order_disjointly_and_resume_on_another_count():
    file_of = np.repeat(np.arange(12), 20)
    n = len(file_of)
    cfg = config_from_dict({"plan": {"batch_size": 5, "epochs": 2, "seed": 3, "shuffle_algorithm": "shards",
                                     "shard_window": 4}}).plan
    whole = [plan.PlanSpec.from_config(n, cfg, 1, containers=file_of).minibatches(0)]
    order = np.concatenate([m.indices for m in whole[0] if m.epoch == 1])
    for size in (2, 3, 4):
        spec = plan.PlanSpec.from_config(n, cfg, size, containers=file_of)
        shares = [[m for m in spec.minibatches(r) if m.epoch == 1] for r in range(size)]
        steps = [np.concatenate([shares[r][s].indices for r in range(size)]) for s in range(len(shares[0]))]
        assert np.array_equal(np.concatenate(steps)[:n], order), f"{size} ranks read the one global order"
        for a in range(size):
            for b in range(a + 1, size):
                assert not set(np.concatenate([m.indices for m in shares[a]]).tolist()) & set(
                    np.concatenate([m.indices for m in shares[b]]).tolist())
    # Saved on 4 ranks after 6 global steps of epoch 1, resumed on 3: the same global order goes on.
    consumed = 6 * 5 * 4
    spec = plan.PlanSpec.from_config(n, cfg, 3, plan.Position(1, consumed), containers=file_of)
    rest = [[m for m in spec.minibatches(r)] for r in range(3)]
    resumed = np.concatenate([np.concatenate([rest[r][s].indices for r in range(3)]) for s in range(len(rest[0]))])
    assert np.array_equal(resumed[:n - consumed], order[consumed:])


def test_resume_mid_epoch_continues_the_same_order(tar_dir, tmp_path):
    cfg = shard_config(tar_dir, tmp_path / "local", plan={"epochs": 2})
    catalog, got, _ = run(cfg)
    position = int(5 * 8)  # five minibatches of epoch 1 done
    with Pipeline(cfg, catalog, start=(1, position)) as pipe:
        rest = [(b.epoch, b.indices.tolist()) for b in pipe]
    full = [(e, i.tolist()) for e, i, _ in got]
    first = next(k for k, (epoch, _) in enumerate(full) if epoch == 1)
    assert rest == full[first + 5:]


def test_clairvoyant_over_containers_reads_the_belady_optimum_at_40_percent(tar_dir, tmp_path):
    base = shard_config(tar_dir, tmp_path / "local", plan={"epochs": 4}, staging={"lookahead": 1},
                        reader={"workers": 1, "ahead": 1})
    catalog = load_catalog(base.dataset)
    sizes = catalog.files.sizes
    assert (sizes == sizes[0]).all()
    capacity = 4 * int(sizes[0])  # 40% of the 10 containers
    cfg = base.replace(staging={"capacity": capacity, "cache_policy": "clairvoyant"})
    _, got, stats = run(cfg, catalog)
    table = stats.cache_table()
    misses = [e["misses"] for e in table]
    assert max(e["peak_bytes"] for e in table) <= capacity
    spec = plan.PlanSpec.from_config(len(catalog), cfg.plan, 1, containers=catalog.containers)
    requests = [sorted(set(catalog.file_index(m.indices).tolist())) for m in spec.minibatches(0)]
    steps = plan.steps_per_epoch(len(catalog), 8, False)
    optimum = belady_misses(requests, 4)
    assert misses == [sum(optimum[e * steps:(e + 1) * steps]) for e in range(4)]
    assert sum(misses) < 4 * 10, "the cache must save some container reads"
    predicted = step_misses(sizes, spec, capacity=capacity, ahead=1, to_files=catalog.file_index)
    assert [int(e.sum()) for e in predicted] == misses, "stager whatif's cache model counts the same containers"
    assert [e["files_from_source"] for e in table] == misses


def test_already_local_counts_the_samples_read_from_local_containers_not_the_containers(h5_dir, tmp_path):
    """Two epochs of HDF5 containers, all kept: what the second epoch reads locally is every sample once, with
    the samples' bytes; a container's whole size per minibatch would count it many times over."""
    cfg = shard_config(h5_dir, tmp_path / "local", "hdf5")
    catalog, got, stats = run(cfg)
    check_epochs(catalog, got, cfg)
    first, second = stats.cache_table()
    assert second["misses"] == 0 and second["samples_local"] == SAMPLES
    assert second["bytes_local"] == int(catalog.sizes.sum()) <= catalog.total_bytes
    assert second["hits"] > SAMPLES // PER_SHARD  # a container is a hit for each minibatch that asks for it
    # In the first epoch a minibatch finds its container local (or on its way) once an earlier one asked for it.
    first_bytes = sum(int(catalog.sizes[indices].sum()) for epoch, indices, _ in got if epoch == 0)
    assert first["bytes_local"] == first_bytes - _fetched_first(catalog, got)


def _fetched_first(catalog, got):
    """Bytes of the first epoch's samples whose container no earlier minibatch had asked for."""
    seen, nbytes = set(), 0
    for epoch, indices, _ in got:
        if epoch:
            break
        containers = catalog.file_index(indices)
        fresh = ~np.isin(containers, list(seen))
        nbytes += int(catalog.sizes[indices[fresh]].sum())
        seen.update(containers.tolist())
    return nbytes


def write_tar(path, members):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_bad_containers_are_named(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    write_tar(bad / "a.tar", [("000.npy", b"x" * 600), ("000.cls", b"1"), ("001.npy", b"y" * 600),
                              ("001.cls", b"2")])
    cfg = config_from_dict({"dataset": {"source": str(bad), "format": "tar"}})
    assert len(load_catalog(cfg.dataset)) == 2
    # A member missing from a group.
    write_tar(bad / "b.tar", [("002.npy", b"z" * 600), ("003.npy", b"w" * 600), ("003.cls", b"0")])
    with pytest.raises(CatalogError, match=r"tar shard b.tar: sample '002' has no cls part"):
        load_catalog(cfg.dataset)
    os.unlink(bad / "b.tar")
    # A truncated shard.
    data = (bad / "a.tar").read_bytes()
    (bad / "a.tar").write_bytes(data[:1200])
    with pytest.raises(CatalogError, match=r"tar shard a.tar is truncated"):
        load_catalog(cfg.dataset)
    (bad / "a.tar").write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(CatalogError, match=r"a.tar"):
        load_catalog(cfg.dataset)
    # HDF5 datasets whose first axes disagree.
    h5 = tmp_path / "h5"
    h5.mkdir()
    with h5py.File(h5 / "c.h5", "w") as fh:
        fh["x"] = np.zeros((10, 3))
        fh["y"] = np.zeros(9)
    cfg = config_from_dict({"dataset": {"source": str(h5), "keys": ["x", "y"]}})
    with pytest.raises(CatalogError, match=r"HDF5 file c.h5: the datasets' first axes disagree \(x has 10, y has 9\)"):
        load_catalog(cfg.dataset)
    cfg = config_from_dict({"dataset": {"source": str(h5), "keys": ["x", "z"]}})
    with pytest.raises(CatalogError, match=r"HDF5 file c.h5 has no dataset 'z'"):
        load_catalog(cfg.dataset)
    with pytest.raises(ConfigError, match="shards needs samples packed in containers"):
        plan.PlanSpec.from_config(10, config_from_dict({"plan": {"shuffle_algorithm": "shards"}}).plan)


def test_a_container_rewritten_after_listing_fails_naming_it_and_nothing_torn_is_delivered(tar_dir, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tar_dir, src)
    cfg = shard_config(str(src), tmp_path / "local", plan={"epochs": 1})
    catalog = load_catalog(cfg.dataset)
    reference = webdataset_samples(str(src))
    spec = plan.PlanSpec.from_config(len(catalog), cfg.plan, 1, containers=catalog.containers)
    victim = catalog.path(int(list(spec.minibatches(0))[-1].indices[0]))  # read last: earlier ones come first
    data = bytearray((src / victim).read_bytes())
    data[600:700] = b"\0" * 100  # same size, other bytes, a new modification time
    (src / victim).write_bytes(bytes(data))
    os.utime(src / victim, ns=(1, 1))
    delivered = []
    with pytest.raises(StageError, match=victim) as info:
        with Pipeline(cfg, catalog) as pipe:
            for batch in pipe:
                delivered.extend(zip(batch.indices.tolist(), batch.samples))
    assert info.value.stage == "prefetch"
    for index, sample in delivered:
        assert catalog.path(index) != victim
        assert sample["npy"] == reference[(catalog.path(index), catalog.key(index))]["npy"]
    assert os.listdir(tmp_path / "local") == []


def test_pack_writes_shards_webdataset_and_h5py_read_back(dataset, tmp_path):
    root, _ = dataset
    out = tmp_path / "packed"
    done = subprocess.run([sys.executable, "-m", "stager", "pack", root, str(out), "--per-shard", "30",
                           "--manifest", "manifest.tsv", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    files = Catalog.from_manifest(root, "manifest.tsv")
    with open(out / "manifest.tsv") as fh:
        assert [line.strip() for line in fh] == [f"shard-{k:06d}.tar" for k in range(4)]
    assert_webdataset_reads_back(out, root, files)
    h5 = tmp_path / "h5"
    done = subprocess.run([sys.executable, "-m", "stager", "pack", root, str(h5), "--format", "hdf5",
                           "--per-shard", "64", "--manifest", "manifest.tsv", "--quiet"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    catalog = load_catalog(config_from_dict({"dataset": {"source": str(h5), "manifest": "manifest.tsv",
                                                         "keys": ["x", "y"]}}).dataset)
    assert len(catalog) == len(files) and len(catalog.files) == 2
    with h5py.File(h5 / "shard-000001.h5", "r") as fh:
        assert np.array_equal(fh["x"][3], np.load(os.path.join(root, files.path(67))))
        assert fh["y"][3] == files.label(67)
    again = subprocess.run([sys.executable, "-m", "stager", "pack", root, str(h5), "--quiet"],
                           capture_output=True, text=True)
    assert again.returncode != 0 and "already holds files" in again.stderr


def test_chainer_reads_shards_and_resumes_through_its_own_serializers(tar_dir, tmp_path):
    chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
    chainer, StagingIterator = chainer_front._chainer, chainer_front.StagingIterator

    cfg = shard_config(tar_dir, tmp_path / "local")
    reference = webdataset_samples(tar_dir)
    it = StagingIterator(cfg, 8, repeat=True)
    try:
        keys = []
        while it.epoch == 0:
            for sample in it.next():
                shard = next(p for (p, k) in reference if k == sample["__key__"])
                assert sample["npy"] == reference[(shard, sample["__key__"])]["npy"]
                keys.append(sample["__key__"])
        assert sorted(keys) == sorted(k for _, k in reference)
        for _ in range(3):
            it.next()
        chainer.serializers.save_npz(str(tmp_path / "snap.npz"), it)
        want = [[s["__key__"] for s in it.next()] for _ in range(4)]
    finally:
        it.finalize()
    again = StagingIterator(cfg, 8, repeat=True)
    try:
        chainer.serializers.load_npz(str(tmp_path / "snap.npz"), again)
        assert [[s["__key__"] for s in again.next()] for _ in range(4)] == want
    finally:
        again.finalize()
    assert os.listdir(tmp_path / "local") == []


def test_pytorch_shard_dataset_in_dataloader_and_staged_loader(tar_dir, h5_dir, tmp_path):
    import torch
    from torch.utils.data import DataLoader

    from iterators.pytorch import ShardDataset, StagedLoader

    def tensors(sample):
        return sample["__key__"], torch.from_numpy(sample["npy"]), int(sample["cls"])

    ds = ShardDataset(tar_dir, manifest="manifest.tsv", loader="npy", transform=tensors)
    local = {"staging": {"local_dir": str(tmp_path / "local")}}
    direct = list(DataLoader(ds, batch_size=8))
    with StagedLoader(ds, batch_size=8, num_workers=2, config=local) as loader:
        staged = list(loader)
    assert len(direct) == len(staged) == SAMPLES // 8
    for (k1, x1, y1), (k2, x2, y2) in zip(direct, staged):
        assert k1 == k2 and torch.equal(x1, x2) and torch.equal(y1, y2)
    by_key = {k: x for keys, xs, _ in direct for k, x in zip(keys, xs)}
    orders = []
    with StagedLoader(ds, batch_size=8, shuffle=True, num_workers=2, config=local) as loader:
        assert loader.config.plan.shuffle_algorithm == "shards"
        for epoch in range(2):
            keys = []
            for batch_keys, xs, _ in loader:
                keys.extend(batch_keys)
                assert all(torch.equal(by_key[k], x) for k, x in zip(batch_keys, xs))
            assert sorted(keys) == sorted(by_key)
            orders.append(keys)
    assert orders[0] != orders[1]
    h5 = ShardDataset(h5_dir, keys=["x", "y"], manifest="manifest.tsv")
    direct = list(DataLoader(h5, batch_size=16))
    with StagedLoader(h5, batch_size=16, num_workers=2, config=local) as loader:
        staged = list(loader)
    assert all(torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"]) for a, b in zip(direct, staged))
    assert len(direct) == len(staged) == SAMPLES // 16
    assert os.listdir(tmp_path / "local") == []


def test_the_shipped_shards_job_makes_its_data_then_runs(tmp_path):
    job = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "shards.yaml")
    sets = ["--set", f"dataset.source={tmp_path / 'data'}", "--set", "synthetic.samples=300",
            "--set", "synthetic.per_shard=70", "--set", "synthetic.bytes=2000"]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    for _ in range(2):  # the second time, the shards are there already
        made = subprocess.run([sys.executable, "-m", "stager", "make-dataset", "--config", job, "--quiet", *sets],
                              capture_output=True, text=True, env=env)
        assert made.returncode == 0, made.stderr
    assert "already lists the 300 samples" in made.stdout
    assert sorted(n for n in os.listdir(tmp_path / "data") if not n.startswith(".")) == \
        ["manifest.tsv"] + [f"shard-{k:06d}.tar" for k in range(5)]
    rec = tmp_path / "rec"
    report = tmp_path / "reports" / "of-today" / "r.json"  # a directory that does not exist yet
    ran = subprocess.run([sys.executable, "-m", "stager", "run", job, "--quiet", "--record", str(rec), *sets,
                          "--report", str(report),
                          "--set", f"staging.local_dir={tmp_path / 'local'}"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    import json

    lines = [json.loads(x) for x in open(rec / "rank-0.jsonl")]
    staged = [json.loads(x) for x in open(rec / f"{[n for n in os.listdir(rec) if n.startswith('staged-')][0]}")]
    for epoch in (0, 1):
        names = [s for line in lines if line["epoch"] == epoch for s in line["samples"]]
        assert len(names) == 300 and len(set(names)) == 300 and all("#" in n for n in names)
    assert sorted(s["path"] for s in staged) == [f"shard-{k:06d}.tar" for k in range(5)]
    assert json.loads(report.read_text())["reads"]["source"]["files"] == 5
    assert os.listdir(tmp_path / "local") == []


def test_tar_shards_in_an_object_store_are_staged_whole_and_read_as_webdataset_does(store, tar_dir, tmp_path):
    store.s3.create_bucket(Bucket="stager-shards")
    for name in os.listdir(tar_dir):
        with open(os.path.join(tar_dir, name), "rb") as fh:
            store.s3.put_object(Bucket="stager-shards", Key=f"train/{name}", Body=fh.read())
    cfg = s3_config(store.endpoint_url, tmp_path / "local", source="s3://stager-shards/train",
                    dataset={"format": "tar", "manifest": "manifest.tsv"},
                    plan={"shuffle_algorithm": "shards", "shard_window": 3})
    catalog, got, stats = run(cfg)
    assert isinstance(catalog, ShardCatalog) and len(catalog.files) == 10
    check_epochs(catalog, got, cfg)
    reference = webdataset_samples(tar_dir)
    for _, indices, samples in got:
        for index, sample in zip(indices.tolist(), samples):
            assert sample["npy"] == reference[(catalog.path(index), catalog.key(index))]["npy"]
    assert sum(e["files_from_source"] for e in stats.cache_table()) == 10


def test_auto_counts_and_a_catalog_file_with_containers(tar_dir, tmp_path):
    cfg = shard_config(tar_dir, tmp_path / "local", plan={"epochs": 1},
                       staging={"prefetchers": "auto"}, reader={"workers": "auto"})
    catalog, got, _ = run(cfg)
    check_epochs(catalog, got, cfg)
    with pytest.raises(ConfigError, match="dataset.catalog .* lists files"):
        shard_config(tar_dir, tmp_path / "local", dataset={"catalog": str(tmp_path / "c.bin")})


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_tar_index_finds_what_tarfile_and_webdataset_find(tmp_path, fmt):
    from stager.formats.tar import index_tar

    long_dir = "d" * 120 if fmt != tarfile.USTAR_FORMAT else "d" * 60
    members = [("a/000.npy", b"0" * 700), ("a/000.cls", b"1"), (f"{long_dir}/001.npy", b"2" * 513),
               (f"{long_dir}/001.cls", b"3"), ("__meta__", b"skipped"), ("nodot", b"skipped"), ("b/002.NPY", b""),
               ("b/002.cls", b"4" * 40000)]
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        tar.addfile(tarfile.TarInfo("a"), None)  # a directory entry: no sample
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("a/003.npy")
        link.type, link.linkname = tarfile.SYMTYPE, "a/000.npy"
        tar.addfile(link)
    with open(path, "rb") as fh:
        samples = index_tar(fh, "s.tar", os.path.getsize(path))
    data = path.read_bytes()
    got = {key: {part: data[o:o + n] for part, o, n in parts} for key, parts in samples}
    want = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
            for s in webdataset.WebDataset(str(path), shardshuffle=False)}
    assert got == want and list(got) == ["a/000", f"{long_dir}/001", "b/002"]
    corrupt = bytearray(data)
    corrupt[600] ^= 0xFF  # inside the first member's header
    (tmp_path / "c.tar").write_bytes(bytes(corrupt))
    with open(tmp_path / "c.tar", "rb") as fh, pytest.raises(CatalogError, match="c.tar cannot be read as a tar"):
        index_tar(fh, "c.tar", len(corrupt))


def test_the_catalog_reads_the_index_pack_wrote_beside_each_shard_not_the_shard(tar_dir, tmp_path):
    import json
    import re

    from helpers.opens import Opens
    from stager.formats.tar import index_name

    bare = tmp_path / "bare"  # the same shards without their indexes: indexed from their headers
    shutil.copytree(tar_dir, bare, ignore=shutil.ignore_patterns(".*"))
    indexed = load_catalog(shard_config(str(bare), tmp_path / "local").dataset)
    with Opens(tar_dir) as opens:
        packed = load_catalog(shard_config(tar_dir, tmp_path / "local").dataset)
        counted = opens.count()
    assert packed.layout == indexed.layout and packed.files.paths() == indexed.files.paths()
    assert sorted(p for p in counted if p != "manifest.tsv") == sorted(index_name(p) for p in packed.files.paths())
    src = tmp_path / "src"
    shutil.copytree(tar_dir, src)
    first = packed.files.path(0)
    side = src / index_name(first)
    index = json.loads(side.read_text())
    index["bytes"] += 1  # written for another shard of that name: the shard is indexed itself
    side.write_text(json.dumps(index))
    assert load_catalog(shard_config(str(src), tmp_path / "local").dataset).layout == indexed.layout
    index["bytes"] -= 1
    index["samples"][1][1][0][1] = 10 ** 9
    side.write_text(json.dumps(index))
    with pytest.raises(CatalogError, match=f"tar shard index {re.escape(index_name(first))}: sample .* outside the "
                                           "shard's"):
        load_catalog(shard_config(str(src), tmp_path / "local").dataset)
    side.write_text("{cut short")
    with pytest.raises(CatalogError, match=f"tar shard index {re.escape(index_name(first))} cannot be read"):
        load_catalog(shard_config(str(src), tmp_path / "local").dataset)


def test_over_an_object_store_the_catalog_fetches_each_shards_index_not_the_shard(store, tar_dir, tmp_path):
    from stager.slows3 import Fault, SlowProxy

    store.s3.create_bucket(Bucket="stager-indexed")
    for name in os.listdir(tar_dir):
        with open(os.path.join(tar_dir, name), "rb") as fh:
            data = fh.read()
        store.s3.put_object(Bucket="stager-indexed", Key=f"with/{name}", Body=data)
        if not name.startswith("."):
            store.s3.put_object(Bucket="stager-indexed", Key=f"without/{name}", Body=data)
    local = load_catalog(shard_config(tar_dir, tmp_path / "local").dataset)
    # Every GET of a shard is refused: the catalog is built from the indexes alone, or not at all.
    with SlowProxy(store.port, faults=[Fault(403, -1, r"\.tar$")]) as proxy:
        def catalog(prefix):
            return load_catalog(s3_config(proxy.endpoint_url, tmp_path / "local",
                                          source=f"s3://stager-indexed/{prefix}",
                                          dataset={"format": "tar", "manifest": "manifest.tsv"}).dataset)

        assert catalog("with").layout == local.layout
        with pytest.raises(OSError, match=r"s3://stager-indexed/without/shard-\d+\.tar at .*: access denied \(403"):
            catalog("without")  # the refusal bites where a shard has no index
