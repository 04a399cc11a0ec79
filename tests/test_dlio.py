"""DLIO (dlio_benchmark 2.0.0, MLPerf Storage's engine) runs its workloads through iterators.dlio.

Real DLIO throughout: its CLI generates the datasets and runs the
workloads of configs/dlio with ``++workload.reader.data_loader_classname=
iterators.dlio.StagedDataLoader``, behind the FUSE emulator; the source's
opens are counted by inotify on the emulator's backing directory. The
samples handed to DLIO are checked by tests/helpers/dlio_batches.py, which
drives the loader through DLIO's own configuration and factory. Where
opens are counted, prefetchers are a fixed number: ``auto`` (the workloads'
setting) probes a few files of the source itself at start.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from helpers.opens import Opens
from stager.slowfs import SlowFS
from test_mpi_run import MPIEXEC

pytest.importorskip("dlio_benchmark", reason="DLIO is not installed (extra 'dlio', docs/dlio.md)")

DLIO = os.path.join(os.path.dirname(sys.executable), "dlio_benchmark")
CONFIGS = os.path.join(REPO, "configs", "dlio")
STAGED = ["++workload.reader.data_loader_classname=iterators.dlio.StagedDataLoader",
          "++workload.reader.data_loader_sampler=index"]
AU = re.compile(r"Epoch (\d+) - Block 1 \[Training\] Accelerator Utilization \[AU\] \(%\): ([0-9.]+)")
EVAL_AU = re.compile(r"Epoch (\d+) \[Eval\] Accelerator Utilization \[AU\] \(%\): ([0-9.]+)")
# Small versions of the workloads: the configs' own settings, fewer and smaller files, a short step.
NPZ = ["workload=resnet50_npz", "++workload.dataset.num_files_train=48", "++workload.dataset.record_length=4096",
       "++workload.dataset.record_length_resize=4096", "++workload.reader.batch_size=8",
       "++workload.train.computation_time=0.002", "++workload.dataset.num_files_eval=16",
       "++workload.reader.batch_size_eval=4", "++workload.evaluation.eval_time=0.001"]
HDF5 = ["workload=cosmoflow_hdf5", "++workload.dataset.num_files_train=8", "++workload.dataset.num_samples_per_file=16",
        "++workload.dataset.record_length=4096", "++workload.reader.batch_size=4",
        "++workload.train.computation_time=0.002"]


def dlio(cwd, data, *overrides, nodes=(), env=None, check=True, timeout=300):
    """Runs ``dlio_benchmark`` on the workloads of configs/dlio; returns its exit code and output.

    Args:
        nodes: Emulated node names: one rank on each, under ``mpiexec``; empty: one process.
    """
    out = os.path.join(cwd, "out")
    command = [DLIO, "--config-dir", CONFIGS, f"hydra.run.dir={out}", f"++workload.dataset.data_folder={data}",
               *overrides]
    if nodes:
        groups = [["-n", "1", "-env", "STAGER_NODE_ID", node, *command] for node in nodes]
        command = [MPIEXEC] + [word for group in groups for word in group + [":"]][:-1]
    environment = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if check:
        assert proc.returncode == 0, output[-6000:]
    return proc.returncode, output


def generate(tmp_path_factory, name, workload):
    """DLIO's own generator writes the workload's dataset (training, and evaluation where it has one)."""
    where = tmp_path_factory.mktemp(name)
    data = str(where / "data")
    dlio(str(where), data, *workload, "++workload.workflow.generate_data=True", "++workload.workflow.train=False")
    return data


@pytest.fixture(scope="module")
def npz_data(tmp_path_factory):
    return generate(tmp_path_factory, "dlio-npz", NPZ + ["++workload.workflow.evaluation=True"])


@pytest.fixture(scope="module")
def hdf5_data(tmp_path_factory):
    return generate(tmp_path_factory, "dlio-hdf5", HDF5)


def slow(data, tmp_path):
    """The dataset behind the FUSE emulator, 2 ms an open."""
    os.mkdir(tmp_path / "mnt")
    return SlowFS(data, str(tmp_path / "mnt"), open_ms=2.0)


def files_of(root, sub):
    return sorted(os.path.join(sub, name) for name in os.listdir(os.path.join(root, sub)))


def report(tmp_path, name="stager-train.json"):
    with open(tmp_path / "out" / name) as fh:
        return json.load(fh)


def test_dlio_trains_three_epochs_and_evaluates_through_stager_reading_each_file_once(npz_data, tmp_path):
    local = tmp_path / "local"
    with slow(npz_data, tmp_path) as mounted, Opens(npz_data) as opens:
        _, output = dlio(str(tmp_path), mounted, *NPZ, *STAGED, "++workload.workflow.evaluation=True",
                         f"++workload.stager.staging.local_dir={local}", "++workload.stager.staging.prefetchers=4")
        counts = opens.count()
    assert "Running DLIO with custom data loader class StagedDataLoader" in output
    assert [int(e) for e, _ in AU.findall(output)] == [1, 2, 3], output[-3000:]
    assert all(0 < float(au) <= 100 for _, au in AU.findall(output))
    assert [int(e) for e, _ in EVAL_AU.findall(output)] == [1, 2, 3]
    with open(tmp_path / "out" / "summary.json") as fh:
        assert len(json.load(fh)["metric"]["train_au_percentage"]) == 3
    wanted = files_of(npz_data, "train") + files_of(npz_data, "valid")
    assert len(wanted) == 64 and dict(counts) == {f: 1 for f in wanted}, "each file read from the source once"
    train, evaluation = report(tmp_path), report(tmp_path, "stager-eval.json")
    assert (train["samples"], train["batches"]) == (3 * 48, 3 * 6)
    assert evaluation["samples"] == 3 * 16
    assert os.listdir(local) == [], "the staging directories were removed"


def test_dlio_under_mpiexec_as_two_nodes_gives_each_rank_its_share_and_each_node_reads_a_file_once(npz_data,
                                                                                                  tmp_path):
    config = tmp_path / "stager.yaml"
    config.write_text(f"staging:\n  local_dir: {tmp_path / 'local'}\n")  # the site's file; the workload's on top
    with slow(npz_data, tmp_path) as mounted, Opens(npz_data) as opens:
        _, output = dlio(str(tmp_path), mounted, *NPZ, *STAGED, "++workload.stager.staging.prefetchers=3",
                         nodes=("node-a", "node-b"),
                         env={"STAGER_CONFIG": str(config)})
        counts = opens.count()
    assert "Running DLIO with 2 process(es)" in output
    assert [int(e) for e, _ in AU.findall(output)] == [1, 2, 3]
    train = report(tmp_path)
    assert train["nodes"] == 2 and train["world_size"] == 2
    assert train["samples"] == 3 * 48, "each epoch, every sample once across the two ranks"
    for name, node_counts in train["nodes_accounting"].items():
        assert node_counts["prefetch"]["files_from_source"] <= 48, f"{name} read a file twice"
    read = {f: n for f, n in counts.items() if f.startswith("train")}
    assert set(read) == set(files_of(npz_data, "train"))
    assert max(read.values()) <= 2, "at most once per node"
    # Without peers both nodes may open one file at the same moment, which the outside count may
    # see as one open (helpers/opens.py): what the source saw is at most what the nodes report.
    reported = sum(n["prefetch"]["files_from_source"] for n in train["nodes_accounting"].values())
    assert sum(read.values()) <= reported <= 2 * 48


def test_dlio_reads_hdf5_files_of_many_samples_as_containers_staged_once(hdf5_data, tmp_path):
    with slow(hdf5_data, tmp_path) as mounted, Opens(hdf5_data) as opens:
        _, output = dlio(str(tmp_path), mounted, *HDF5, *STAGED, "++workload.stager.staging.prefetchers=2",
                         f"++workload.stager.staging.local_dir={tmp_path / 'local'}")
        counts = opens.count()
    assert [int(e) for e, _ in AU.findall(output)] == [1, 2, 3]
    assert dict(counts) == {f: 1 for f in files_of(hdf5_data, "train")}, "each container read once, not per sample"
    assert report(tmp_path)["samples"] == 3 * 8 * 16


@pytest.mark.parametrize("fmt, per_file", [("npz", 1), ("hdf5", 4)])
def test_the_batches_dlio_gets_are_the_source_samples_each_once_an_epoch(tmp_path, fmt, per_file):
    data = str(tmp_path / "data")
    workload = NPZ if fmt == "npz" else HDF5
    dlio(str(tmp_path), data, *workload, "++workload.workflow.generate_data=True", "++workload.workflow.train=False",
         f"++workload.dataset.num_samples_per_file={per_file}", "++workload.dataset.num_files_train=12")
    out = tmp_path / "check"
    out.mkdir()
    # auto: the training process probes (decodes) a few files before the readers are forked from it.
    (out / "stager.yaml").write_text(f"staging:\n  local_dir: {tmp_path / 'local'}\n  prefetchers: auto\n")
    helper = os.path.join(REPO, "tests", "helpers", "dlio_batches.py")
    proc = subprocess.run([sys.executable, helper, data, str(out), fmt, str(per_file), "4", "2"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["loader"] == "StagedDataLoader" and got["equal"], "a sample differs from the source"
    every = sorted([f, s] for f in range(12) for s in range(per_file))
    assert [sorted(epoch) for epoch in got["epochs"]] == [every, every]
    assert got["epochs"][0] != got["epochs"][1], "each epoch its own order"
    assert got["closed"], "the last finalize() stopped the pipeline"


def test_an_unknown_key_of_the_workloads_stager_section_is_refused_by_name(npz_data, tmp_path):
    code, output = dlio(str(tmp_path), npz_data, *NPZ, *STAGED, "++workload.stager.staging.prefetcherz=4",
                        check=False)
    assert code != 0
    assert "prefetcherz" in output and "prefetchers" in output, output[-3000:]


def test_dlio_imports_without_tensorflow_and_its_tensorflow_profiler_says_what_it_needs():
    probe = ("import importlib.util, dlio_benchmark.main\n"
             "from dlio_benchmark.profiler.profiler_factory import TFProfiler\n"
             "assert importlib.util.find_spec('tensorflow') is None\n"
             "try:\n    TFProfiler.get_instance()\nexcept ImportError as exc:\n    print(exc)\n")
    try:
        import tensorflow  # noqa: F401
        pytest.skip("TensorFlow is installed: DLIO's own profiler module is used")
    except ImportError:
        pass
    # Fresh interpreters in isolated mode (no PYTHONPATH, no current directory): only the venv's .pth hook helps.
    fresh = lambda code: subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,  # noqa
                                        timeout=120, cwd="/")
    proc = fresh(probe)
    assert proc.returncode == 0, proc.stderr
    assert "needs TensorFlow" in proc.stdout and "iostat" in proc.stdout
    without_hook = fresh("import sys\n"
                         "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_BeforeDLIOProfiler']\n"
                         "import dlio_benchmark.main")
    assert without_hook.returncode != 0 and "tensorflow" in without_hook.stderr, "the hook is what makes it import"


def test_a_format_stager_cannot_read_is_named():
    from iterators._dlio_files import DLIOFiles

    with pytest.raises(ValueError, match="'tfrecord'.*DLIO's own data loader"):
        DLIOFiles(["a.tfrecord"], 1, "tfrecord")


def test_the_workloads_of_configs_dlio_run_on_stager_s_defaults():
    import yaml

    from stager.config import config_from_dict

    names = sorted(os.listdir(os.path.join(CONFIGS, "workload")))
    assert names == ["cosmoflow_hdf5.yaml", "resnet50_npz.yaml", "unet3d_npz.yaml"]
    for name in names:
        with open(os.path.join(CONFIGS, "workload", name)) as fh:
            workload = yaml.safe_load(fh)
        assert workload["framework"] == "pytorch" and workload["reader"]["data_loader"] == "pytorch", name
        assert "stager" not in workload, f"{name}: no stager setting, the defaults choose the counts"
        assert config_from_dict(workload.get("stager") or {}).staging.prefetchers == "auto", name


def test_threads_reading_containers_at_once_each_get_their_own_samples(tmp_path):
    """``auto``'s probe decodes a few files at once in threads of the training process."""
    import threading

    import h5py
    import numpy as np

    from iterators._dlio_files import DLIOFiles

    files = []
    for f in range(8):
        files.append(str(tmp_path / f"img_{f}.hdf5"))
        with h5py.File(files[-1], "w") as fh:
            fh.create_dataset("records", data=np.full((4, 8, 8), f * 4, np.uint8) + np.arange(4)[:, None, None])
    dataset = DLIOFiles(files, 4, "hdf5")
    wrong = []

    def read(start):
        for _ in range(25):
            for i in range(start, 32, 8):
                try:
                    got = int(dataset.stager_load(dataset.stager_path(i), i)[0, 0])
                except Exception as exc:  # another thread closed the file under this one
                    got = repr(exc)
                if got != i:
                    wrong.append((i, got))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert [int(dataset[i][0, 0]) for i in range(32)] == list(range(32)), "and in order on the main thread"
