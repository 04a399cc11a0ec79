"""Run inside every rank: ``mpiexec -n N python -m pytest tests/mpi`` at any N,
with or without ``STAGER_NODE_ID`` emulating nodes; plain pytest runs them as
a single MPI process. Every test makes all its collective calls before it
asserts, so a failing rank cannot leave the others waiting."""

import os
import shutil
import tempfile
import zlib
from collections import Counter

import pytest

from stager import plan
from stager.catalog import Catalog, broadcast_catalog
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.errors import CatalogError
from stager.job.synth import make_dataset
from stager.world import detect

MPI = pytest.importorskip("mpi4py.MPI")


@pytest.fixture(scope="module")
def world():
    return detect("on")


@pytest.fixture(scope="module")
def shared_dir(world):
    path = world.comm.bcast(tempfile.mkdtemp(prefix="stager-mpi-") if world.rank == 0 else None, root=0)
    if world.rank == 0:
        make_dataset(os.path.join(path, "data"), 120, nbytes=2048, classes=3, seed=2, progress=False)
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(path)


def test_world_matches_comm_world_and_groups_nodes(world):
    cw = MPI.COMM_WORLD
    names = cw.allgather(world.node)
    locals_ = cw.allgather((world.node, world.local_rank, world.local_size, world.node_index, world.nodes))
    assert (world.rank, world.size, world.source) == (cw.Get_rank(), cw.Get_size(), "mpi")
    expected_node = os.environ.get("STAGER_NODE_ID") or MPI.Get_processor_name()
    assert world.node == expected_node
    for node in set(names):
        members = [x for x in locals_ if x[0] == node]
        assert sorted(x[1] for x in members) == list(range(len(members)))
        assert {x[2] for x in members} == {len(members)}
    assert {x[4] for x in locals_} == {len(set(names))}
    assert sorted({x[3] for x in locals_}) == list(range(len(set(names))))


def test_world_from_launcher_variables_agrees_without_mpi(world):
    fallback = detect("off")
    assert (fallback.rank, fallback.size) == (world.rank, world.size) or fallback.source == "single"
    assert fallback.comm is None


def test_catalog_is_built_once_and_broadcast(world, shared_dir):
    builds = []

    def build():
        builds.append(world.rank)
        return Catalog.from_manifest(os.path.join(shared_dir, "data"), "manifest.tsv")

    catalog = broadcast_catalog(world.comm, build)
    digests = world.comm.allgather((zlib.crc32(catalog.paths_blob()), catalog.sizes.sum(), catalog.labels.sum(), len(catalog)))
    who_built = world.comm.allgather(builds)
    assert len(set(digests)) == 1
    assert [b for b in who_built if b] == [[0]]
    assert catalog == Catalog.from_manifest(os.path.join(shared_dir, "data"), "manifest.tsv")


def test_a_catalog_error_on_rank_0_is_raised_on_every_rank(world, shared_dir):
    def build():
        return Catalog.from_manifest(os.path.join(shared_dir, "data"), "no-such-manifest.tsv")

    with pytest.raises(CatalogError, match="no-such-manifest.tsv"):
        broadcast_catalog(world.comm, build)


def test_pipelines_share_each_epoch_and_each_node_stages_once(world, shared_dir):
    local = os.path.join(shared_dir, "local")
    cfg = config_from_dict({
        "dataset": {"source": os.path.join(shared_dir, "data"), "manifest": "manifest.tsv", "loader": "raw"},
        "plan": {"batch_size": 5, "epochs": 2, "seed": 9},
        "staging": {"local_dir": local, "prefetchers": 2, "lookahead": 3},
        "reader": {"workers": 2},
    })
    with Pipeline(cfg, world=world) as pipe:
        mine = [(b.epoch, b.step, b.indices.tolist(), [s[0] for s in b.samples]) for b in pipe]
        staged = pipe.stats.files_staged
        local_dir = pipe.local_dir
        catalog = pipe.catalog
    everyone = world.comm.allgather(mine)
    staged_per_node = world.comm.allgather((world.node, world.local_rank, staged, local_dir))
    world.comm.Barrier()
    left = os.listdir(local)

    n = len(catalog)
    for epoch in (0, 1):
        counts = Counter(i for seq in everyone for e, _, idx, _ in seq if e == epoch for i in idx)
        assert sorted(counts) == list(range(n)) and set(counts.values()) == {1}
    assert [x[:3] for x in mine] == [(m.epoch, m.step, m.indices.tolist())
                                      for m in plan.iterate(n, cfg.plan, rank=world.rank, size=world.size)]
    root = os.path.join(shared_dir, "data")
    for _, _, idx, data in mine:
        for i, payload in zip(idx, data):
            with open(os.path.join(root, catalog.path(i)), "rb") as fh:
                assert payload == fh.read()
    for node in {x[0] for x in staged_per_node}:
        members = [x for x in staged_per_node if x[0] == node]
        assert len({x[3] for x in members}) == 1, "ranks of a node must share one staging directory"
        assert sum(x[2] for x in members if x[1] != 0) == 0, "only the node leader stages"
        read_here = {i for r, seq in enumerate(everyone) if staged_per_node[r][0] == node
                     for _, _, idx, _ in seq for i in idx}
        leader = [x for x in members if x[1] == 0][0]
        assert leader[2] == len(read_here), "each file the node reads is staged exactly once"
    assert left == []


def front_end_config(shared_dir):
    return config_from_dict({
        "dataset": {"source": os.path.join(shared_dir, "data"), "manifest": "manifest.tsv", "loader": "raw"},
        "plan": {"seed": 4},
        "staging": {"local_dir": os.path.join(shared_dir, "local"), "prefetchers": 2},
        "reader": {"workers": 1},
    })


def test_each_ranks_chainer_iterator_reads_its_share(world, shared_dir):
    chainer_front = pytest.importorskip("iterators.chainer")
    it = chainer_front.StagingIterator(front_end_config(shared_dir), 7, repeat=False, world=world)
    try:
        mine = [raw for batch in it for raw, _ in batch]
        details = (it.epoch, it.is_new_epoch, it.epoch_detail)
    finally:
        it.finalize()
    everyone = world.comm.allgather(mine)
    data = os.path.join(shared_dir, "data")
    catalog = Catalog.from_manifest(data, "manifest.tsv")
    expected = sorted(open(os.path.join(data, catalog.path(i)), "rb").read() for i in range(len(catalog)))
    assert sorted(raw for share in everyone for raw in share) == expected
    assert details == (1, True, 1.0)


def test_each_ranks_torch_loader_reads_its_share(world, shared_dir):
    pytorch_front = pytest.importorskip("iterators.pytorch")
    with pytorch_front.StagedLoader(front_end_config(shared_dir), collate_fn=list, world=world) as loader:
        mine = [raw for batch in loader for raw, _ in batch]
        steps = len(loader)
    everyone = world.comm.allgather(mine)
    data = os.path.join(shared_dir, "data")
    catalog = Catalog.from_manifest(data, "manifest.tsv")
    expected = sorted(open(os.path.join(data, catalog.path(i)), "rb").read() for i in range(len(catalog)))
    assert sorted(raw for share in everyone for raw in share) == expected
    assert len({len(share) for share in everyone}) == 1 and steps > 0


def _files(directory):
    found = {}
    for d, _, files in os.walk(directory):
        for f in files:
            if f.startswith((".lock", ".service")):
                continue
            try:
                st = os.stat(os.path.join(d, f))
            except FileNotFoundError:
                continue  # removed meanwhile by the cache
            found[os.path.join(d, f)] = (st.st_ino, st.st_size)
    return found


def _usage(directory, attempts=20):
    """Bytes in a job directory at one moment, or None if it never held still for two walks in a row.

    A single walk is not a snapshot: it reads one class directory, the cache
    evicts a file there and stages one in the next directory, and the walk
    counts both. Two equal walks in a row saw the same files.
    """
    before = _files(directory)
    for _ in range(attempts):
        after = _files(directory)
        if after == before:
            return sum(size for _, size in after.values())
        before = after
    return None


@pytest.fixture
def size_limited_local(world, shared_dir):
    """A tmpfs (root) as every node's local storage: it refuses to hold more than two nodes' capacity."""
    path = os.path.join(shared_dir, "nvme")
    mounted = False
    if world.rank == 0:
        os.mkdir(path)
        if os.geteuid() == 0:
            import subprocess
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", path]).returncode == 0
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if mounted:
        import subprocess
        subprocess.run(["umount", path], check=True)


def test_a_bounded_cache_over_four_epochs_delivers_every_sample_and_stays_under_capacity(
        world, shared_dir, size_limited_local):
    data = os.path.join(shared_dir, "data")
    catalog = Catalog.from_manifest(data, "manifest.tsv")
    share = len(catalog) * world.local_size // world.size  # files one node reads per epoch
    capacity = int(catalog.sizes.max()) * share // 2
    cfg = config_from_dict({
        "dataset": {"source": data, "manifest": "manifest.tsv", "loader": "raw"},
        "plan": {"batch_size": 4, "epochs": 4, "seed": 5},
        "staging": {"local_dir": size_limited_local, "prefetchers": 2, "lookahead": 1, "capacity": capacity},
        "reader": {"workers": 1, "ahead": 1},
    })
    peak = 0
    with Pipeline(cfg, world=world) as pipe:
        mine = []
        for b in pipe:
            mine.append((b.epoch, b.step, b.indices.tolist()))
            for i, (payload, _) in zip(b.indices, b.samples):
                with open(os.path.join(data, catalog.path(i)), "rb") as fh:
                    assert payload == fh.read(), f"rank {world.rank}: {catalog.path(i)} differs from the source"
            peak = max(peak, _usage(pipe.local_dir) or 0)
        table = pipe.stats.cache_table()
    everyone = world.comm.allgather(mine)
    peaks = world.comm.allgather(peak)
    world.comm.Barrier()
    assert mine == [(m.epoch, m.step, m.indices.tolist())
                    for m in plan.iterate(len(catalog), cfg.plan, rank=world.rank, size=world.size)]
    for epoch in range(4):
        counts = Counter(i for seq in everyone for e, _, idx in seq if e == epoch for i in idx)
        assert sorted(counts) == list(range(len(catalog)))
    assert max(peaks) <= capacity, f"a node's job directory held {max(peaks)} bytes, capacity {capacity}"
    if world.local_rank == 0:
        assert len(table) == 4 and all(e["peak_bytes"] <= capacity for e in table)
        assert sum(e["misses"] for e in table[1:]) < 3 * share, "later epochs must reuse some staged files"
    assert os.listdir(size_limited_local) == []


def test_a_local_directory_too_deep_for_a_unix_socket_path_still_serves_the_node(world, shared_dir):
    # A node's ranks reach its service through a Unix socket; sun_path holds
    # 107 bytes, and cluster scratch paths can be longer than that.
    deep = os.path.join(shared_dir, "scratch-of-a-rather-long-project-name", "x" * 90)
    os.makedirs(os.path.dirname(deep), exist_ok=True)  # stager makes only the last part of a base
    cfg = config_from_dict({
        "dataset": {"source": os.path.join(shared_dir, "data"), "manifest": "manifest.tsv", "loader": "raw"},
        "plan": {"batch_size": 6, "seed": 2},
        "staging": {"local_dir": deep, "prefetchers": 2},
        "reader": {"workers": 1},
    })
    with Pipeline(cfg, world=world) as pipe:
        mine = [b.indices.tolist() for b in pipe]
        catalog = pipe.catalog
        assert len(os.fsencode(pipe.local_dir)) > 107
    everyone = world.comm.allgather(mine)
    world.comm.Barrier()
    assert sorted(i for seq in everyone for idx in seq for i in idx) == list(range(len(catalog)))
