"""The benchmark's scenarios, run side by side on one emulated slow file system.

Scenario ``throughput`` (the published experiment, scaled by flags): one
epoch of ``batches`` minibatches read as fast as possible, for every
prefetcher count p and reader count k. Scenario ``training``: two epochs
with a simulated compute time per step, total time and stall fraction.

The bound for a setting is the time no implementation can beat:
``max(files x open latency / concurrent opens + bytes / bandwidth, ideal)``,
where concurrent opens are the prefetchers (stager, stage-all-first) or the
readers (direct reading), and ``ideal`` reads an already local copy with the
same readers. Efficiency is bound / measured.

Two workloads: ``npy`` (random uint8 arrays, decoding costs nothing) and
``jpeg`` (256x256 JPEGs decoded to float32 channel-first, as an ImageNet
training script does; decoding dominates). Every run also records the CPU
seconds of each process kind (``cpu.py``), so a method that wins on wall
time by burning cores elsewhere shows it.
"""

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import List

from ..catalog import Catalog
from ..job.progress import Progress
from ..job.synth import MANIFEST, make_dataset
from ..slowfs import SlowFS, mount_entry
from . import methods as m
from .cpu import CpuMeter


@dataclass
class BenchOptions:
    """What to run.

    Attributes:
        batches: Minibatches in the throughput epoch (the published run: 1,000).
        batch_size: Samples per minibatch (published: 32).
        bytes: Bytes per sample (published: ~110 KB).
        open_ms: Latency per open of the emulated file system.
        mbps: Its shared bandwidth in MB/s (0: unlimited).
        prefetchers: Prefetcher counts to sweep.
        readers: Reader counts to sweep.
        compute_ms: Simulated compute per step in the training scenario.
        train_prefetchers: Prefetchers in the training scenario.
        train_readers: Readers in the training scenario.
        workdir: Where the dataset goes; None: a temporary directory,
            removed at the end.
        local_dir: The node-local storage every method copies to and
            reads from; None: a RAM file system (/dev/shm) where there is
            one, else ``workdir`` (see ``default_local_dir``).
        engine: The emulator's engine (``auto``, ``c``, ``python``).
        chainer: Include Chainer's MultiprocessIterator.
        format: The workload: ``npy`` or ``jpeg`` (decoded by the ``image``
            loader to float32 CHW by every method).
    """

    batches: int = 100
    batch_size: int = 32
    bytes: int = 110_000
    open_ms: float = 10.0
    mbps: float = 500.0
    prefetchers: List[int] = field(default_factory=lambda: [2, 4, 8, 12, 16])
    readers: List[int] = field(default_factory=lambda: [2, 4, 8])
    compute_ms: float = 40.0
    train_prefetchers: int = 12
    train_readers: int = 2
    workdir: str = None
    local_dir: str = None
    engine: str = "auto"
    chainer: bool = True
    format: str = "npy"

    def workload(self, catalog, source, local, epochs, compute_s):
        """The ``methods.Workload`` of this format."""
        return m.Workload(catalog, source, local, self.batch_size, epochs=epochs, compute_s=compute_s,
                          loader="image" if self.format == "jpeg" else "npy", layout="chw")


def _measured(run):
    """``run()``'s ``Result`` as a dictionary, with its CPU seconds per process kind."""
    with CpuMeter() as meter:
        result = run()
    row = result.to_dict()
    row["cpu_s"] = meter.seconds()
    return result, row


def default_local_dir(work, need_bytes=0):
    """A RAM file system where there is one with ``need_bytes`` free, else ``work``.

    Every run creates and deletes thousands of files; on a disk's ext4,
    creating a file just after thousands were deleted makes the inode
    allocator skip each recently deleted inode (``recently_deleted`` in
    ext4's ialloc.c), which cost a third of the machine's CPU in this
    benchmark and hit the methods that copy, not ``ideal``. A node-local NVMe
    staged once per job does not pay that; a RAM file system stands in for it.
    (A container's /dev/shm is often 64 MB: then the disk it is.)
    """
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= need_bytes:
            return shm
    return work


def _fs_type(path):
    best, kind = "", "unknown"
    path = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            mnt = fields[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, fields[2]
    return kind


def source_bound(files, nbytes, open_s, mbps, concurrency):
    """Seconds the source needs at best: opens spread over ``concurrency``, bytes at full bandwidth."""
    return files * open_s / concurrency + (nbytes / (mbps * 1e6) if mbps else 0.0)


def run_bench(opts, out=print):
    """Runs both scenarios; returns a JSON-ready dictionary."""
    own = opts.workdir is None
    work = tempfile.mkdtemp(prefix="stager-bench-") if own else opts.workdir
    try:
        data = os.path.join(work, "data")
        samples = opts.batches * opts.batch_size
        if not os.path.exists(os.path.join(data, MANIFEST)):
            make_dataset(data, samples, opts.bytes, classes=10, seed=0, fmt=opts.format)
        # At most three copies at once (staging, stage-all-first, ideal), and room to spare.
        need = 4 * samples * opts.bytes
        scratch = tempfile.mkdtemp(prefix="stager-bench-local-", dir=opts.local_dir or default_local_dir(work, need))
        try:
            local = _fresh(scratch, "staging")
            with SlowFS(data, open_ms=opts.open_ms, mbps=opts.mbps, engine=opts.engine) as mnt:
                catalog = Catalog.from_manifest(mnt, MANIFEST)
                result = {"settings": {k: v for k, v in opts.__dict__.items() if k != "workdir"},
                          "files": len(catalog), "bytes": catalog.total_bytes,
                          "engine": _engine_name(mnt), "local_fs": _fs_type(scratch)}
                result["throughput"] = _throughput(opts, catalog, mnt, local, scratch, out)
                result["training"] = _training(opts, catalog, mnt, local, scratch, out)
            result["local_copy"] = _local_copy(opts, data, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return result
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def _engine_name(mountpoint):
    """``c`` or ``python``: which engine serves the mount (from its daemon's command line)."""
    entry = mount_entry(mountpoint)
    try:
        with open(f"/proc/{entry.split(':', 1)[1]}/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0")[0]
    except (AttributeError, IndexError, OSError):
        return "unknown"
    return "c" if os.path.basename(argv0).startswith(b"slowfsd") else "python"


def _fresh(work, name):
    path = os.path.join(work, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _throughput(opts, catalog, mnt, local, work, out):
    w = opts.workload(catalog, mnt, local, epochs=1, compute_s=0.0)
    staged = _fresh(work, "staged")
    m.copy_all(mnt, staged, catalog, max(opts.prefetchers))
    runs = []
    ideal = {}
    plan = [("ideal", 0, k) for k in opts.readers]
    plan += [(name, 0, k) for k in opts.readers for name in ("direct-torch", "direct-chainer")
             if name != "direct-chainer" or opts.chainer]
    plan += [(name, p, k) for p in opts.prefetchers for k in opts.readers for name in ("stager", "stage-all-first")]
    bar = Progress(len(plan), "bench: throughput", "runs")
    for name, p, k in plan:
        if name == "ideal":
            r, row = _measured(lambda: m.ideal(w, k, staged))
            ideal[k] = r.wall_s
        elif name == "stage-all-first":
            r, row = _measured(lambda: m.stage_all_first(w, p, k, _fresh(work, "copy")))
        elif name == "stager":
            r, row = _measured(lambda: m.stager(w, p, k))
        else:
            r, row = _measured(lambda: m.METHODS[name](w, k))
        concurrency = p if p else k
        row["bound_s"] = round(r.wall_s if name == "ideal" else
                               max(source_bound(len(catalog), catalog.total_bytes, opts.open_ms / 1000,
                                                opts.mbps, concurrency), ideal.get(k, 0.0)), 4)
        row["efficiency"] = round(row["bound_s"] / r.wall_s, 3) if r.wall_s else 0.0
        runs.append(row)
        bar.update()
    bar.close()
    return runs


def _training(opts, catalog, mnt, local, work, out):
    w = opts.workload(catalog, mnt, local, epochs=2, compute_s=opts.compute_ms / 1000)
    p, k = opts.train_prefetchers, opts.train_readers
    staged = _fresh(work, "staged")
    m.copy_all(mnt, staged, catalog, p)
    runs = [lambda: m.ideal(w, k, staged), lambda: m.direct_torch(w, k)]
    if opts.chainer:
        runs.append(lambda: m.direct_chainer(w, k))
    runs += [lambda: m.stage_all_first(w, p, k, _fresh(work, "copy")), lambda: m.stager(w, p, k)]
    compute = 2 * (len(catalog) // opts.batch_size) * opts.compute_ms / 1000
    rows = []
    for run in runs:
        row = _measured(run)[1]
        row["compute_s"] = round(compute, 3)
        rows.append(row)
    return rows


def _local_copy(opts, data, work):
    """Staging from a fast local source (no emulation) against ``cp -r`` of the same files.

    Staging's rate is the files over the time until the last one was staged
    (readers consume meanwhile, as in a run); the whole pipeline's rate, to
    the last minibatch delivered, is reported beside it.
    """
    catalog = Catalog.from_manifest(data, MANIFEST)
    subprocess.run(["cp", "-r", data, _fresh(work, "warm")], check=True)  # both then read a warm cache
    dest = os.path.join(_fresh(work, "cp"), "data")
    begin = time.perf_counter()
    subprocess.run(["cp", "-r", data, dest], check=True)
    cp_s = time.perf_counter() - begin
    shutil.rmtree(os.path.dirname(dest))
    rows = {"cp_r_files_per_s": round(len(catalog) / cp_s, 1)}
    for p in (1, 2, 4):
        w = m.Workload(catalog, data, _fresh(work, "local-copy"), opts.batch_size, epochs=1, compute_s=0.0)
        cfg = w.config(dataset={"loader": "raw"}, staging={"prefetchers": p, "lookahead": 64},
                       reader={"workers": 1})
        staged = []
        begin = time.perf_counter()
        with m.Pipeline(cfg, catalog, on_staged=lambda *_: staged.append(time.perf_counter())) as pipe:
            for _ in pipe:
                pass
        end = time.perf_counter()
        rows[f"stager_{p}_prefetchers_files_per_s"] = round(len(staged) / (max(staged) - begin), 1)
        rows[f"pipeline_{p}_prefetchers_files_per_s"] = round(len(catalog) / (end - begin), 1)
    best = max(v for k, v in rows.items() if k.startswith("stager_"))
    rows["best_ratio_to_cp_r"] = round(best / rows["cp_r_files_per_s"], 3)
    return rows
