"""Where stager's data wait goes when staging from a bucket: the first minibatch, each epoch, the close.

Builds the bucket, proxy and stager configuration of ``s3_stage.py`` and runs
only stager, timing every ``next()`` of the loop and reading the pipeline's
telemetry. Meant to be run several times, alternating engines (``PYTHONPATH``)
or settings, when the machine is too noisy for ``s3_stage.py``'s totals:

    PYTHONPATH=. .venv/bin/python benchmarks/stores/s3_cold_start.py --epochs 1 --share 0.25

Prints one line: the wait of the first minibatch, of each epoch, of the last
``next()`` (the pipeline closing at the end of the plan), and the prefetch tasks'
mean seconds.
"""

import argparse
import os
import tempfile
import time

from s3_stage import add_settings, fill_bucket, stager_config

from stager.engine import Pipeline
from stager.slows3 import ObjectStore, SlowProxy


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_settings(parser)
    parser.add_argument("--readers", type=int, default=2)
    args = parser.parse_args()
    with ObjectStore() as store, tempfile.TemporaryDirectory(prefix="s3-cold-") as local:
        fill_bucket(store, args.samples, args.bytes)
        capacity = None if args.share >= 1 else str(int(args.samples * args.bytes * args.share))
        with SlowProxy(store.port, latency_ms=args.latency_ms) as proxy:
            waits = []
            with Pipeline(stager_config(proxy.endpoint_url, args, capacity, local, args.readers)) as pipe:
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
