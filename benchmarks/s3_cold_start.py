"""Where stager's data wait goes when staging from a bucket: the first minibatch, each epoch, the close.

Builds the bucket, proxy and stager configuration of ``s3_stage.py`` and runs
only stager, timing every ``next()`` of the loop and reading the pipeline's
telemetry. Meant to be run several times, alternating engines (``PYTHONPATH``)
or settings, when the machine is too noisy for ``s3_stage.py``'s totals:

    PYTHONPATH=. .venv/bin/python benchmarks/s3_cold_start.py --epochs 1 --share 0.25

Prints one line: the wait of the first minibatch, of each epoch, of the last
``next()`` (the pipeline closing at the end of the plan), and the prefetch tasks'
mean seconds.
"""

import argparse
import os
import random
import tempfile
import time

import boto3

from stager.config import config_from_dict
from stager.pipeline import Pipeline
from stager.slows3 import ObjectStore, SlowProxy
from stager.slows3.server import CREDENTIALS

BUCKET = "deli-bench"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--bytes", type=int, default=64 * 1024)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--compute-ms", type=float, default=200.0)
    parser.add_argument("--latency-ms", type=float, default=40.0)
    parser.add_argument("--prefetchers", type=int, default=2)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.25, help="the cache's capacity, a share of the dataset")
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    rng = random.Random(0)
    with ObjectStore() as store, tempfile.TemporaryDirectory(prefix="s3-cold-") as local:
        s3 = boto3.client("s3", endpoint_url=store.endpoint_url)
        s3.create_bucket(Bucket=BUCKET)
        for i in range(args.samples):
            s3.put_object(Bucket=BUCKET, Key=f"train/c{i % 10}/s{i:06d}.bin", Body=rng.randbytes(args.bytes))
        capacity = None if args.share >= 1 else str(int(args.samples * args.bytes * args.share))
        with SlowProxy(store.port, latency_ms=args.latency_ms) as proxy:
            cfg = config_from_dict({
                "dataset": {"source": f"s3://{BUCKET}/train", "loader": "raw", "endpoint_url": proxy.endpoint_url,
                            "requests_in_flight": args.requests},
                "plan": {"batch_size": args.batch_size, "epochs": args.epochs, "seed": 1},
                "staging": {"local_dir": local, "prefetchers": args.prefetchers, "lookahead": args.lookahead,
                            "capacity": capacity},
                "reader": {"workers": args.readers},
            })
            waits = []
            with Pipeline(cfg) as pipe:
                it = iter(pipe)
                while True:
                    t = time.perf_counter()
                    batch = next(it, None)
                    waits.append(time.perf_counter() - t)
                    if batch is None:
                        break
                    time.sleep(args.compute_ms / 1000)
                tasks = [value for _, kind, _, _, value in pipe.stats.telemetry.events() if kind == "task"]
    steps = -(-args.samples // args.batch_size)
    per_epoch = [sum(waits[e * steps:(e + 1) * steps]) for e in range(args.epochs)]
    per_epoch[-1] += waits[-1]
    print(f"wait {sum(waits):.3f} s: first minibatch {waits[0]:.3f}, per epoch "
          + " / ".join(f"{w:.3f}" for w in per_epoch) + f", last next() {waits[-1]:.3f}; "
          f"{len(tasks)} prefetch tasks, mean {sum(tasks) / max(len(tasks), 1):.3f} s; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
