"""DELI's setting: training from an object store bucket, the time the training loop waits for data.

Starts moto's S3 server on loopback, fills a bucket, and puts the latency
proxy (``--latency-ms`` per request) in front of it. Then, for ``--epochs``
epochs with ``--compute-ms`` of simulated training per step, measures the
time the loop spends waiting in ``next()`` for:

- PyTorch's ``DataLoader`` with workers that GET each sample with boto3
  (reading the bucket directly),
- the same ``DataLoader`` over AWS's ``s3torchconnector`` ``S3MapDataset``
  (when installed),
- stager staging from the bucket with the node cache at 100% and at
  ``--share`` of the dataset.

    PYTHONPATH=. .venv/bin/python benchmarks/stores/s3_stage.py --json docs/s3.json

Prints a Markdown table for docs/benchmarks.md.
"""

import argparse
import json
import os
import random
import tempfile
import time

import boto3

from stager.config import config_from_dict
from stager.engine import Pipeline
from stager.slows3 import ObjectStore, SlowProxy
from stager.slows3.server import CREDENTIALS

BUCKET = "deli-bench"


class BucketSamples:
    """A map-style dataset whose items are GETs with boto3 (a client per worker process)."""

    def __init__(self, endpoint, keys):
        self.endpoint, self.keys, self.client = endpoint, keys, None

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        if self.client is None:
            self.client = boto3.client("s3", endpoint_url=self.endpoint)
        return self.client.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()


def as_list(batch):
    return batch


def timed_loop(batches, compute_s, steps_per_epoch):
    """Runs the training loop over every epoch's batches.

    Returns:
        ``(seconds waiting in next(), total seconds, samples, [seconds waiting per epoch])``; the last
        ``next()``, which ends the loop, counts in the last epoch.
    """
    wait = samples = steps = 0
    epochs = []
    begin = time.perf_counter()
    it = iter(batches)
    while True:
        t = time.perf_counter()
        batch = next(it, None)
        waited = time.perf_counter() - t
        wait += waited
        epoch = steps // steps_per_epoch if batch is not None else max(len(epochs) - 1, 0)
        while len(epochs) <= epoch:
            epochs.append(0.0)
        epochs[epoch] += waited
        if batch is None:
            return wait, time.perf_counter() - begin, samples, epochs
        samples += len(batch)
        steps += 1
        time.sleep(compute_s)  # the training step


def run_dataloader(dataset, args, seed):
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        collate_fn=as_list, persistent_workers=True,
                        generator=torch.Generator().manual_seed(seed))
    return timed_loop((batch for _ in range(args.epochs) for batch in loader), args.compute_ms / 1000, len(loader))


def stager_config(endpoint, args, capacity, local_dir, readers):
    """stager's job over the bucket behind ``endpoint``: the settings ``add_settings`` parsed."""
    return config_from_dict({
        "dataset": {"source": f"s3://{BUCKET}/train", "loader": "raw", "endpoint_url": endpoint,
                    "requests_in_flight": args.requests},
        "plan": {"batch_size": args.batch_size, "epochs": args.epochs, "seed": 1},
        "staging": {"local_dir": local_dir, "prefetchers": args.prefetchers, "lookahead": args.lookahead,
                    "capacity": capacity},
        "reader": {"workers": readers},
    })


def run_stager(endpoint, args, capacity, local_dir):
    with Pipeline(stager_config(endpoint, args, capacity, local_dir, args.workers - args.prefetchers)) as pipe:
        steps = -(-args.samples // args.batch_size)
        return timed_loop((batch.samples for batch in pipe), args.compute_ms / 1000, steps) + (pipe.stats.files_staged,)


def add_settings(parser):
    """The bucket's, the loop's and stager's settings, shared with ``s3_cold_start.py``."""
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--bytes", type=int, default=64 * 1024)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--compute-ms", type=float, default=200.0)
    parser.add_argument("--latency-ms", type=float, default=40.0)
    parser.add_argument("--prefetchers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16, help="stager's requests in flight per prefetcher")
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.25,
                        help="the bounded cache's capacity, a share of the dataset")


def fill_bucket(store, samples, nbytes):
    """Creates the bucket on ``store`` with ``samples`` random objects of ``nbytes``; returns their keys."""
    os.environ.update(CREDENTIALS)
    rng = random.Random(0)
    s3 = boto3.client("s3", endpoint_url=store.endpoint_url)
    s3.create_bucket(Bucket=BUCKET)
    keys = [f"train/c{i % 10}/s{i:06d}.bin" for i in range(samples)]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key=key, Body=rng.randbytes(nbytes))
    return keys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_settings(parser)
    parser.add_argument("--workers", type=int, default=4, help="processes of every method (stager: prefetchers + readers)")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {"settings": vars(args), "runs": {}}
    with ObjectStore() as store, tempfile.TemporaryDirectory(prefix="s3-bench-") as local:
        keys = fill_bucket(store, args.samples, args.bytes)
        with SlowProxy(store.port, latency_ms=args.latency_ms) as proxy:
            endpoint = proxy.endpoint_url
            runs = results["runs"]
            runs["DataLoader + boto3 (direct)"] = run_dataloader(BucketSamples(endpoint, keys), args, 1)
            print("done:", runs, flush=True)
            try:
                from s3torchconnector import S3ClientConfig, S3MapDataset

                dataset = S3MapDataset.from_prefix(f"s3://{BUCKET}/train/", region=CREDENTIALS["AWS_DEFAULT_REGION"],
                                                   endpoint=endpoint,
                                                   s3client_config=S3ClientConfig(force_path_style=True),
                                                   transform=lambda obj: obj.read())
                runs["DataLoader + s3torchconnector (direct)"] = run_dataloader(dataset, args, 1)
            except ImportError:
                pass
            total = args.samples * args.bytes
            runs["stager, cache 100%"] = run_stager(endpoint, args, None, local)
            print("done:", runs, flush=True)
            runs[f"stager, cache {args.share:.0%}"] = run_stager(endpoint, args, str(int(total * args.share)), local)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    base = results["runs"]["DataLoader + boto3 (direct)"][0]
    print(f"\n{args.samples} objects of {args.bytes // 1024} KiB, {args.epochs} epochs, batch {args.batch_size}, "
          f"{args.compute_ms:g} ms compute per step, {args.latency_ms:g} ms per request, {args.workers} processes each\n")
    print("| method | data wait (s) | wait per epoch (s) | total (s) | samples | less wait than DataLoader + boto3 |")
    print("|---|---|---|---|---|---|")
    for name, (wait, total_s, samples, epochs, *rest) in results["runs"].items():
        per_epoch = " / ".join(f"{w:.2f}" for w in epochs)
        print(f"| {name} | {wait:.2f} | {per_epoch} | {total_s:.2f} | {samples} | {100 * (1 - wait / base):.1f}% |")


if __name__ == "__main__":
    main()
