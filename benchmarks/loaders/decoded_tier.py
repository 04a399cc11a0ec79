"""The decoded tier: StagedLoader on the defaults against ``staging.decoded: off`` and DataLoader, the same JPEGs.

    .venv/bin/python benchmarks/loaders/decoded_tier.py                      # 1,536 JPEGs, N = 4, 3 rounds
    .venv/bin/python benchmarks/loaders/decoded_tier.py --processes 2,4,8 --rounds 3 --json docs/decoded.json
    .venv/bin/python benchmarks/loaders/decoded_tier.py --image-size mixed --bytes 110000   # ImageNet's sizes
    .venv/bin/python benchmarks/loaders/decoded_tier.py --show docs/decoded.json    # the tables again

torch_dropin.py's set-up: an ImageFolder of 256x256 JPEGs (115 KB) behind
the emulator at ``--open-ms`` an open, torchvision's training transforms,
batch 32, shuffled, no compute, ``--epochs`` epochs. For each N and round,
alternating, each in a fresh process: ``DataLoader(num_workers=N)``, the
one-line ``StagedLoader(num_workers=N)`` on the defaults (``staging.decoded:
auto``), and the same with ``staging.decoded: off``. The two StagedLoader
runs draw the same order and augmentations (one generator seed); a digest of
each epoch's tensors shows they delivered the same ones. The ratio of
interest is epochs 2+ on the defaults over ``off`` (the median of the
rounds), with CPU seconds per process kind beside it.

Beside the runs, measured in the same process on the same JPEGs (``keeping``):
what keeping a decoded copy costs a reader in epoch 1, one thread, CPU ms a
sample: the loader's decoding (PIL, from bytes in memory), packing the
record (the pixels out of PIL, the record's XXH3 hash over them, and zlib's
CRC-32 beside it, which records used before), writing it to a segment
in the work directory, and reading it back and rebuilding the image (a
later epoch's cost), against the transforms on the whole sample; and what
exporting and rebuilding PIL's own 4-byte RGB layout would cost instead.
"""

import argparse
import io
import json
import os
import statistics
import sys
import time
import zlib

import xxhash

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_dropin import BATCH, emulated_jpeg_folder, jpeg_set_arguments, run, transforms  # noqa: E402

METHODS = ("dataloader", "defaults", "off")


def one(args):
    """One method in this process: each epoch's seconds and tensors' digest, CPU seconds per kind, as JSON."""
    import torch
    from torch.utils.data import DataLoader

    from iterators.pytorch import StagedLoader
    from stager.bench.cpu import CpuMeter
    from torchvision.datasets import ImageFolder

    train = ImageFolder(args.data, transform=transforms())
    generator = torch.Generator().manual_seed(7)
    if args.one == "dataloader":
        loader = DataLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n, persistent_workers=True,
                            generator=generator)
    else:
        staging = {"local_dir": args.local, **({"decoded": "off"} if args.one == "off" else {})}
        loader = StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n, generator=generator,
                              config={"staging": staging})
    epochs, digests, report = [], [], None
    with CpuMeter() as meter:
        for _ in range(args.epochs):
            begin, samples, digest = time.perf_counter(), 0, 0.0
            for images, labels in loader:
                samples += len(labels)
                digest += float(images[:, :, ::16, ::16].double().sum()) + float(labels.sum())
            epochs.append(time.perf_counter() - begin)
            digests.append(digest)
            assert samples == len(train), (samples, len(train))
        if hasattr(loader, "report"):
            report = loader.report().get("decoded")
            loader.close()
        else:
            del loader
    print(json.dumps({"epochs": epochs, "digests": digests, "cpu": meter.seconds(), "decoded": report}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", default="4", help="N: DataLoader workers, StagedLoader's num_workers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--order", default=",".join(METHODS),
                        help=f"the methods' order in each round (default {','.join(METHODS)})")
    jpeg_set_arguments(parser)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--local", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args)

    if args.show:
        with open(args.show) as fh:
            saved = json.load(fh)
        runs = {int(n): r for n, r in saved["runs"].items()}
        args.samples, args.open_ms, args.rounds = saved["samples"], saved["open_ms"], len(next(iter(
            next(iter(runs.values())).values())))
        args.image_size, args.bytes = saved.get("image_size"), saved.get("bytes", 115000)
        args.epochs = len(runs[min(runs)]["off"][0]["epochs"])
        return show(runs, saved["decode_s"], args, saved.get("keeping"))
    counts = [int(x) for x in args.processes.split(",")]
    runs = {n: {m: [] for m in METHODS} for n in counts}
    from stager.job.synth import parse_image_sizes

    sizes = parse_image_sizes(args.image_size) if args.image_size else None
    with emulated_jpeg_folder(args.samples, args.open_ms, "stager-decoded-", sizes, args.bytes) as (work, mnt, daemon,
                                                                                                    d):
        for r in range(args.rounds):
            for n in counts:
                for method in args.order.split(","):
                    local = os.path.join(work, f"local-{n}-{method}-{r}")
                    os.mkdir(local)
                    runs[n][method].append(run(method, n, mnt, local, daemon, args, __file__))
        costs = keeping(os.path.join(work, "imgs"), work)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"samples": args.samples, "open_ms": args.open_ms, "decode_s": d, "image_size": args.image_size,
                       "bytes": args.bytes, "keeping": costs, "runs": runs}, fh, indent=1)
    show(runs, d, args, costs)


def keeping(data, work, files=128, reps=5):
    """CPU ms a sample (one thread, the best of ``reps``) of what keeping a decoded copy costs: ``{part: ms}``."""
    from PIL import Image

    from stager.decoded.records import length, pack, unpack

    paths = sorted(os.path.join(root, f) for root, _, fs in os.walk(data) for f in fs)[:files]
    encoded = []
    for path in paths:
        with open(path, "rb") as fh:
            encoded.append(fh.read())

    def best(fn):
        out = float("inf")
        for _ in range(reps):
            begin = time.thread_time()
            fn()
            out = min(out, time.thread_time() - begin)
        return round(out / len(paths) * 1000, 3)

    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in encoded]
    records = [pack(image) for image in images]
    rgb = [(image, image.tobytes()) for image in images]
    rgbx = [(image, image.tobytes("raw", "RGBX")) for image in images]
    segment = os.path.join(work, "segment")

    def write():
        fd = os.open(segment, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        at = 0
        for record in records:
            at += os.pwritev(fd, record, at)
        os.close(fd)

    def read_back():
        fd = os.open(segment, os.O_RDONLY)
        at = 0
        for record in records:
            buf = bytearray(length(record))
            os.preadv(fd, [buf], at)
            unpack(buf)
            at += len(buf)
        os.close(fd)

    out = {"decode (the loader)": best(lambda: [Image.open(io.BytesIO(b)).convert("RGB") for b in encoded]),
           "pack: pixels out of PIL": best(lambda: [image.tobytes() for image in images]),
           "pack: XXH3-64 (the record's hash)": best(lambda: [xxhash.xxh3_64_intdigest(r[2]) for r in records]),
           "zlib's CRC-32, for comparison": best(lambda: [zlib.crc32(record[2]) for record in records]),
           "pack: whole": best(lambda: [pack(image) for image in images]),
           # PIL keeps RGB as 4 bytes a pixel: what exporting and rebuilding that layout as it is would cost.
           "pixels out of PIL, its 4-byte layout": best(lambda: [image.tobytes("raw", "RGBX") for image in images]),
           "rebuild from the 3-byte pixels": best(lambda: [Image.frombytes("RGB", i.size, b) for i, b in rgb]),
           "rebuild from the 4-byte layout": best(lambda: [Image.frombytes("RGB", i.size, b, "raw", "RGBX")
                                                           for i, b in rgbx]),
           "write to a segment": best(write),
           "read back and rebuild": best(read_back)}
    os.remove(segment)
    return out


def show(runs, d, args, costs=None):
    """The tables, from each N's runs by method (and what keeping a copy costs, where measured)."""
    counts = sorted(runs)
    if costs:
        kept = costs["pack: whole"] + costs["write to a segment"]
        print("What keeping a decoded copy costs a reader (CPU ms a sample, one thread):\n\n| part | ms |\n|---|---:|")
        for part, ms in costs.items():
            print(f"| {part} | {ms:.3f} |")
        print(f"\nepoch 1's keeping (pack and write): {kept:.3f} ms, {kept / (d * 1000):.1%} of the decoding and "
              f"transforms of a sample ({d * 1000:.2f} ms)\n")
    print(f"{args.samples} JPEGs ({args.image_size or '256x256'}, {args.bytes / 1000:g} KB) behind the emulator at "
          f"{args.open_ms:g} ms an open; batch "
          f"{BATCH}; {args.epochs} epochs; transforms {d * 1000:.2f} ms CPU a sample; {args.rounds} rounds, medians")
    print("\n| N | epoch | DataLoader s | StagedLoader, decoded off s | StagedLoader, defaults s | "
          "defaults / off | same tensors |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for n in counts:
        for e in range(args.epochs):
            dl, on, off = (statistics.median(x["epochs"][e] for x in runs[n][m]) if runs[n][m] else float("nan")
                           for m in METHODS)
            same = all(a["digests"][e] == b["digests"][e] for a, b in zip(runs[n]["defaults"], runs[n]["off"]))
            print(f"| {n} | {e + 1} | {dl:.2f} | {off:.2f} | {on:.2f} | {on / off:.2f}x | {'yes' if same else 'NO'} |")
    print("\n| N | epochs 2+: defaults / off, each round | median | CPU s (rank, readers, prefetchers, emulator): "
          "off | defaults |")
    print("|---:|---|---:|---|---|")
    for n in counts:
        ratios = [sum(a["epochs"][1:]) / sum(b["epochs"][1:]) for a, b in zip(runs[n]["defaults"], runs[n]["off"])
                  if len(b["epochs"]) > 1] or [float("nan")]

        def cpu(method):
            if not runs[n][method]:
                return "-"
            c = runs[n][method][-1]["cpu"]
            return f"{c['rank']:.1f}, {c['readers']:.1f}, {c['prefetchers']:.1f}, {c['emulator']:.1f}"
        print(f"| {n} | {', '.join(f'{x:.2f}x' for x in ratios)} | {statistics.median(ratios):.2f}x | {cpu('off')} "
              f"| {cpu('defaults')} |")
    if runs[counts[-1]]["defaults"]:  # ``--order`` may leave the defaults out
        print(f"\nthe defaults' last run: {json.dumps(runs[counts[-1]]['defaults'][-1]['decoded'])}")


if __name__ == "__main__":
    main()
