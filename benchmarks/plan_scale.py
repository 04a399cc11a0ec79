"""Cost of the plan and of the catalog broadcast at ImageNet scale.

    python benchmarks/plan_scale.py                      # plan: one rank of 1,024
    mpiexec -n 4 python benchmarks/plan_scale.py --bcast # catalog broadcast, MPI
    torchrun --standalone --nproc_per_node=4 benchmarks/plan_scale.py --bcast   # the same over gloo

The plan part computes, as one of 1,024 ranks would, its share of an epoch of
a 1.28M-sample catalog, and reports time and peak memory. The broadcast part
sends a 1.28M-entry catalog (ImageNet-like paths) from rank 0 to all ranks.
"""

import argparse
import time
import tracemalloc

import numpy as np

from stager import plan
from stager.catalog import Catalog, broadcast_catalog

N, SIZE, BATCH = 1_281_167, 1024, 32


def bench_plan(repeats=5):
    times = []
    for rank in range(repeats):
        tracemalloc.start()
        begin = time.perf_counter()
        batches = plan.epoch_minibatches(N, BATCH, seed=0, epoch=rank, rank=rank * 200, size=SIZE)
        times.append(time.perf_counter() - begin)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    print(f"plan: {N:,} samples, {SIZE} ranks, batch {BATCH}: {len(batches)} steps per rank per epoch; "
          f"{np.median(times) * 1000:.1f} ms per rank per epoch (median of {repeats}), "
          f"peak {peak / 2**20:.1f} MiB")


def bench_bcast():
    from stager.world import detect

    world = detect()  # mpi4py under mpiexec, torch.distributed under torchrun
    comm = world.comm

    def build():
        paths = [f"train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG" for i in range(N)]
        return Catalog.from_paths("/lustre/imagenet", paths, np.full(N, 110_000), np.arange(N) % 1000)

    comm.Barrier()
    begin = time.perf_counter()
    catalog = broadcast_catalog(comm, build)
    built = time.perf_counter()
    comm.Barrier()
    again = time.perf_counter()
    broadcast_catalog(comm, lambda: catalog)
    elapsed = time.perf_counter() - again
    if comm.Get_rank() == 0:
        print(f"catalog broadcast ({world.source}): {N:,} entries ({len(catalog.paths_blob()) / 1e6:.1f} MB of "
              f"paths) to {comm.Get_size()} ranks in {elapsed * 1000:.0f} ms (first call, building it included: "
              f"{(built - begin):.2f} s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bcast", action="store_true",
                        help="measure the catalog broadcast (under mpiexec or torchrun)")
    args = parser.parse_args()
    bench_bcast() if args.bcast else bench_plan()
