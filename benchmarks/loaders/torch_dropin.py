"""DataLoader against StagedLoader, the same ImageFolder of JPEGs behind the emulated slow file system.

    .venv/bin/python benchmarks/loaders/torch_dropin.py                      # 1,536 JPEGs, 10 ms an open, N = 2, 4, 8
    .venv/bin/python benchmarks/loaders/torch_dropin.py --samples 512 --processes 2 --json /tmp/dropin.json

An ImageFolder of 256x256 JPEGs (``stager make-dataset --format jpeg``) is
mounted through the FUSE emulator at ``--open-ms`` per open, and read for
``--epochs`` epochs with the usual torchvision training transforms
(RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize), batch
32, shuffled, no compute: the loaders alone. For each N of ``--processes``,
alternating: ``DataLoader(num_workers=N, persistent_workers=True)``, and
``StagedLoader`` with as many processes: one prefetcher keeping
``--in-flight`` files in flight (threads) and N - 1 readers. Each run is a
fresh process; CPU seconds are counted per process kind (the training
process, the readers or DataLoader workers, the prefetchers, the
emulator's daemon).

The bounds: a DataLoader worker opens (``o``) then decodes (``d``, the CPU
per sample, measured here on local copies), so N workers deliver at most
N / (o + d) samples/s, and the cores C at most C / d. StagedLoader's first
epoch is bounded by its prefetcher's opens (in-flight / o) and its readers'
decoding (min(N - 1, C) / d), later epochs by the decoding alone. The
ratio of the two bounds is what a perfect StagedLoader would gain; the
table gives the measured ratio beside it.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

BATCH = 32


def transforms():
    from iterators.pytorch import StagedLoader  # noqa: F401  (torchvision beside a CPU-only torch)
    from torchvision import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


def one(args):
    """One method in this process: epoch times and CPU seconds per kind, as JSON on stdout."""
    import torch
    from torch.utils.data import DataLoader

    from iterators.pytorch import StagedLoader
    from stager.bench.cpu import CpuMeter
    from torchvision.datasets import ImageFolder  # noqa: E402  (after iterators.pytorch)

    torch.manual_seed(0)
    train = ImageFolder(args.data, transform=transforms())
    if args.one == "dataloader":
        loader = DataLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n, persistent_workers=True)
    elif not args.in_flight:  # the one-line change: DataLoader's arguments, stager's defaults
        loader = StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n,
                              config={"staging": {"local_dir": args.local}})
    else:
        loader = StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n - 1,
                              config={"staging": {"local_dir": args.local, "prefetchers": 1},
                                      "dataset": {"requests_in_flight": args.in_flight}})
    epochs = []
    with CpuMeter() as meter:
        for epoch in range(args.epochs):
            begin, samples = time.perf_counter(), 0
            for images, labels in loader:
                samples += len(labels)
            epochs.append(time.perf_counter() - begin)
            assert samples == len(train), (samples, len(train))
        if hasattr(loader, "close"):
            loader.close()
        else:
            del loader  # persistent workers end with their iterator, inside the meter
    print(json.dumps({"epochs": epochs, "cpu": meter.seconds()}))


def timed_epochs(loader, epochs, expected, on_batch=None, on_epoch=None):
    """Times ``epochs`` passes over ``loader``, each of ``expected`` samples.

    ``on_batch(epoch, labels)`` is called for each batch, ``on_epoch(epoch)``
    after each epoch. Returns each epoch's seconds, the first batch's, and
    the most loading processes seen below this one.
    """
    from stager.bench.cpu import descendants

    times, first, processes = [], None, 0
    for epoch in range(epochs):
        begin, samples = time.perf_counter(), 0
        for _, labels in loader:
            if first is None:
                first = time.perf_counter() - begin
            samples += len(labels)
            processes = max(processes, len(descendants(os.getpid())))
            if on_batch:
                on_batch(epoch, labels)
        times.append(time.perf_counter() - begin)
        if on_epoch:
            on_epoch(epoch)
        assert samples == expected, (epoch, samples, expected)
    return times, first, processes


def decode_seconds(data, count=64):
    """CPU seconds per sample of the transforms on local files: decode, crop, flip, to tensor, normalise."""
    tf = transforms()
    from torchvision.datasets import ImageFolder

    train = ImageFolder(data, transform=tf)
    picks = range(0, len(train), max(1, len(train) // count))
    begin = time.process_time()
    for i in picks:
        train[i]
    return (time.process_time() - begin) / len(picks)


@contextlib.contextmanager
def emulated_jpeg_folder(samples, open_ms, prefix, sizes=None, nbytes=115000):
    """An ImageFolder of 256x256 JPEGs (or ``sizes``, in turn) behind the emulator at ``open_ms`` an open, removed
    afterwards.

    Yields:
        ``(work directory, mount point, the emulator daemon's pid, CPU seconds of the transforms a sample)``.
    """
    from stager.job.synth import make_dataset
    from stager.slowfs import SlowFS, mount_entry

    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        data = os.path.join(work, "imgs")
        make_dataset(data, samples, nbytes=nbytes, classes=10, seed=1, progress=False, fmt="jpeg", sizes=sizes)
        os.remove(os.path.join(data, "manifest.tsv"))  # an ImageFolder: class directories only
        d = decode_seconds(data)
        os.mkdir(os.path.join(work, "mnt"))
        with SlowFS(data, os.path.join(work, "mnt"), open_ms=open_ms, mbps=0) as mnt:
            yield work, mnt, int(mount_entry(mnt).split(":", 1)[1]), d


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(method, n, mnt, local, daemon, args, script=__file__):
    """``script --one method`` in a fresh process: its JSON, with the emulator's CPU seconds over it added."""
    before = cpu_of(daemon)
    cmd = [sys.executable, os.path.abspath(script), "--one", method, "--n", str(n), "--data", mnt,
           "--local", local, "--epochs", str(args.epochs)]
    if getattr(args, "in_flight", None) is not None:
        cmd += ["--in-flight", str(args.in_flight)]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode:
        sys.exit(f"{method} N={n} failed:\n{proc.stdout}{proc.stderr}")
    result = json.loads(proc.stdout.splitlines()[-1])
    result["cpu"]["emulator"] = round(cpu_of(daemon) - before, 2)
    return result


def counted_run(cmd, backing, daemon, what):
    """Runs a method's process (``cmd``) and returns its JSON, with the emulator's CPU seconds over the run and the
    opens of the source's files (inotify on ``backing``, the files behind the emulator) added."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from helpers.opens import Opens

    before = cpu_of(daemon)
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    with Opens(backing) as opens:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
        counted = opens.count()
    if proc.returncode:
        sys.exit(f"{what} failed:\n{proc.stdout}{proc.stderr}")
    result = json.loads(proc.stdout.splitlines()[-1])
    result["cpu"]["emulator"] = round(cpu_of(daemon) - before, 2)
    result["opens"] = sum(counted.values())
    result["files_opened"] = len(counted)
    result["bytes_read"] = sum(n * os.path.getsize(os.path.join(backing, rel)) for rel, n in counted.items())
    return result


def jpeg_set_arguments(parser):
    """The JPEG set's options (sizes and bytes) and the saved results' (``--json``, ``--show``)."""
    parser.add_argument("--image-size", help="the JPEGs' sizes, as stager make-dataset takes them (mixed: "
                                             "ImageNet's); default 256x256")
    parser.add_argument("--bytes", type=int, default=115000, help="the (first size's) JPEG bytes")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--show", help="print the tables of a saved --json file instead of measuring")


def one_run_arguments(parser):
    """The arguments a method's own process gets (``--one``: which method), hidden from ``--help``."""
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--local", help=argparse.SUPPRESS)


def bounds(n, samples, o, d, cores, in_flight, epochs):
    dataloader = samples / min(n / (o + d), cores / d)
    readers = min(n - 1, cores)
    staged = [samples / min(in_flight / o, readers / d)] + [samples * d / readers] * (epochs - 1)
    return [dataloader] * epochs, staged


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", default="2,4,8", help="N: DataLoader workers, StagedLoader's processes")
    parser.add_argument("--in-flight", type=int, default=8,
                        help="files StagedLoader's prefetcher keeps in flight; 0: stager's defaults, num_workers=N")
    parser.add_argument("--json", help="write the results here")
    one_run_arguments(parser)
    args = parser.parse_args()
    if args.one:
        return one(args)

    from stager.model.calibrate import available_cores, cores_note

    counts = [int(x) for x in args.processes.split(",")]
    with emulated_jpeg_folder(args.samples, args.open_ms, "stager-dropin-") as (work, mnt, daemon, d):
        free_before = available_cores()
        rows = []
        for n in counts:
            local = os.path.join(work, f"local-{n}")
            os.mkdir(local)
            dl = run("dataloader", n, mnt, local, daemon, args)
            st = run("stager", n, mnt, local, daemon, args)
            # The defaults (--in-flight 0) start at 16 files in flight at least (docs/counts.md).
            dl_bound, st_bound = bounds(n, args.samples, args.open_ms / 1000, d, os.cpu_count(),
                                        args.in_flight or 16, args.epochs)
            rows.append({"n": n, "dataloader": dl, "stager": st, "bound_dataloader": dl_bound,
                         "bound_stager": st_bound})
        free_after = available_cores()
    print(f"{args.samples} JPEGs (256x256) behind the emulator at {args.open_ms:g} ms an open; batch {BATCH}; "
          f"{args.epochs} epochs; transforms {d * 1000:.2f} ms CPU a sample; StagedLoader: 1 prefetcher with "
          f"{args.in_flight} files in flight + N - 1 readers")
    print(cores_note(free_before, free_after))
    print("\n| N | epoch | DataLoader s | StagedLoader s | ratio | bounds' ratio | ratio / bounds' |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        for e, (a, b) in enumerate(zip(row["dataloader"]["epochs"], row["stager"]["epochs"])):
            bound = row["bound_dataloader"][e] / row["bound_stager"][e]
            print(f"| {row['n']} | {e} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {bound:.2f}x | {a / b / bound:.2f} |")
    print("\n| N | method | total s | rank CPU s | readers (workers) CPU s | prefetchers CPU s | emulator CPU s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for row in rows:
        for method in ("dataloader", "stager"):
            cpu, total = row[method]["cpu"], sum(row[method]["epochs"])
            print(f"| {row['n']} | {method} | {total:.2f} | {cpu['rank']:.2f} | {cpu['readers']:.2f} | "
                  f"{cpu['prefetchers']:.2f} | {cpu['emulator']:.2f} |")
    print("\n| N | all epochs: DataLoader s | StagedLoader s | ratio | bounds' ratio | ratio / bounds' |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        a, b = sum(r["dataloader"]["epochs"]), sum(r["stager"]["epochs"])
        bound = sum(r["bound_dataloader"]) / sum(r["bound_stager"])
        print(f"| {r['n']} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {bound:.2f}x | {a / b / bound:.2f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"samples": args.samples, "open_ms": args.open_ms, "decode_s": d, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
