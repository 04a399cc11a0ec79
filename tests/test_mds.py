"""MosaicML Streaming's MDS shards (``dataset.format: mds``): staged as containers, samples as Streaming reads them.

The shards are written by Streaming's own ``MDSWriter`` and the samples
compared with Streaming's own reader of the same index; without Streaming
(the extra ``mds``) only the refusal is tested.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from helpers.opens import Opens
from helpers.shardchecks import streaming_samples
from stager import Pipeline, plan
from stager.catalog import load_catalog
from stager.config import config_from_dict
from stager.errors import CatalogError, StageError
from stager.slowfs import SlowFS
from test_s3 import store  # noqa: F401  (the moto server fixture)

SAMPLES, CLASSES = 96, 4


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory):
    """96 samples of five columns (int, int, bytes, jpeg, ndarray) in several MDS shards, by ``MDSWriter``."""
    streaming = pytest.importorskip("streaming", reason="MosaicML Streaming is not installed (extra 'mds')")
    from PIL import Image

    out = str(tmp_path_factory.mktemp("mds") / "data")
    rng = np.random.default_rng(7)
    columns = {"id": "int", "label": "int", "raw": "bytes", "image": "jpeg", "array": "ndarray"}
    with streaming.MDSWriter(out=out, columns=columns, size_limit=1 << 14) as writer:
        for i in range(SAMPLES):
            writer.write({"id": i, "label": i % CLASSES, "raw": rng.bytes(int(rng.integers(10, 300))),
                          "image": Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)),
                          "array": rng.integers(0, 9, int(rng.integers(1, 20))).astype(np.int32)})
    return out


def mds_config(source, local, **sections):
    data = {"dataset": {"source": source, "format": "mds", "loader": "raw"},
            "plan": {"batch_size": 8, "epochs": 2, "seed": 5, "shuffle_algorithm": "shards", "shard_window": 2},
            # Counts set: a start's probe would open a few shards once more.
            "staging": {"local_dir": str(local), "prefetchers": 2, "lookahead": 4},
            "reader": {"workers": 2}, "processes": {"shutdown_timeout_s": 10.0}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def _same(sample, want):
    assert set(sample) == set(want)
    for column, value in sample.items():
        if column in ("image", "array"):
            assert np.array_equal(np.asarray(value), want[column]), column
        else:
            assert value == want[column], column


def test_every_sample_once_an_epoch_as_streaming_reads_it_and_each_shard_opened_once(mds_dir, tmp_path):
    reference = streaming_samples(mds_dir)
    with SlowFS(mds_dir, open_ms=1.0) as mnt:
        cfg = mds_config(mnt, tmp_path / "local")
        catalog = load_catalog(cfg.dataset)
        assert len(catalog) == SAMPLES and len(catalog.files) > 3
        got = []
        with Opens(mds_dir) as opens:
            with Pipeline(cfg, load_catalog(cfg.dataset)) as pipe:
                for batch in pipe:
                    got.append((batch.epoch, batch.step, batch.indices.tolist(), batch.samples))
            counted = opens.count()
    spec = plan.PlanSpec.from_config(len(catalog), cfg.plan, 1, containers=catalog.containers)
    assert [(e, s, i) for e, s, i, _ in got] == [(m.epoch, m.step, m.indices.tolist()) for m in spec.minibatches(0)]
    for epoch in range(2):
        ids = [sample["id"] for e, _, _, samples in got if e == epoch for sample in samples]
        assert sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}: each sample once"
    for _, _, _, samples in got:
        for sample in samples:
            _same(sample, reference[sample["id"]])
    counted.pop("index.json")  # read by the catalog: the shards are not opened to index them
    assert dict(counted) == {p: 1 for p in catalog.files.paths()}


def test_a_shard_the_index_lists_but_the_directory_lacks_is_named(mds_dir, tmp_path):
    src = tmp_path / "data"
    shutil.copytree(mds_dir, src)
    victim = sorted(n for n in os.listdir(src) if n.endswith(".mds"))[1]
    os.remove(src / victim)
    with pytest.raises(CatalogError, match=f"lists {victim}, which is not under"):
        load_catalog(mds_config(str(src), tmp_path / "local").dataset)


def test_a_shard_whose_header_is_not_the_indexed_one_fails_the_job_naming_it(mds_dir, tmp_path):
    src = tmp_path / "data"
    shutil.copytree(mds_dir, src)
    victim = sorted(n for n in os.listdir(src) if n.endswith(".mds"))[0]
    data = bytearray((src / victim).read_bytes())
    data[0:4] = (int.from_bytes(data[0:4], "little") - 1).to_bytes(4, "little")  # same size, one sample fewer
    (src / victim).write_bytes(bytes(data))
    cfg = mds_config(str(src), tmp_path / "local", plan={"shuffle_algorithm": "identity"})
    with pytest.raises(StageError, match=f"{victim}: the shard's header lists"):
        with Pipeline(cfg, load_catalog(cfg.dataset)) as pipe:
            for _ in pipe:
                pass
    assert os.listdir(tmp_path / "local") == []


def test_without_streaming_the_format_is_refused_naming_what_to_install(tmp_path):
    code = ("import sys; sys.modules['streaming'] = None\n"
            "from stager.catalog import load_catalog\nfrom stager.config import config_from_dict\n"
            f"load_catalog(config_from_dict({{'dataset': {{'source': {str(tmp_path)!r}, 'format': 'mds'}}}}).dataset)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode != 0
    assert "CatalogError: dataset.format mds decodes samples with Streaming's column encodings: install " \
           "MosaicML Streaming (pip install 'stager[mds]'" in done.stderr, done.stderr


def test_two_ranks_read_streamings_shards_through_stager_run_each_shard_opened_once(mds_dir, tmp_path):
    from test_mpi_run import MPIEXEC, mpirun, read_records
    from test_peers_run import helper_env

    if not os.path.exists(MPIEXEC):
        pytest.skip(f"no mpiexec at {MPIEXEC} (install .[mpich])")
    data = tmp_path / "data"
    shutil.copytree(mds_dir, data)
    (tmp_path / "job.yaml").write_text(f"""
dataset: {{source: {data}, format: mds, loader: "shardchecks:same_as_streaming"}}
slowfs: {{enabled: true, open_ms: 2}}
plan: {{batch_size: 4, epochs: 2, seed: 3, shuffle_algorithm: shards, shard_window: 2}}
staging: {{local_dir: {tmp_path / "local"}, lookahead: 4, prefetchers: 2}}
reader: {{workers: 1}}
""")
    rec = tmp_path / "rec"
    # The readers check each sample against Streaming's reading of a copy, so the opens counted are stager's.
    shutil.copytree(data, tmp_path / "reference")
    env = dict(helper_env(tmp_path), STAGER_TEST_SOURCE=str(tmp_path / "reference"))
    with Opens(data) as opens:
        proc = mpirun([("a", 2)], ["run", str(tmp_path / "job.yaml"), "--quiet", "--record", str(rec)], tmp_path,
                      env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        counted = opens.count()
    reads, _ = read_records(rec)
    catalog = load_catalog(mds_config(str(data), tmp_path / "local").dataset)
    assert sorted(reads) == [0, 1]
    for epoch in range(2):
        names = [s for lines in reads.values() for line in lines if line["epoch"] == epoch for s in line["samples"]]
        assert sorted(names) == sorted(catalog.name(i) for i in range(SAMPLES)), f"epoch {epoch}: each sample once"
    counted.pop("index.json")
    assert dict(counted) == {p: 1 for p in catalog.files.paths()}


def test_staged_loader_reads_streamings_shards_from_an_object_store_each_shard_fetched_once(store, mds_dir, tmp_path):
    from torch.utils.data import ConcatDataset, Subset

    from iterators.pytorch import ShardDataset, StagedLoader

    store.s3.create_bucket(Bucket="stager-mds")
    names = sorted(os.listdir(mds_dir))
    for name in names:
        with open(os.path.join(mds_dir, name), "rb") as fh:
            store.s3.put_object(Bucket="stager-mds", Key=f"data/{name}", Body=fh.read())
    reference = streaming_samples(mds_dir)
    ds = ShardDataset("s3://stager-mds/data", format="mds", endpoint_url=store.endpoint_url)
    assert len(ds) == SAMPLES
    with pytest.raises(TypeError, match="give it to StagedLoader, which fetches each shard once"):
        ds[0]
    with pytest.raises(TypeError, match="StagedLoader stages from one source: a ShardDataset over "
                                        "s3://stager-mds/data can be given alone or in a Subset"):
        StagedLoader(ConcatDataset([ds, ds]), batch_size=8)
    config = {"staging": {"local_dir": str(tmp_path / "local")}}
    with StagedLoader(ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=list, config=config) as loader:
        assert loader.config.plan.shuffle_algorithm == "shards"
        assert loader.config.dataset.endpoint_url == store.endpoint_url
        for epoch in range(2):
            ids = []
            for batch in loader:
                for sample in batch:
                    _same(sample, reference[int(sample["id"])])
                    ids.append(int(sample["id"]))
            assert sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}: each sample once"
        fetched = sum(e["files_from_source"] for e in loader.stats.cache_table())
    assert fetched == len([n for n in names if n.endswith(".mds")])
    half = Subset(ds, range(0, SAMPLES, 2))
    with StagedLoader(half, batch_size=8, num_workers=1, collate_fn=list, config=config) as loader:
        ids = [int(sample["id"]) for batch in loader for sample in batch]
    assert ids == list(range(0, SAMPLES, 2))
    assert os.listdir(tmp_path / "local") == []
