"""DALI's own file reader against iterators.dali's reader, the same DALI pipeline after each (CoorDL's comparison).

    .venv/bin/python benchmarks/loaders/dali_side.py                        # 2,048 JPEGs, 10 and 20 ms, 2 and 4 threads
    .venv/bin/python benchmarks/loaders/dali_side.py --samples 1536 --open-ms 10 --threads 2
    .venv/bin/python benchmarks/loaders/dali_side.py --image-size mixed --bytes 110000   # ImageNet's sizes
    .venv/bin/python benchmarks/loaders/dali_side.py --show docs/dali.json            # the tables again

Needs the ``dali`` extra (the test set-up installs it). An ImageFolder of
JPEGs (torch_dropin.py's: 256x256, 115 KB; or ImageNet's sizes) is mounted
through the FUSE emulator at ``--open-ms`` an open, and read for
``--epochs`` epochs by a DALI CPU pipeline (``device_id=None``): the reader,
then ``fn.decoders.image_random_crop``, ``fn.resize`` to 224x224 and
``fn.crop_mirror_normalize`` with a random mirror, batch 32, shuffled, no
compute. The reader is ``fn.readers.file(file_root=..., random_shuffle=True)``
or, the one line changed, ``iterators.dali.reader`` with the same arguments
on stager's defaults. For each open latency and DALI thread count, each in
a fresh process: each epoch's seconds, the source's opens (inotify on the
files behind the emulator) and the bytes they read, CPU seconds per process
kind (the training process with DALI's threads, stager's readers and
prefetchers, the emulator).
"""

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from torch_dropin import counted_run, emulated_jpeg_folder, jpeg_set_arguments  # noqa: E402  (the drop-in benchmark's)

BATCH = 32
METHODS = ("dali", "stager")


def training_pipeline(own_reader, data, local, batch, threads, decoder="cpu"):
    """The ImageNet training pipeline over DALI's ``fn.readers.file`` (``own_reader``) or ``iterators.dali.reader``:
    random-crop decode on ``decoder`` (``cpu``, or ``mixed``: the GPU), resize to 224x224, normalise, mirror."""
    from nvidia.dali import fn, pipeline_def, types

    from iterators.dali import reader

    on_gpu = decoder == "mixed"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if on_gpu else None, seed=1)
    def train():
        if own_reader:
            jpegs, labels = fn.readers.file(file_root=data, random_shuffle=True, name="Reader")
        else:
            jpegs, labels = reader(file_root=data, random_shuffle=True, name="Reader",
                                   config={"staging": {"local_dir": local}})
        images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                          std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
                                          mirror=fn.random.coin_flip())
        return images, labels.gpu() if on_gpu else labels

    return train()


def one(args):
    """One reader in this process: each epoch's seconds and samples, CPU seconds per kind, as JSON."""
    from iterators.dali import readers
    from stager.bench.cpu import CpuMeter

    epochs, counts = [], []
    with CpuMeter() as meter:
        pipe = training_pipeline(args.one == "dali", args.data, args.local, BATCH, args.threads)
        pipe.build()
        size = pipe.reader_meta("Reader")["epoch_size"] if args.one == "dali" else None
        for _ in range(args.epochs):
            begin, samples = time.perf_counter(), 0
            if size is not None:  # DALI's reader wraps around: an epoch is its epoch_size samples
                for _ in range(-(-size // BATCH)):
                    samples += len(pipe.run()[1])
                samples = min(samples, size)
            else:
                try:
                    while True:
                        samples += len(pipe.run()[1])
                except StopIteration:
                    pipe.reset()
            epochs.append(time.perf_counter() - begin)
            counts.append(samples)
        for source in readers(pipe):
            source.close()
        del pipe
    print(json.dumps({"epochs": epochs, "samples": counts, "cpu": meter.seconds()}))


def run(method, threads, mnt, backing, work, daemon, args):
    """``--one method`` in a fresh process, with the emulator's CPU and the source's opens over it."""
    local = os.path.join(work, f"local-{method}-{threads}-{args.open_ms:g}")
    os.mkdir(local)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--threads", str(threads), "--data", mnt,
           "--local", local, "--epochs", str(args.epochs)]
    return counted_run(cmd, backing, daemon, f"{method} threads={threads}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--open-ms", default="10,20", help="the emulator's latency an open, ms (a list)")
    parser.add_argument("--threads", default="2,4", help="DALI's num_threads (a list)")
    parser.add_argument("--epochs", type=int, default=3)
    jpeg_set_arguments(parser)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--local", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.threads = int(args.threads)
        return one(args)
    if args.show:
        with open(args.show) as fh:
            return show(json.load(fh))

    from stager.job.synth import parse_image_sizes

    sizes = parse_image_sizes(args.image_size) if args.image_size else None
    rows = []
    for open_ms in [float(x) for x in args.open_ms.split(",")]:
        args.open_ms = open_ms
        with emulated_jpeg_folder(args.samples, open_ms, "stager-dali-", sizes, args.bytes) as (work, mnt, daemon,
                                                                                                _):
            backing = os.path.join(work, "imgs")
            for threads in [int(x) for x in args.threads.split(",")]:
                rows.append({"open_ms": open_ms, "threads": threads,
                             **{m: run(m, threads, mnt, backing, work, daemon, args) for m in METHODS}})
    saved = {"samples": args.samples, "image_size": args.image_size, "bytes": args.bytes, "rows": rows}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(saved, fh, indent=1)
    show(saved)


def show(saved):
    """The tables, from the saved rows."""
    rows = saved["rows"]
    print(f"{saved['samples']} JPEGs ({saved['image_size'] or '256x256'}, {saved['bytes'] / 1000:g} KB) behind the "
          f"emulator; DALI CPU pipeline (random crop decode, resize 224, normalize, mirror), batch {BATCH}, "
          f"shuffled; each reader in a fresh process")
    print("\n| open ms | DALI threads | epoch | fn.readers.file s | stager reader s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for e, (a, b) in enumerate(zip(r["dali"]["epochs"], r["stager"]["epochs"])):
            print(f"| {r['open_ms']:g} | {r['threads']} | {e + 1} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    print("\n| open ms | DALI threads | reader | samples an epoch | source opens (files) | source MB read | "
          "CPU s: training process (DALI's threads), readers, prefetchers, emulator |")
    print("|---:|---:|---|---|---:|---:|---|")
    for r in rows:
        for m in METHODS:
            x, c = r[m], r[m]["cpu"]
            print(f"| {r['open_ms']:g} | {r['threads']} | {m} | {', '.join(map(str, x['samples']))} | "
                  f"{x['opens']} ({x['files_opened']}) | {x['bytes_read'] / 1e6:.1f} | {c['rank']:.1f}, "
                  f"{c['readers']:.1f}, {c['prefetchers']:.1f}, {c['emulator']:.1f} |")
    later = [r["dali"]["epochs"][e] / r["stager"]["epochs"][e]
             for r in rows for e in range(1, len(r["dali"]["epochs"]))]
    first = [r["dali"]["epochs"][0] / r["stager"]["epochs"][0] for r in rows]
    print(f"\nepoch 1: {min(first):.2f}-{max(first):.2f}x (median {statistics.median(first):.2f}x); later epochs: "
          f"{min(later):.2f}-{max(later):.2f}x (median {statistics.median(later):.2f}x)" if later else "")


if __name__ == "__main__":
    main()
