"""The same samples as one file each and packed in shards: staged by stager, and read directly.

64,000 samples of about 2 KB (``.npy``) are written once as files and
packed by ``stager pack`` into 64 tar shards and 64 HDF5 containers of
1,000 samples. Each tree is mounted behind the slow file system emulator
(10 ms an open, 200 MB/s) and read for 3 epochs by 2 emulated nodes of one
rank each (``mpiexec``, ``STAGER_NODE_ID``), every method with 2 reader
processes per rank:

- ``files, staged``: ``stager run`` over the files (pcg64 order, peers);
- ``tar, staged`` and ``hdf5, staged``: ``stager run`` over the containers
  (``shards`` shuffle, window 8; peers);
- ``tar, webdataset``: each rank reads its half of the shards with the
  ``webdataset`` library (shards shuffled per epoch, a 1,000-sample shuffle
  buffer), through a ``DataLoader`` of 2 workers;
- ``hdf5, h5py``: each rank reads its ``DistributedSampler`` share of a full
  permutation row by row with h5py, through a ``DataLoader`` of 2 workers.

Counted from outside: opens of the source's files (inotify on the tree
behind the emulator), bytes the emulator's daemon read from it
(``/proc/PID/io``), CPU seconds of the job's whole process tree (ranks,
prefetchers, readers, DataLoader workers: ``RUSAGE_CHILDREN``) and of the
emulator's daemon. The shuffle figures are rank 0's epoch 0 order:
``neighbour_spread`` (1.0 = a full permutation) and the distinct containers
in a minibatch of 64. Then the window's trade alone, from the plan.

    .venv/bin/python benchmarks/stores/shards.py --json docs/shards.json
    .venv/bin/python benchmarks/stores/shards.py --content jpeg --samples 6400 --per-shard 100 --json docs/shards-jpeg.json

With ``--content jpeg`` the samples are 256x256 JPEGs of about 115 KB,
decoded to float32 CHW (``loader: image``, ``layout: chw``; the direct
reader calls the same decoding functions), and HDF5 is left out (it holds
arrays, not encoded images).

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))

from helpers.opens import Opens  # noqa: E402  (the tests' outside counter)
from stager.catalog import Catalog, load_catalog  # noqa: E402
from stager.config import config_from_dict  # noqa: E402
from stager.job.packing import pack  # noqa: E402
from stager.job.synth import JPEG_BYTES, make_dataset  # noqa: E402
from stager.plan import PlanSpec  # noqa: E402
from stager.plan.quality import distinct_per_batch, neighbour_spread  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402
from stager.slowfs.mount import mount_entry  # noqa: E402

SAMPLES, PER_SHARD, EPOCHS, BATCH, WINDOW = 64_000, 1_000, 3, 64, 8

DIRECT = r"""
import json, os, sys, time
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset
rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
kind, root, epochs, batch, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
content = sys.argv[6]
def decode(s):
    if content == "jpeg":
        from stager.formats.images import decode_rgb, to_chw
        return s["__key__"], to_chw(decode_rgb(s["jpg"]))
    return s["__key__"], np.load(__import__("io").BytesIO(s["npy"]))
shards = sorted(f for f in os.listdir(root) if f.endswith((".tar", ".h5")))
order = []
begin = time.perf_counter()
if kind == "tar":
    import webdataset as wds
    for epoch in range(epochs):
        mine = [os.path.join(root, s) for s in shards[rank::size]]
        ds = (wds.WebDataset(mine, shardshuffle=len(mine), detshuffle=True, seed=epoch,
                             nodesplitter=lambda urls: urls, workersplitter=wds.split_by_worker)
              .shuffle(1000).map(decode))
        for keys, x in DataLoader(ds, batch_size=batch, num_workers=2):
            if epoch == 0:
                order.extend(keys)
else:
    import h5py
    class Rows(Dataset):
        def __init__(self):
            self.files, self.where = [os.path.join(root, s) for s in shards], []
            for k, f in enumerate(self.files):
                with h5py.File(f, "r") as fh:
                    self.where += [(k, r) for r in range(fh["x"].shape[0])]
            self.open = {}
        def __len__(self):
            return len(self.where)
        def __getitem__(self, i):
            k, r = self.where[i]
            if k not in self.open:
                self.open[k] = h5py.File(self.files[k], "r")
            return i, self.open[k]["x"][r]
    ds = Rows()
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=True, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for idx, x in DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=2):
            if epoch == 0:
                order.extend(idx.tolist())
seconds = time.perf_counter() - begin
with open(f"{out}.{rank}", "w") as fh:
    json.dump({"seconds": seconds, "order": order}, fh)
"""


def daemon_bytes(mnt):
    """Bytes the emulator's daemon has read from the backing tree so far, and its CPU seconds."""
    pid = int(mount_entry(mnt).split(":", 1)[1])
    with open(f"/proc/{pid}/io") as fh:
        nbytes = int(next(line for line in fh if line.startswith("rchar:")).split()[1])
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return nbytes, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def mpiexec(args, tmp, ranks=2):
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [exe]
    for r in range(ranks):
        cmd += ([":"] if r else []) + ["-n", "1", "-env", "STAGER_NODE_ID", f"n{r}", sys.executable] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TMPDIR=tmp), timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-4000:])


def measure(backing, mnt, run):
    """Runs ``run()`` counting opens of ``backing``'s files, the daemon's bytes and CPU, the job's CPU.

    Returns:
        ``({seconds, source_opens, source_mb, cpu_s, fuse_cpu_s}, run's result)``.
    """
    before, fuse_before = daemon_bytes(mnt)
    cpu_before = children_cpu()
    with Opens(backing) as opens:
        begin = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - begin
        counts = opens.count()
    counts.pop("manifest.tsv", None)
    after, fuse_after = daemon_bytes(mnt)
    return {"seconds": round(seconds, 2), "source_opens": sum(counts.values()),
            "source_mb": round((after - before) / 1e6, 1), "cpu_s": round(children_cpu() - cpu_before, 1),
            "fuse_cpu_s": round(fuse_after - fuse_before, 1)}, out


def staged(tmp, mnt, fmt, name, content):
    """``stager run`` over the tree at ``mnt`` on 2 emulated nodes; rank 0's epoch 0 order of catalog indices."""
    job = os.path.join(tmp, f"{name}.yaml")
    dataset = {"source": mnt, "manifest": "manifest.tsv", "format": fmt,
               **({"loader": "image", "layout": "chw"} if content == "jpeg" else {"loader": "npy"})}
    plan = {"batch_size": BATCH, "epochs": EPOCHS, "seed": 0}
    if fmt == "hdf5":
        dataset["keys"] = ["x", "y"]
    if fmt != "files":
        plan.update(shuffle_algorithm="shards", shard_window=WINDOW)
    cfg = {"dataset": dataset, "plan": plan, "reader": {"workers": 2},
           "staging": {"local_dir": os.path.join(tmp, "local"), "prefetchers": 8, "lookahead": 8,
                       "peers": "partition"}}
    with open(job, "w") as fh:
        json.dump(cfg, fh)  # JSON is YAML
    rec = os.path.join(tmp, f"rec-{name}")
    mpiexec(["-m", "stager", "run", job, "--quiet", "--report", os.path.join(rec, "r.json")], tmp)
    return config_from_dict(cfg)


def planned_order(cfg):
    """Rank 0's epoch 0 order of catalog indices, from the plan (listed after the run, outside the counts)."""
    catalog = load_catalog(cfg.dataset)
    spec = PlanSpec.from_config(len(catalog), cfg.plan, 2, containers=catalog.containers)
    return np.concatenate([m.indices for m in spec.minibatches(0) if m.epoch == 0])


def direct(tmp, mnt, kind, content):
    script = os.path.join(tmp, "direct.py")
    with open(script, "w") as fh:
        fh.write(DIRECT)
    out = os.path.join(tmp, f"direct-{kind}")
    mpiexec([script, kind, mnt, str(EPOCHS), str(BATCH), out, content], tmp)
    return [json.load(open(f"{out}.{r}")) for r in range(2)]


def figures(order, container_of):
    return {"spread": round(neighbour_spread(order, len(container_of)), 3),
            "containers_per_batch": round(distinct_per_batch(order, container_of, BATCH), 1)}


def window_table(samples, per_shard):
    """The ``shards`` shuffle's window against a full permutation, from the plan alone."""
    container_of = np.arange(samples) // per_shard
    rows = []
    full = np.random.default_rng(0).permutation(samples)
    rows.append({"window": "full permutation", **figures(full, container_of),
                 "containers_held": len(np.unique(container_of))})
    for window in (1, 2, 4, 8, 16, 32, 64):
        cfg = config_from_dict({"plan": {"batch_size": BATCH, "epochs": 1, "shuffle_algorithm": "shards",
                                         "shard_window": window}}).plan
        spec = PlanSpec.from_config(samples, cfg, 1, containers=container_of)
        order = np.concatenate([m.indices for m in spec.minibatches(0)])
        rows.append({"window": window, **figures(order, container_of),
                     "containers_held": spec.shuffle_algorithm.most_containers(8 * BATCH)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--content", choices=("npy", "jpeg"), default="npy", help="what a sample is (default npy)")
    parser.add_argument("--samples", type=int, default=SAMPLES, help=f"samples (default {SAMPLES})")
    parser.add_argument("--per-shard", type=int, default=PER_SHARD, help=f"samples a container (default {PER_SHARD})")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="stager-bench-shards-")
    samples, per_shard, jpeg = args.samples, args.per_shard, args.content == "jpeg"
    results = {"samples": samples, "per_shard": per_shard, "epochs": EPOCHS, "batch": BATCH, "window": WINDOW,
               "content": args.content, "open_ms": 10, "mbps": 200, "nodes": 2, "runs": [],
               "windows": window_table(samples, per_shard)}
    try:
        files = os.path.join(tmp, "files")
        make_dataset(files, samples, JPEG_BYTES if jpeg else 2000, 100, 0, progress=False,
                     fmt="jpeg" if jpeg else "npy")
        catalog = Catalog.from_manifest(files, "manifest.tsv")
        container_of = np.arange(samples) // per_shard  # pack keeps the catalog order
        formats = ("tar",) if jpeg else ("tar", "hdf5")
        for fmt in formats:
            pack(catalog, os.path.join(tmp, fmt), fmt, per_shard, progress=False)
        runs = [("files, staged", "files", "files"), ("tar, staged", "tar", "tar"), ("hdf5, staged", "hdf5", "hdf5"),
                ("tar, webdataset", "tar", None), ("hdf5, h5py", "hdf5", None)]
        for name, tree, fmt in [r for r in runs if r[1] in ("files",) + formats]:
            backing = os.path.join(tmp, tree)
            with SlowFS(backing, open_ms=10, mbps=200) as mnt:
                if fmt is not None:
                    counted, cfg = measure(backing, mnt, lambda: staged(tmp, mnt, fmt, tree, args.content))
                    order = planned_order(cfg)
                else:
                    counted, ranks = measure(backing, mnt, lambda: direct(tmp, mnt, tree, args.content))
                    keys = ranks[0]["order"]
                    order = np.array([int(str(k).rsplit("/", 1)[-1]) for k in keys], dtype=np.int64)
            row = {"method": name, **counted, **figures(order, container_of)}
            results["runs"].append(row)
            print(row, file=sys.stderr)
    finally:
        subprocess.run(["rm", "-rf", tmp])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    print(markdown(results))


def markdown(r):
    what = "256x256 JPEGs of about 115 KB, decoded to float32 CHW" if r.get("content") == "jpeg" else "about 2 KB"
    lines = [f"{r['samples']:,} samples of {what}, as files and as {r['samples'] // r['per_shard']} shards of "
             f"{r['per_shard']:,}; {r['epochs']} epochs, {r['nodes']} emulated nodes of one rank, 2 readers each; "
             f"{r['open_ms']} ms an open, {r['mbps']} MB/s.", "",
             "| method | time (s) | CPU s, job | CPU s, emulator | source opens | source MB | neighbour spread | "
             "containers per minibatch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["runs"]:
        lines.append(f"| {row['method']} | {row['seconds']} | {row['cpu_s']} | {row['fuse_cpu_s']} | "
                     f"{row['source_opens']:,} | {row['source_mb']} | {row['spread']} | {row['containers_per_batch']} |")
    lines += ["", "| shuffle window (containers) | neighbour spread | containers per minibatch | containers held "
                  "(look-ahead of 8) |", "|---|---:|---:|---:|"]
    for row in r["windows"]:
        lines.append(f"| {row['window']} | {row['spread']} | {row['containers_per_batch']} | {row['containers_held']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
