"""stager beside MosaicML Streaming and LitData: the same JPEGs on the same emulated file system, each as its users run it.

    python -m venv /tmp/peers && PIP_CONSTRAINT=constraints.txt /tmp/peers/bin/pip install -e ".[mpich,vision,s3,bench-peers]"
    cp .venv/lib/python3.11/site-packages/stager-torchvision.pth /tmp/peers/lib/python3.11/site-packages/
    /tmp/peers/bin/python benchmarks/loaders/peers_side.py --processes 4 --rounds 2 --json docs/peers-side.json

Streaming and LitData pin other versions of shared packages (the extra
``bench-peers``), so the benchmark runs from a venv of their own (with
the README's hook that lets torchvision import beside the CPU torch). 256x256
JPEGs of about 115 KB in ``--classes`` class directories lie behind the
FUSE emulator at ``--open-ms`` an open; every method applies torchvision's
training transforms (RandomResizedCrop(224), RandomHorizontalFlip,
ToTensor, Normalize), batch 32, shuffled, ``--epochs`` epochs, no compute,
``num_workers`` = N:

- ``dataloader``: ``DataLoader(ImageFolder(...), persistent_workers=True)``;
- ``stager``: the one-line ``StagedLoader(ImageFolder(...))``, nothing set
  but its local directory;
- ``stager-tar``: ``StagedLoader(ShardDataset(...))`` over the shards
  ``stager pack --processes N`` wrote from the mount;
- ``streaming``: Streaming's ``StreamingDataset(remote=the mount,
  local=a cache)`` over the shards ``MDSWriter`` wrote (one process, its
  only mode), under a ``DataLoader``, as Streaming's documentation shows;
- ``stager-mds``: ``StagedLoader(ShardDataset(..., format="mds"))`` over
  the very shards Streaming reads (``dataset.format: mds``);
- ``litdata``: LitData's ``StreamingDataset`` over the chunks
  ``litdata.optimize(num_workers=N)`` wrote, read in place (its behaviour
  for a local path), under its ``StreamingDataLoader``.

With ``--source s3`` the methods read an S3 bucket instead (moto's server
behind the latency proxy, ``--open-ms`` a request): the JPEGs, the tar
shards and Streaming's MDS shards are uploaded to it after their
conversion, and each method is given the bucket as its documentation says
(``DataLoader`` over a dataset that GETs each JPEG with boto3;
``StagedLoader(ShardDataset("s3://...", endpoint_url=...))``; Streaming's
``remote="s3://..."`` with ``S3_ENDPOINT_URL``). Two methods are left out:
the one-line ``StagedLoader(ImageFolder(...))`` reads a file tree, and
LitData 0.2.76 fetches its chunks with obstore, which refuses the store's
``http://`` endpoint with no setting to allow it (its ``storage_options``
reach only the boto3 client that fetches its index). The source's CPU is then the proxy's and the
server's, its bytes half what crossed loopback (each crossed it twice), and
opens are not counted.

Conversions read the JPEGs through the emulator and write beside them;
each is timed once per N. Each method then runs in a fresh process, the
methods alternating within each round, on a fresh mount. Reported per
method: conversion seconds, each epoch's median seconds, totals with and
without the conversion, seconds to the first batch, opens of the source's
files (inotify on the emulator's backing tree) and bytes the emulator read,
peak bytes in the method's local directory, loading processes, CPU seconds
per process kind, and classes per batch (how well the order mixes).
"""

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from peers_sources import FileTree, ObjectBucket  # noqa: E402
from torch_dropin import BATCH, cpu_of, one_run_arguments, timed_epochs, transforms  # noqa: E402  (the drop-in benchmark's)

METHODS = ("dataloader", "stager", "stager-tar", "streaming", "stager-mds", "litdata")
# Left out over the bucket: ImageFolder reads a file tree; LitData 0.2.76 GETs its chunks with obstore,
# which refuses moto's http:// endpoint ("builder error", BadScheme) and takes no setting to allow it.
NOT_OVER_S3 = {"stager": "ImageFolder reads a file tree",
               "litdata": "LitData 0.2.76's obstore client refuses an http:// endpoint"}


class _Decode:
    """JPEG bytes and a label to the transformed tensor and the label (picklable: workers may be spawned)."""

    def __init__(self):
        self.tf = transforms()

    def __call__(self, data, label):
        from PIL import Image

        return self.tf(Image.open(io.BytesIO(data)).convert("RGB")), int(label)


class _TarSample(_Decode):
    def __call__(self, sample):
        return super().__call__(sample["jpg"], sample["cls"])


class _MdsSample(_Decode):
    def __call__(self, sample):
        return super().__call__(sample["image"], sample["label"])


def _loader(args):
    """The method's data loader over ``args.data`` (the mount's root)."""
    from torch.utils.data import DataLoader

    from iterators.pytorch import ShardDataset, StagedLoader
    from torchvision.datasets import ImageFolder  # noqa: E402  (after iterators.pytorch)

    config = {"staging": {"local_dir": args.local}}
    store = args.endpoint or None  # an object store's URL: the data is under s3://
    if args.one == "dataloader":
        if store:
            from peers_sources import BucketImages

            images = BucketImages(os.path.join(args.data, "imgs"), store, _Decode())
        else:
            images = ImageFolder(os.path.join(args.data, "imgs"), transform=transforms())
        return DataLoader(images, batch_size=BATCH, shuffle=True, num_workers=args.n, persistent_workers=True)
    if args.one == "stager":
        return StagedLoader(ImageFolder(os.path.join(args.data, "imgs"), transform=transforms()), batch_size=BATCH,
                            shuffle=True, num_workers=args.n, config=config)
    if args.one == "stager-tar":
        shards = ShardDataset(os.path.join(args.data, f"tar-{args.n}"), format="tar", manifest="manifest.tsv",
                              transform=_TarSample(), endpoint_url=store)
        return StagedLoader(shards, batch_size=BATCH, shuffle=True, num_workers=args.n, config=config)
    if args.one == "stager-mds":
        shards = ShardDataset(os.path.join(args.data, "mds"), format="mds", transform=_MdsSample(), endpoint_url=store)
        return StagedLoader(shards, batch_size=BATCH, shuffle=True, num_workers=args.n, config=config)
    if args.one == "streaming":
        import streaming
        from streaming.base.util import clean_stale_shared_memory

        decode = _Decode()

        class Images(streaming.StreamingDataset):
            def __getitem__(self, index):
                sample = super().__getitem__(index)
                return decode(sample["image"], sample["label"])

        clean_stale_shared_memory()
        data = Images(remote=os.path.join(args.data, "mds"), local=args.local, shuffle=True, batch_size=BATCH)
        return DataLoader(data, batch_size=BATCH, num_workers=args.n)
    import litdata

    decode = _Decode()

    class Chunks(litdata.StreamingDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return decode(sample["image"], sample["label"])

    data = Chunks(os.path.join(args.data, f"lit-{args.n}"), shuffle=True)
    return litdata.StreamingDataLoader(data, batch_size=BATCH, num_workers=args.n)


def _bytes_under(path):
    """Bytes under ``path`` (``du``: copies may be evicted while it counts)."""
    done = subprocess.run(["du", "-sb", path], capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.stdout else 0


def one(args):
    """One method in this process: epochs, first batch, CPU per kind, processes, local bytes, mixing; JSON."""
    import torch

    from stager.bench.cpu import CpuMeter

    torch.manual_seed(0)
    loader = _loader(args)
    peak, classes = [0], []

    def batch(epoch, labels):
        if epoch == 0:
            classes.append(len(set(labels.tolist())))

    def epoch_done(_):
        peak[0] = max(peak[0], _bytes_under(args.local))

    with CpuMeter() as meter:
        epochs, first, processes = timed_epochs(loader, args.epochs, len(loader.dataset), batch, epoch_done)
        if hasattr(loader, "close"):
            loader.close()
        del loader
    print(json.dumps({"epochs": epochs, "first_batch_s": first, "cpu": meter.seconds(),
                      "processes": processes, "local_peak_bytes": peak[0],
                      "classes_per_batch": statistics.mean(classes)}))


def _mds(mnt, out):
    from streaming import MDSWriter

    from stager.catalog import Catalog

    files = Catalog.from_directory(os.path.join(mnt, "imgs"), [".jpg"])
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit=64 << 20) as writer:
        for i in range(len(files)):
            with open(os.path.join(files.root, files.path(i)), "rb") as fh:
                writer.write({"image": fh.read(), "label": int(files.label(i))})


def _lit_item(item):
    path, label = item
    with open(path, "rb") as fh:
        return {"image": fh.read(), "label": label}


def _lit(mnt, out, n):
    import litdata

    from stager.catalog import Catalog

    files = Catalog.from_directory(os.path.join(mnt, "imgs"), [".jpg"])
    inputs = [(os.path.join(files.root, files.path(i)), int(files.label(i))) for i in range(len(files))]
    litdata.optimize(fn=_lit_item, inputs=inputs, output_dir=out, num_workers=n, chunk_bytes="64MB")


def convert(kind, n, mnt, backing):
    """Writes method ``kind``'s shards for N = ``n`` from the mount into the backing tree; the seconds it took."""
    begin = time.perf_counter()
    if kind == "stager-tar":
        done = subprocess.run([sys.executable, "-m", "stager", "pack", os.path.join(mnt, "imgs"),
                               os.path.join(backing, f"tar-{n}"), "--processes", str(n), "--quiet",
                               "--extensions", ".jpg"], capture_output=True, text=True, env=_env())
        if done.returncode:
            sys.exit(f"stager pack failed:\n{done.stderr}")
    elif kind == "streaming":
        _mds(mnt, os.path.join(backing, "mds"))
    else:
        _lit(mnt, os.path.join(backing, f"lit-{n}"), n)
    return time.perf_counter() - begin


def _env(source=None):
    return dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", **(source.env() if source else {}))


def run(method, n, source, work, args):
    """One method in a fresh process, with the source's opens and its servers' CPU and bytes around it."""
    local = tempfile.mkdtemp(prefix=f"local-{method}-", dir=work)
    cpu, read = sum(cpu_of(p) for p in source.pids), source.moved()
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--n", str(n), "--data", source.root,
           "--local", local, "--epochs", str(args.epochs), "--endpoint", getattr(source, "endpoint_url", "")]
    with source.counting() as opens:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=_env(source))
        counted = opens.count() if opens is not None else None
    shutil.rmtree(local, ignore_errors=True)
    if proc.returncode:
        sys.exit(f"{method} N={n} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.splitlines()[-1])
    result["cpu"]["emulator"] = round(sum(cpu_of(p) for p in source.pids) - cpu, 2)
    result["source_bytes"] = source.moved() - read
    result["opens"] = None if counted is None else sum(counted.values())
    return result


def _table(n, results, conversions, args):
    med = {m: [statistics.median(r["epochs"][e] for r in rs) for e in range(args.epochs)] for m, rs in results.items()}
    print(f"\nN = {n}\n")
    print("| method | conversion s | " + " | ".join(f"epoch {e + 1} s" for e in range(args.epochs)) +
          " | total s | with conversion s | first batch s | source opens | source MB | local peak MB | "
          "loading processes | CPU s: rank / loaders / prefetchers / source | classes per batch |")
    print("|---|" + "---:|" * (args.epochs + 9))
    for m, rs in results.items():
        conv = conversions.get(m, 0.0)
        cpu = {k: statistics.median(r["cpu"][k] for r in rs) for k in ("rank", "readers", "prefetchers", "emulator")}
        print(f"| {m} | {conv:.1f} | " + " | ".join(f"{t:.2f}" for t in med[m]) +
              f" | {sum(med[m]):.2f} | {sum(med[m]) + conv:.2f}"
              f" | {statistics.median(r['first_batch_s'] for r in rs):.2f} | {_most(r['opens'] for r in rs)}"
              f" | {max(r['source_bytes'] for r in rs) / 1e6:.0f} | {max(r['local_peak_bytes'] for r in rs) / 1e6:.0f}"
              f" | {max(r['processes'] for r in rs)} | " + " / ".join(f"{cpu[k]:.2f}" for k in cpu) +
              f" | {statistics.median(r['classes_per_batch'] for r in rs):.1f} |")
    mine = next((m for m in ("stager", "stager-mds") if m in results), None)
    for m in results:
        if mine and m != mine:
            ratios = ", ".join(f"{a / b:.2f}x" for a, b in zip(med[m], med[mine]))
            print(f"{m} / {mine}, by epoch: {ratios}; total {sum(med[m]) / sum(med[mine]):.2f}x")


def _most(counts):
    counts = list(counts)
    return "-" if None in counts else max(counts)


@contextlib.contextmanager
def _serving(bucket, backing, mnt, n, args):
    """What the methods read for N = ``n``: the bucket, filled from the backing tree, or a fresh mount of it.

    A fresh mount: the emulator's name cache holds nothing of the conversions.
    """
    from stager.slowfs import SlowFS, mount_entry

    if bucket is not None:
        for prefix in ("imgs", "mds", f"tar-{n}"):
            if os.path.isdir(os.path.join(backing, prefix)):
                bucket.upload(os.path.join(backing, prefix), prefix)
        yield bucket
        return
    with SlowFS(backing, mnt, open_ms=args.open_ms, mbps=0) as mounted:
        yield FileTree(mounted, backing, int(mount_entry(mounted).split(":", 1)[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", default="2,4,8", help="N: every method's num_workers (and conversion's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--source", choices=("fs", "s3"), default="fs",
                        help="fs: the FUSE emulator; s3: an S3 bucket (moto) behind the latency proxy at --open-ms a "
                             "request, where the one-line ImageFolder method cannot go")
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    one_run_arguments(parser)
    args = parser.parse_args()
    if args.one:
        return one(args)

    from stager.job.synth import make_dataset
    from stager.slowfs import SlowFS

    methods = [m for m in args.methods.split(",") if args.source == "fs" or m not in NOT_OVER_S3]
    for m in sorted(set(args.methods.split(",")) - set(methods)):
        print(f"{m}: left out over the bucket ({NOT_OVER_S3[m]})")
    out = {"samples": args.samples, "open_ms": args.open_ms, "epochs": args.epochs, "source": args.source, "rows": {}}
    with tempfile.TemporaryDirectory(prefix="stager-peers-side-") as work, contextlib.ExitStack() as stack:
        bucket = stack.enter_context(ObjectBucket(args.open_ms)) if args.source == "s3" else None
        backing, mnt = os.path.join(work, "src"), os.path.join(work, "mnt")
        os.makedirs(mnt)
        make_dataset(os.path.join(backing, "imgs"), args.samples, nbytes=115000, classes=args.classes, seed=1,
                     progress=False, fmt="jpeg")
        os.remove(os.path.join(backing, "imgs", "manifest.tsv"))  # an ImageFolder: class directories only
        for n in (int(x) for x in args.processes.split(",")):
            conversions = {}
            with SlowFS(backing, mnt, open_ms=args.open_ms, mbps=0):
                for kind in ("stager-tar", "streaming", "litdata"):
                    wanted = kind in methods or (kind == "streaming" and "stager-mds" in methods)
                    if wanted and not (kind == "streaming" and os.path.isdir(os.path.join(backing, "mds"))):
                        conversions[kind] = convert(kind, n, mnt, backing)
            if "streaming" in methods or "stager-mds" in methods:
                conversions.setdefault("streaming", out.get("mds_s", 0.0))
                out["mds_s"] = conversions["streaming"]
                conversions["stager-mds"] = conversions["streaming"]
            results = {m: [] for m in methods}
            with _serving(bucket, backing, mnt, n, args) as source:
                for _ in range(args.rounds):
                    for m in methods:  # alternating: a slow spell of the machine falls on every method
                        results[m].append(run(m, n, source, work, args))
            out["rows"][n] = {"conversions": conversions, "results": results}
            where = "an open" if bucket is None else "a request"
            print(f"{args.samples} JPEGs in {args.classes} classes in the {source.kind} at {args.open_ms:g} ms "
                  f"{where}; torchvision's training transforms, batch {BATCH}; {args.epochs} epochs; medians of "
                  f"{args.rounds} rounds; {os.cpu_count()} cores", flush=True)
            _table(n, results, conversions, args)
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
