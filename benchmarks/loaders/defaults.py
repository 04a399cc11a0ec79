"""The one-line change with nothing set, against the best fixed counts and DataLoader (issue 56's case).

    .venv/bin/python benchmarks/loaders/defaults.py                          # 768 JPEGs, 20 ms an open, N = 2
    .venv/bin/python benchmarks/loaders/defaults.py --open-ms 10 --processes 4 --rounds 3 --json /tmp/defaults.json
    .venv/bin/python benchmarks/loaders/defaults.py --frontend chainer --samples 3200 --open-ms 10 --processes 2,4,8

An ImageFolder of 256x256 JPEGs behind the FUSE emulator at ``--open-ms``
an open, ``Resize(64)`` and ``ToTensor``, batch 32, shuffled, no compute,
``--epochs`` epochs. For each N of ``--processes``, each round runs, each
in a fresh process and in turn: ``DataLoader(num_workers=N)``, the
one-line ``StagedLoader(..., num_workers=N)`` with nothing else set but
its local directory (the defaults), and the same with
``staging.prefetchers`` fixed at each of ``--fixed`` (one file in flight
each: the hand-tuned settings of the issue). Each run's local directory
is new, so every first epoch fetches everything. Printed: each epoch's
median seconds, the defaults' ratio to the best fixed count and to
DataLoader, the opens of the source's files over the run (inotify,
probe included), the loading processes seen, CPU seconds per process kind,
and the counts the defaults chose (``counts_timeline``) with their reasons.

``--decoded-off`` adds a row: the defaults with ``staging.decoded: off``
(the decoded tier's gain, issue 76).

``--frontend chainer`` runs the same rows in Chainer, as in Serizawa's
set-up: ``LabeledImageDataset`` over the JPEGs (each decoded to a float32
channel-first array, no resize), ``MultiprocessIterator(n_processes=N)``
in place of DataLoader, and the one-line ``StagingIterator`` with
``n_processes=N``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from torch_dropin import counted_run, emulated_jpeg_folder, one_run_arguments, timed_epochs  # noqa: E402  (the drop-in benchmark's)

BATCH = 32


def torch_loader(args, config):
    """``(loader, samples)``: DataLoader or the one-line StagedLoader over the ImageFolder."""
    import torch
    from torch.utils.data import DataLoader

    from iterators.pytorch import StagedLoader
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder  # noqa: E402  (after iterators.pytorch)

    torch.manual_seed(0)
    train = ImageFolder(args.data, transform=T.Compose([T.Resize(64), T.ToTensor()]))
    if args.one == "dataloader":
        return DataLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n, persistent_workers=True), \
            len(train)
    return StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n, config=config), len(train)


class ChainerEpochs:
    """A repeating Chainer iterator seen as one iterable per epoch of ``(examples, labels)`` batches."""

    def __init__(self, iterator):
        self.iterator = iterator

    def __iter__(self):
        while True:
            batch = next(self.iterator)
            yield [x for x, _ in batch], [y for _, y in batch]
            if self.iterator.is_new_epoch:
                return


def chainer_loader(args, config):
    """``(loader, samples)``: MultiprocessIterator or the one-line StagingIterator over LabeledImageDataset."""
    from iterators.chainer import StagingIterator
    import chainer  # noqa: E402  (after iterators.chainer, which prepares Chainer's import)

    classes = sorted(os.listdir(args.data))
    pairs = [(os.path.join(c, name), label) for label, c in enumerate(classes)
             for name in sorted(os.listdir(os.path.join(args.data, c)))]
    train = chainer.datasets.LabeledImageDataset(pairs, root=args.data)
    if args.one == "dataloader":
        it = chainer.iterators.MultiprocessIterator(train, BATCH, shuffle=True, n_processes=args.n)
    else:
        it = StagingIterator(train, BATCH, shuffle=True, n_processes=args.n, config=config)
    return ChainerEpochs(it), len(train)


def one(args):
    """One method in this process: epoch times, CPU per kind, loading processes, counts, as JSON."""
    from stager.bench.cpu import CpuMeter

    config = {"staging": {"local_dir": args.local}}
    if args.one == "decoded-off":  # the defaults but for the decoded tier
        config["staging"]["decoded"] = "off"
    if args.one.startswith("fixed-"):  # fixed-P: P prefetchers, one file each; fixed-PxT: T files each
        processes, _, threads = args.one.split("-", 1)[1].partition("x")
        config["staging"]["prefetchers"] = int(processes)
        config["dataset"] = {"requests_in_flight": int(threads or 1)}
    loader, samples = (chainer_loader if args.frontend == "chainer" else torch_loader)(args, config)
    with CpuMeter() as meter:
        epochs, first, processes = timed_epochs(loader, args.epochs, samples)
        if isinstance(loader, ChainerEpochs):
            loader = loader.iterator
        timeline = loader.report().get("counts_timeline", []) if hasattr(loader, "report") else []
        if hasattr(loader, "close"):
            loader.close()
        elif hasattr(loader, "finalize"):  # Chainer's iterators
            loader.finalize()
        else:
            del loader
    print(json.dumps({"epochs": epochs, "first_batch_s": first, "cpu": meter.seconds(), "processes": processes,
                      "timeline": timeline}))


def run(method, n, mnt, backing, work, daemon, args):
    """One method in a fresh process; adds the emulator's CPU and the source's opens in the first epoch."""
    local = tempfile.mkdtemp(prefix=f"local-{method}-", dir=work)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--n", str(n), "--data", mnt,
           "--local", local, "--epochs", str(args.epochs), "--frontend", args.frontend]
    return counted_run(cmd, backing, daemon, f"{method} N={n}")


def median_epochs(results):
    return [statistics.median(r["epochs"][e] for r in results) for e in range(len(results[0]["epochs"]))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=768)
    parser.add_argument("--open-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--processes", default="2", help="N: num_workers of every method")
    parser.add_argument("--fixed", default="8,16,32",
                        help="the fixed rows: P (staging.prefetchers, one file in flight each) or PxT (T each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frontend", choices=("torch", "chainer"), default="torch",
                        help="torch: ImageFolder, DataLoader, StagedLoader; chainer: LabeledImageDataset, "
                             "MultiprocessIterator, StagingIterator")
    parser.add_argument("--decoded-off", action="store_true",
                        help="add a row: the defaults with staging.decoded off (the decoded tier's gain)")
    parser.add_argument("--json", help="write the results here")
    one_run_arguments(parser)
    args = parser.parse_args()
    if args.one:
        return one(args)
    methods = ["dataloader", "defaults"] + (["decoded-off"] if args.decoded_off else []) + \
        [f"fixed-{p}" for p in args.fixed.split(",") if p]
    out = {"samples": args.samples, "open_ms": args.open_ms, "epochs": args.epochs, "frontend": args.frontend,
           "rows": {}}
    with emulated_jpeg_folder(args.samples, args.open_ms, "stager-defaults-") as (work, mnt, daemon, _):
        backing = os.path.join(work, "imgs")
        for n in (int(x) for x in args.processes.split(",")):
            results = {m: [] for m in methods}
            for _ in range(args.rounds):
                for method in methods:  # alternating: a slow spell of the machine falls on every method
                    results[method].append(run(method, n, mnt, backing, work, daemon, args))
            out["rows"][n] = results
    baseline = "MultiprocessIterator" if args.frontend == "chainer" else "DataLoader"
    decoding = "LabeledImageDataset (float32 CHW)" if args.frontend == "chainer" else "Resize(64)"
    print(f"{args.samples} JPEGs behind the emulator at {args.open_ms:g} ms an open; {decoding}, batch {BATCH}; "
          f"{args.epochs} epochs; medians of {args.rounds} rounds; {os.cpu_count()} cores")
    for n, results in out["rows"].items():
        med = {m: median_epochs(r) for m, r in results.items()}
        fixed = [m for m in methods if m.startswith("fixed-")]
        print(f"\nN = {n}\n\n| method | " + " | ".join(f"epoch {e + 1} s" for e in range(args.epochs)) +
              " | first batch s | source opens (files) | loading processes | rank / readers / prefetchers / "
              "emulator CPU s |")
        print("|---|" + "---:|" * (args.epochs + 4))
        for m in methods:
            r = results[m]
            cpu = {k: statistics.median(x["cpu"][k] for x in r) for k in ("rank", "readers", "prefetchers", "emulator")}
            print(f"| {baseline if m == 'dataloader' else m} | " + " | ".join(f"{t:.2f}" for t in med[m]) +
                  f" | {statistics.median(x['first_batch_s'] for x in r):.2f}"
                  f" | {max(x['opens'] for x in r)} ({min(x['files_opened'] for x in r)})"
                  f" | {max(x['processes'] for x in r)} | " + " / ".join(f"{cpu[k]:.2f}" for k in cpu) + " |")
        for e in range(args.epochs):
            best = min(med[m][e] for m in fixed) if fixed else None
            line = f"epoch {e + 1}: defaults / {baseline} {med['defaults'][e] / med['dataloader'][e]:.2f}x"
            if best:
                line += f", defaults / best fixed {med['defaults'][e] / best:.2f}x"
            if "decoded-off" in med:
                line += f", defaults / decoded-off {med['defaults'][e] / med['decoded-off'][e]:.2f}x"
            print(line)
        last = results["defaults"][-1]["timeline"]
        print("\nthe defaults' counts (last round): " + "; ".join(
            f"{c['t']:.2f} s: {c['prefetchers']} x {c['in_flight']} in flight, {c['readers']} readers"
            + (f" ({c['why']})" if c.get("why") else "") for c in last))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
