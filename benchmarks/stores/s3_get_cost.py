"""What one GET costs each process of the object-store benchmark: the client, moto's server, the proxy.

Fills a bucket as ``s3_stage.py`` does, then GETs every object with boto3,
straight to moto and through the latency proxy, from 1 and from 16 threads,
and prints per GET: the wall time, and the CPU seconds of this (client)
process, of the server process and of the proxy process (from /proc).

    PYTHONPATH=. .venv/bin/python benchmarks/stores/s3_get_cost.py
"""

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config

from s3_stage import BUCKET, fill_bucket
from stager.slows3 import ObjectStore, SlowProxy


def cpu_seconds(pid):
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=160)
    parser.add_argument("--bytes", type=int, default=64 * 1024)
    parser.add_argument("--latency-ms", type=float, default=40.0)
    args = parser.parse_args()
    with ObjectStore() as store:
        keys = fill_bucket(store, args.objects, args.bytes)
        with SlowProxy(store.port, latency_ms=args.latency_ms) as proxy:
            print("| path | threads | wall ms a GET | client CPU ms | server CPU ms | proxy CPU ms |")
            print("|---|---:|---:|---:|---:|---:|")
            for name, url in (("straight to moto", store.endpoint_url), ("through the proxy", proxy.endpoint_url)):
                for threads in (1, 16):
                    client = boto3.client("s3", endpoint_url=url, config=Config(max_pool_connections=threads))
                    client.get_object(Bucket=BUCKET, Key=keys[0])["Body"].read()  # connect, load the model
                    server0, proxy0 = cpu_seconds(store.proc.pid), cpu_seconds(proxy.proc.pid)
                    client0, begin = time.process_time(), time.perf_counter()
                    with ThreadPoolExecutor(threads) as pool:
                        list(pool.map(lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"].read(), keys))
                    wall = time.perf_counter() - begin
                    n = len(keys) / 1000
                    print(f"| {name} | {threads} | {wall / n:.1f} | {(time.process_time() - client0) / n:.2f} | "
                          f"{(cpu_seconds(store.proc.pid) - server0) / n:.2f} | "
                          f"{(cpu_seconds(proxy.proc.pid) - proxy0) / n:.2f} |")


if __name__ == "__main__":
    main()
