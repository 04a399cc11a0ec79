"""Nothing to set: the defaults choose the counts at start and follow the run (docs/counts.md).

The controller is fed recorded per-task traces (wall, CPU and run-queue
seconds); the front ends are built as users build them; and a run with no
count set is watched from outside (inotify) to open each file of epoch 1
on the source once, the probe's opens included.
"""

import collections
import os
import threading

import numpy as np
import pytest
from conftest import load_catalog

from stager import plan
from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.engine.perf import MAX_IN_FLIGHT, Tuner, split_slots
from stager.engine.perf.clock import Span, has_schedstat, thread_clock
from stager.engine.perf.start import START_IN_FLIGHT
from stager.job.synth import make_dataset
from stager.slowfs import SlowFS

SLOTS = 16


def _window(tuner, now, items, wall_s, cpu_s, queued_s, cores_busy):
    """One window of ``items`` finished items, each ``wall_s`` long, ``cpu_s`` on a core and ``queued_s`` waiting
    for one, with a backlog behind them (the pool was held back); returns the tuner's decision."""
    tuner.asked(items + 8 * tuner.count, now)
    for _ in range(items):
        tuner.finished(1, wall_s, cpu_s, queued_s)
    return tuner.decide(now + items * wall_s / tuner.count, cores_busy)  # every slot busy the whole window


def _warm(tuner):
    """The tuner's start (it judges from its second window on)."""
    tuner.asked(SLOTS, 0.0)
    for _ in range(SLOTS):
        tuner.finished(1, 0.02, 0.001, 0.0)
    tuner.decide(0.1, 0.5)
    return 0.1


@pytest.mark.parametrize("queued_s, grows", [(0.017, False), (None, True)])
def test_tasks_queued_for_a_core_do_not_grow_the_requests_on_a_full_machine(queued_s, grows):
    """20 ms a file, 2 ms of it on a core and 17 ms queued for one, the cores 95% busy: the files wait for a core,
    not for the source, and more requests would only queue longer. Where the run queue is not known (None), the
    same trace reads as waiting on the source, and the requests double (the rule that grew the pool to 48-64
    prefetchers under DLIO on two cores)."""
    tuner = Tuner(SLOTS, START_IN_FLIGHT, 64 * MAX_IN_FLIGHT, window_s=0.25, min_items=8, cores=2)
    now = _warm(tuner)
    decision = _window(tuner, now, 400, 0.02, 0.002, queued_s, cores_busy=0.95)
    assert (decision.count > SLOTS) is grows, decision
    if grows:
        assert decision.why == "held back, waiting on the source"


def test_tasks_waiting_on_the_source_grow_files_in_flight_before_processes():
    """20 ms a file, 1 ms on a core, none queued, the cores a third busy: the tuner grows the files in flight,
    and they are split into threads of the one prefetcher; a process is added only where the prefetchers' own
    CPU is the limit."""
    tuner = Tuner(SLOTS, START_IN_FLIGHT, 64 * MAX_IN_FLIGHT, window_s=0.25, min_items=8, cores=2)
    now = _warm(tuner)
    decision = _window(tuner, now, 400, 0.02, 0.001, 0.0, cores_busy=0.3)
    assert decision.count > SLOTS and decision.why == "held back, waiting on the source"
    processes, threads = split_slots(decision.count, 1)
    assert processes == 1 and threads == min(MAX_IN_FLIGHT, decision.count)
    assert split_slots(decision.count, 1, cpu_bound=True) == (2, min(MAX_IN_FLIGHT, -(-decision.count // 2)))
    # More files than one process's threads hold do not fork processes by themselves.
    assert split_slots(4 * MAX_IN_FLIGHT, 1) == (1, MAX_IN_FLIGHT)
    # Fewer files in flight than processes: as many processes as files, one each.
    assert split_slots(2, 3) == (2, 1)


def test_an_idle_tuner_of_files_in_flight_never_goes_below_the_start():
    tuner = Tuner(SLOTS, START_IN_FLIGHT, 64 * MAX_IN_FLIGHT, window_s=0.25, min_items=1, cores=2)
    now = _warm(tuner)
    for step in range(1, 8):  # idle windows: nothing asked, nothing to do
        tuner.decide(now + step, 0.1)
    assert tuner.count == START_IN_FLIGHT


def test_a_thread_s_clock_tells_its_cpu_apart_from_its_wait():
    """A thread that sleeps gets no CPU; one that spins gets about its wall time (Linux: schedstat)."""
    span = Span().start()
    threading.Event().wait(0.05)
    span.stop()
    assert span.wall_s >= 0.05 and span.cpu_s < 0.04
    cpu, queued = thread_clock()
    assert cpu > 0
    assert (queued is not None) == has_schedstat()
    if has_schedstat():
        assert span.queued_s is not None and span.queued_s >= 0


def _config(source, local, **sections):
    data = {"dataset": {"source": str(source), "manifest": "manifest.tsv", "loader": "npy"},
            "plan": {"batch_size": 8, "epochs": 2, "seed": 5},
            "staging": {"local_dir": str(local)}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def test_the_config_s_counts_are_auto_unless_set():
    cfg = config_from_dict({"dataset": {"source": "/data"}})
    assert (cfg.staging.prefetchers, cfg.dataset.requests_in_flight, cfg.reader.workers) == ("auto",) * 3
    cfg = config_from_dict({"dataset": {"source": "/data", "requests_in_flight": 4},
                            "staging": {"prefetchers": 3}, "reader": {"workers": 2}})
    assert (cfg.staging.prefetchers, cfg.dataset.requests_in_flight, cfg.reader.workers) == (3, 4, 2)
    with pytest.raises(Exception, match="dataset.requests_in_flight"):
        config_from_dict({"dataset": {"source": "/data", "requests_in_flight": 0}})


def test_the_pytorch_front_end_keeps_num_workers_and_resolves_the_rest(slow_source, tmp_path):
    pytorch = pytest.importorskip("iterators.pytorch")
    from torch.utils.data import Dataset

    paths = [line.split("\t")[0] for line in open(os.path.join(slow_source, "manifest.tsv")) if line.strip()]

    class Files(Dataset):
        """Arrays in ``.npy`` files of the emulated source, one a sample."""

        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            return self.stager_load(self.stager_path(i), i)

        def stager_path(self, i):
            return os.path.join(slow_source, paths[i])

        def stager_load(self, path, i):
            return np.load(path)

    staging = {"staging": {"local_dir": str(tmp_path / "local")}}
    loader = pytorch.StagedLoader(Files(), batch_size=10, num_workers=3, config=staging)
    assert loader.config.reader.workers == 3 and loader.config.staging.prefetchers == "auto"
    loader.close()
    with pytorch.StagedLoader(Files(), batch_size=10, config=staging) as loader:
        assert loader.config.reader.workers == "auto"
        got, start = 0, None
        for batch in loader:
            got += len(batch)
            start = start or loader.report()["counts_timeline"][0]
        assert got == len(paths)
    assert start["why"].startswith("auto, from a probe")
    assert all(isinstance(start[k], int) and start[k] >= 1 for k in ("prefetchers", "in_flight", "readers"))


def test_the_chainer_front_end_keeps_n_processes_and_resolves_the_rest(slow_source, tmp_path):
    chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
    cfg = _config(slow_source, tmp_path / "local")
    it = chainer_front.StagingIterator(cfg, 8, n_processes=2, repeat=False)
    try:
        assert it.config.reader.workers == 2 and it.config.staging.prefetchers == "auto"
    finally:
        it.finalize()
    it = chainer_front.StagingIterator(cfg, 8, repeat=False)
    try:
        assert it.config.reader.workers == "auto"
        assert sum(len(batch) for batch in it) == len(load_catalog(cfg))
    finally:
        it.finalize()


def test_a_chainer_dataset_on_the_defaults_opens_each_file_once_probe_included(tmp_path):
    """The one-line change from MultiprocessIterator, nothing else set: Chainer's orders are drawn as the
    iterator goes, and the probe reads the first ones' files into the staging directory all the same, so each
    JPEG is opened on the source once in two epochs (inotify on the emulator's backing tree); each epoch
    delivers every example once, equal to Chainer's own ``LabeledImageDataset`` reading of the source."""
    chainer_front = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")
    import chainer
    from helpers.opens import Opens

    data = tmp_path / "data"
    make_dataset(str(data), 48, nbytes=3000, classes=3, seed=4, progress=False, fmt="jpeg")
    os.remove(data / "manifest.tsv")
    pairs = [(os.path.join(c, name), label) for label, c in enumerate(sorted(os.listdir(data)))
             for name in sorted(os.listdir(data / c))]
    expected = collections.Counter((chainer.datasets.LabeledImageDataset(pairs, root=str(data))[i][0].tobytes(),
                                    label) for i, (_, label) in enumerate(pairs))
    (tmp_path / "mnt").mkdir()
    with SlowFS(str(data), str(tmp_path / "mnt"), open_ms=5.0) as mnt:
        with Opens(data) as opens:
            it = chainer_front.StagingIterator(chainer.datasets.LabeledImageDataset(pairs, root=mnt), 8,
                                               config={"staging": {"local_dir": str(tmp_path / "local")}})
            try:
                epochs = [collections.Counter(), collections.Counter()]
                while it.epoch < 2:
                    epoch = it.epoch
                    epochs[epoch].update((image.tobytes(), int(label)) for image, label in next(it))
                start = it.report()["counts_timeline"][0]
            finally:
                it.finalize()
            counts = opens.count()
    assert start["why"].startswith("auto, from a probe")
    assert epochs == [expected, expected]
    assert dict(counts) == {path: 1 for path, _ in pairs}
    assert not os.listdir(tmp_path / "local"), "the staging directory was not removed"


def _run_counting_opens(data, tmp_path, **sections):
    """A run on the defaults of ``data`` behind the emulator: its config, batches, counts timeline, catalog, and
    the opens of the source's files (inotify on the backing tree; the manifest left out)."""
    from helpers.opens import Opens

    (tmp_path / "mnt").mkdir()
    with SlowFS(str(data), str(tmp_path / "mnt"), open_ms=5.0) as mnt:
        cfg = _config(mnt, tmp_path / "local", **sections)
        with Opens(data) as opens:
            with Pipeline(cfg) as pipe:
                batches = [(b.epoch, b.step, b.indices.tolist(), b.samples) for b in pipe]
                timeline = pipe.counts_timeline()
                catalog = pipe.catalog
            counts = opens.count()
    counts.pop("manifest.tsv", None)
    return cfg, batches, timeline, catalog, counts


def test_epoch_one_under_the_defaults_opens_each_file_once_probe_included(tmp_path):
    """Nothing set but the local directory: the probe reads the plan's first files into the staging directory,
    the prefetchers find them there, and each file of the dataset is opened on the source once in two epochs
    (counted by inotify on the emulator's backing tree); every sample arrives once an epoch, in plan order,
    with the source's bytes."""
    data = tmp_path / "data"
    make_dataset(str(data), 160, nbytes=8192, classes=4, seed=2, progress=False)
    cfg, batches, timeline, catalog, counts = _run_counting_opens(data, tmp_path)
    assert dict(counts) == {catalog.path(i): 1 for i in range(len(catalog))}
    expected = [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    assert [b[:3] for b in batches] == expected
    for _, _, indices, samples in batches:
        for i, (array, label) in zip(indices, samples):
            assert np.array_equal(array, np.load(data / catalog.path(i))) and label == catalog.label(i)
    start = timeline[0]
    assert start["why"].startswith("auto, from a probe")
    assert start["prefetchers"] * start["in_flight"] >= START_IN_FLIGHT
    assert not os.listdir(tmp_path / "local"), "the staging directory was not removed"


def test_epoch_one_under_the_defaults_stages_each_tar_shard_once_probe_included(tmp_path):
    """The same for tar shards: the probe reads the plan's first containers into the staging directory, so
    each container is opened once in two epochs (to be staged; the catalog reads the index written beside
    it) and every sample's parts are the shard's."""
    import tarfile

    from stager.formats.tar import index_name
    from stager.job.packing import make_shards

    data = tmp_path / "data"
    make_shards(str(data), "tar", 160, 3000, 4, 2, 20, progress=False)
    members = {}
    for name in sorted(os.listdir(data)):
        if name.endswith(".tar"):
            with tarfile.open(data / name) as tar:
                members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    cfg, batches, timeline, catalog, counts = _run_counting_opens(
        data, tmp_path, dataset={"format": "tar", "loader": "raw"},
        plan={"shuffle_algorithm": "shards", "shard_window": 2})
    assert dict(counts) == {**{p: 1 for p in catalog.files.paths()}, **{index_name(p): 1 for p in catalog.files.paths()}}
    spec = plan.PlanSpec.from_config(len(catalog), cfg.plan, 1, containers=catalog.containers)
    assert [b[:3] for b in batches] == [(m.epoch, m.step, m.indices.tolist()) for m in spec.minibatches(0)]
    for epoch in range(2):
        assert sorted(i for e, _, idx, _ in batches if e == epoch for i in idx) == list(range(len(catalog)))
    for _, _, _, samples in batches:
        for sample in samples:
            assert sample["npy"] == members[sample["__key__"] + ".npy"]
            assert sample["cls"] == members[sample["__key__"] + ".cls"]
    assert timeline[0]["why"].startswith("auto, from a probe")
    assert not os.listdir(tmp_path / "local"), "the staging directory was not removed"


def test_a_queue_of_files_hands_out_twice_the_files_in_flight_earliest_deadline_first():
    """Where prefetchers keep files in flight, the deadline queue counts files, not tasks: a rank's later
    minibatches wait behind a neighbour's next one however many files each task holds."""
    from stager.engine.node.deadlines import DeadlineQueue

    put = []
    queue = DeadlineQueue(put.append)
    for seq, (task, files) in enumerate([("a", 6), ("b", 6), ("c", 6), ("d", 2)]):
        queue.push(seq, task, task, files)
    queue.push(0, "urgent", "urgent", 4)  # another rank's next minibatch, asked for last
    queue.feed(8)  # 16 files at most: 4 + 6 + 6, then one more since the sum is under 16
    assert put == ["a", "urgent", "b"] and queue.handed_out == 16
    queue.done("a")
    queue.feed(8)
    assert put == ["a", "urgent", "b", "c"] and queue.handed_out == 16
    queue.done("c"), queue.done("urgent"), queue.done("b")
    queue.feed(8)
    assert put[-1] == "d" and queue.handed_out == 2 and not len(queue)
    big = DeadlineQueue(put.append)
    big.push(0, "whole", "whole", 40)
    big.feed(8)
    assert put[-1] == "whole", "a task larger than the capacity still goes once nothing is handed out"


def test_prefetchers_with_files_in_flight_get_tasks_of_several_files_on_the_defaults(tmp_path):
    """On the defaults a prefetcher keeps files in flight in threads: a minibatch's files go out in tasks of
    half a prefetcher's threads (at least one task a prefetcher), not one or two files a task, each costing a
    round trip; every sample still arrives once an epoch, in plan order, with the source's bytes."""
    data = tmp_path / "data"
    make_dataset(str(data), 256, nbytes=4096, classes=4, seed=3, progress=False)
    (tmp_path / "mnt").mkdir()
    with SlowFS(str(data), str(tmp_path / "mnt"), open_ms=5.0) as mnt:
        cfg = _config(mnt, tmp_path / "local", plan={"batch_size": 32})
        with Pipeline(cfg) as pipe:
            batches = [(b.epoch, b.step, b.indices.tolist(), b.samples) for b in pipe]
            timeline = pipe.counts_timeline()
            prefetch = pipe.accounting()["stages"]["prefetch"]
            catalog = pipe.catalog
    expected = [(m.epoch, m.step, m.indices.tolist()) for m in plan.iterate(len(catalog), cfg.plan)]
    assert [b[:3] for b in batches] == expected
    for _, _, indices, samples in batches:
        for i, (array, label) in zip(indices, samples):
            assert np.array_equal(array, np.load(data / catalog.path(i))) and label == catalog.label(i)
    # The fewest files a task could hold in this run, from its own counts: half the fewest threads a
    # prefetcher had, or a minibatch spread over the most prefetchers.
    threads = min(row["in_flight"] for row in timeline)
    processes = max(row["prefetchers"] for row in timeline)
    per = min(-(-threads // 2), -(-32 // processes))
    steps = len(catalog) // 32  # epoch 1's minibatches: epoch 2 finds every file staged
    assert prefetch["files"] > 0 and 1 <= prefetch["tasks"] <= steps * -(-32 // per), (prefetch, timeline)
