"""Lightning DDP on an ImageFolder of JPEGs behind the emulated slow file system: DataLoader against StagedLoader.

    .venv/bin/python benchmarks/loaders/lightning_dropin.py                       # 1,536 JPEGs, 10 ms an open, W = 2, 4
    .venv/bin/python benchmarks/loaders/lightning_dropin.py --samples 512 --workers 2 --json /tmp/lightning.json
    .venv/bin/python benchmarks/loaders/lightning_dropin.py --workers 4 --rounds 3   # medians of 3 rounds

The dataset, transforms and emulator of ``benchmarks/loaders/torch_dropin.py``
(256x256 JPEGs, RandomResizedCrop(224) and the rest, ``--open-ms`` an
open), trained by ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``
for ``--epochs`` epochs, batch 32 a rank, a small convolutional model. The
``LightningDataModule`` returns, for each W of ``--workers``, in turn:
``DataLoader(num_workers=W, persistent_workers=True)`` (Lightning injects
its ``DistributedSampler``); the one-line change,
``StagedLoader(num_workers=W)`` with nothing else set (stager's defaults);
and ``StagedLoader(num_workers=max(1, W - 1))`` with one prefetcher for the
node keeping ``--in-flight`` files in flight (0 leaves this one out):
2W loading processes against 2 max(1, W - 1) + 1 (one more at W = 1,
one fewer above). Each run is a fresh process tree; with ``--rounds`` every
method runs once a round, the order turning each round, and the tables
give each epoch's median (min-max over the rounds);
rank 0 times each epoch between Lightning's epoch hooks, each rank reports
its own CPU seconds (the table shows those of training, from Lightning's
``on_train_start``), and the benchmark samples every process of the tree
for the rest (prefetchers by name; the loading workers are the remainder,
their start included). Rank 0 also reads the cores' busy ticks
(``/proc/stat``) at each epoch's hooks: every process's work in that
epoch, staging's and the emulator's included, against the cores x the
epoch's seconds.
"""

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from torch_dropin import BATCH, cpu_of, emulated_jpeg_folder, transforms  # noqa: E402  (this directory)


def one(args):
    """One Lightning run in this process (rank 0; Lightning starts rank 1): writes ``--out`` JSON per rank."""
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    from iterators.pytorch import StagedLoader
    from stager.engine.perf import cpu_ticks

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            train = ImageFolder(args.data, transform=transforms())
            if args.one == "dataloader":
                return DataLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.w, persistent_workers=True)
            if args.one == "defaults":  # the one-line change: DataLoader's arguments, stager's defaults
                return StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.w,
                                    config={"staging": {"local_dir": args.local}})
            return StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=readers(args.w),
                                config={"staging": {"local_dir": args.local, "prefetchers": 1},
                                        "dataset": {"requests_in_flight": args.in_flight}})

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                     nn.Linear(8, 10))
            self.epochs, self.begin, self.busy = [], None, []

        def training_step(self, batch, batch_idx):
            images, labels = batch
            return nn.functional.cross_entropy(self.net(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_start(self):
            self.cpu_at_start = sum(os.times()[:2])

        def on_train_epoch_start(self):
            self.begin, self.ticks = time.perf_counter(), cpu_ticks()

        def on_train_epoch_end(self):
            self.epochs.append(time.perf_counter() - self.begin)
            ticks = cpu_ticks()
            # Every process's work on the machine's cores in the epoch (/proc/stat), staging's included.
            self.busy.append(None if ticks is None or self.ticks is None
                             else (ticks[0] - self.ticks[0]) / os.sysconf("SC_CLK_TCK"))

        def on_train_end(self):
            whole = sum(os.times()[:2])
            with open(f"{args.out}.rank{self.global_rank}", "w") as fh:
                json.dump({"epochs": self.epochs, "busy": self.busy, "cpu": whole,
                           "cpu_training": whole - self.cpu_at_start}, fh)

    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), datamodule=Data())


METHODS = ("dataloader", "defaults", "stager")
NAMES = {"dataloader": "DataLoader", "defaults": "StagedLoader, defaults", "stager": "StagedLoader, fixed"}


def processes(method, w, result):
    """Loading processes of the job: its readers (2 ranks) and the prefetchers seen."""
    per_rank = {"dataloader": w, "defaults": w, "stager": readers(w)}[method]
    return 2 * per_rank + result["prefetcher_processes"]


def readers(w):
    """StagedLoader's readers a rank against DataLoader's ``w`` workers: one fewer, at least one."""
    return max(1, w - 1)


def summary(results):
    """One method's runs: each epoch's and each CPU figure's median; the epochs of every run under ``runs``."""
    one = results[0]
    return {"epochs": [statistics.median(r["epochs"][e] for r in results) for e in range(len(one["epochs"]))],
            "busy": [None if None in (b := [r["busy"][e] for r in results]) else statistics.median(b)
                     for e in range(len(one["busy"]))],
            "prefetcher_processes": max(r["prefetcher_processes"] for r in results),
            "cpu": {k: round(statistics.median(r["cpu"][k] for r in results), 2) for k in one["cpu"]},
            "runs": [r["epochs"] for r in results]}


def spread(row, method, epoch):
    """``median (min-max)`` seconds of one epoch over the rounds; the median alone after one round."""
    seconds = [epochs[epoch] for epochs in row[method]["runs"]]
    median = f"{statistics.median(seconds):.2f}"
    return median if len(seconds) == 1 else f"{median} ({min(seconds):.2f}-{max(seconds):.2f})"


def tree_cpu(root, stop, seen):
    """Samples every process below ``root`` until ``stop``: ``seen[pid] = (name, CPU seconds)``."""
    from stager.bench.cpu import descendants, readings

    while not stop.wait(0.05):
        seen.update(readings(descendants(root) | {root}))


def run(method, w, mnt, local, daemon, args, work):
    out = os.path.join(work, f"{method}-{w}.json")
    before = cpu_of(daemon)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--w", str(w), "--data", mnt, "--local",
           local, "--epochs", str(args.epochs), "--in-flight", str(args.in_flight), "--out", out]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    # Its own session: Lightning starts rank 1 below rank 0, and a run that fails or is interrupted ends whole.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    stop, seen = threading.Event(), {}
    sampler = threading.Thread(target=tree_cpu, args=(proc.pid, stop, seen))
    sampler.start()
    try:
        output, _ = proc.communicate(timeout=3600)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        stop.set()
        sampler.join()
    if proc.returncode:
        sys.exit(f"{method} W={w} failed:\n{output}")
    ranks = [json.load(open(f"{out}.rank{r}")) for r in range(2)]
    rank_cpu = sum(r["cpu"] for r in ranks)  # their whole lives: imports and start-up too
    prefetchers = sum(cpu for name, cpu in seen.values() if name.startswith("stager-prefetch"))
    forked = sum(1 for name, _ in seen.values() if name.startswith("stager-prefetch"))
    rest = sum(cpu for name, cpu in seen.values() if not name.startswith("stager-prefetch"))
    return {"epochs": ranks[0]["epochs"], "busy": ranks[0]["busy"], "prefetcher_processes": forked,
            "cpu": {"ranks": round(sum(r["cpu_training"] for r in ranks), 2), "loading workers": round(max(0.0, rest - rank_cpu), 2),
                    "prefetchers": round(prefetchers, 2), "emulator": round(cpu_of(daemon) - before, 2)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4",
                        help="W: DataLoader workers a rank; StagedLoader max(1, W - 1) readers a rank")
    parser.add_argument("--in-flight", type=int, default=8,
                        help="files the node's prefetcher keeps in flight; 0: stager's defaults with num_workers=W")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every method this many times, in turn; the tables give medians")
    parser.add_argument("--json", help="write the results here")
    for hidden in ("--one", "--data", "--local", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--w", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args)

    from stager.engine.perf import machine
    from stager.model.calibrate import available_cores, cores_note

    counts = [int(x) for x in args.workers.split(",")]
    with emulated_jpeg_folder(args.samples, args.open_ms, "stager-lightning-") as (work, mnt, daemon, d):
        free_before = available_cores()
        methods = METHODS if args.in_flight else METHODS[:2]
        runs = {(w, m): [] for w in counts for m in methods}
        for r in range(args.rounds):
            for w in counts:
                # the order turns each round, so no method always runs first on a cold page cache
                for method in methods[r % len(methods):] + methods[:r % len(methods)]:
                    local = os.path.join(work, f"local-{method}-{w}-{r}")
                    os.mkdir(local)
                    runs[w, method].append(run(method, w, mnt, local, daemon, args, work))
        free_after = available_cores()
        rows = [dict({"w": w}, **{m: summary(runs[w, m]) for m in methods}) for w in counts]
    print(f"Lightning ddp, 2 CPU ranks; {args.samples} JPEGs (256x256) behind the emulator at {args.open_ms:g} ms "
          f"an open; batch {BATCH} a rank; {args.epochs} epochs; transforms {d * 1000:.2f} ms CPU a sample; "
          f"defaults: StagedLoader(num_workers=W), nothing else set; fixed: 1 prefetcher for the node with "
          f"{args.in_flight} files in flight + max(1, W - 1) readers a rank")
    print(cores_note(free_before, free_after))
    print("\n| W | epoch | DataLoader s | defaults s | fixed s | defaults / DataLoader | defaults / fixed |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        fixed = row.get("stager", {"epochs": [None] * len(row["defaults"]["epochs"])})["epochs"]
        for e, (a, b, c) in enumerate(zip(row["dataloader"]["epochs"], row["defaults"]["epochs"], fixed)):
            # speed ratios of the medians: above 1 the defaults were faster
            vs_fixed = "-" if c is None else f"{c / b:.2f}x"
            print(f"| {row['w']} | {e} | {spread(row, 'dataloader', e)} | {spread(row, 'defaults', e)} | "
                  f"{'-' if c is None else spread(row, 'stager', e)} | {a / b:.2f}x | {vs_fixed} |")
    print("\n| W | method | loading processes | all epochs s | ranks CPU s | loading workers CPU s | "
          "prefetchers CPU s | emulator CPU s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        for method in (m for m in METHODS if m in row):
            cpu = row[method]["cpu"]
            print(f"| {row['w']} | {NAMES[method]} | {processes(method, row['w'], row[method])} | "
                  f"{sum(row[method]['epochs']):.2f} | {cpu['ranks']:.2f} | {cpu['loading workers']:.2f} | "
                  f"{cpu['prefetchers']:.2f} | {cpu['emulator']:.2f} |")
    cores = machine()[0]
    print(f"\n| W | method | cores busy s in each epoch, every process (share of {cores} cores x the epoch) |")
    print("|---:|---|---|")
    for row in rows:
        for method in (m for m in METHODS if m in row):
            cells = [f"{b:.1f} ({b / (w * cores):.0%})" if b is not None else "-"
                     for b, w in zip(row[method]["busy"], row[method]["epochs"])]
            print(f"| {row['w']} | {NAMES[method]} | {' / '.join(cells)} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"samples": args.samples, "open_ms": args.open_ms, "decode_s": d, "rounds": args.rounds,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
