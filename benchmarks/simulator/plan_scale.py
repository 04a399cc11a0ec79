"""Cost of the plan and of the catalog at scale: 1.28M, 10^8 and 10^9 samples, 1,024 and 10,000 ranks.

    python benchmarks/simulator/plan_scale.py plan                      # epoch shares, next-use tables, the inverse
    python benchmarks/simulator/plan_scale.py catalog                   # build rate, memory of a mapped 10^8 catalog
    mpiexec -n 4 python benchmarks/simulator/plan_scale.py bcast        # the broadcast of a 1.28M-entry catalog
    torchrun --standalone --nproc_per_node=4 benchmarks/simulator/plan_scale.py bcast   # the same over gloo

``plan`` computes, as a few simulated ranks of a large job would (ranks 0,
size/2 and size-1; never all of them), one rank's share of an epoch with
each shuffle, and a node's (4 ranks') next-use table over the look-ahead
horizon (16 steps) and over the whole epoch; time and peak memory are per
rank (the median of the three ranks, of one rank for ``pcg64`` from 10^8
on; peak memory as tracemalloc sees numpy's allocations, in a second
pass). ``pcg64`` draws the whole
permutation, so it is run up to 10^8 samples only (10^9 would need 8 GB
per rank). ``catalog`` times ``stager catalog build`` on a tree of empty
files (1 and 2 ranks) and maps a synthetic 10^8-entry catalog file, reading
the entries of one rank of 1,024, to show what a node holds. Prints
Markdown tables.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

from stager import plan
from stager.config import PlanConfig

BATCH, NODE, HORIZON = 32, 4, 16
SCALES = [(1_281_167, 1_024), (1_281_167, 10_000), (10**8, 1_024), (10**8, 10_000), (10**9, 1_024), (10**9, 10_000)]
MATERIALISED_MAX = 10**8


def measure(fn, repeats):
    """Median seconds of ``repeats`` calls of ``fn(k)``, then the largest peak of traced memory.

    Times are taken without tracemalloc, which slows every allocation.
    """
    times, peaks = [], []
    for k in range(repeats):
        begin = time.perf_counter()
        fn(k)
        times.append(time.perf_counter() - begin)
    for k in range(repeats):
        tracemalloc.start()
        fn(k)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return statistics.median(times), max(peaks)


def bench_plan():
    print("| samples | ranks | shuffle | steps | one rank's epoch share | node's next-use table, 16 steps "
          "| node's next-use table, whole epoch | inverse of 4,096 indices |")
    print("|---|---|---|---|---|---|---|---|")
    for n, size in SCALES:
        for name in ("pcg64", "feistel"):
            if name == "pcg64" and n > MATERIALISED_MAX:
                print(f"| {n:,} | {size:,} | {name} | | not run: the whole permutation is 8 GB per rank | | | |")
                continue
            cfg = PlanConfig(batch_size=BATCH, epochs=1, seed=0, shuffle_algorithm=name)
            spec = plan.PlanSpec.from_config(n, cfg, size)
            ranks = [0, size // 2, size - 1]
            steps = plan.steps_per_epoch(n, BATCH, False, size)
            repeats = 1 if name == "pcg64" and n >= 10**8 else 3  # seconds a call: one is enough
            share = measure(lambda k: list(plan.iterate(n, cfg, rank=ranks[k], size=size)), repeats)
            nodes = [list(range(r - r % NODE, r - r % NODE + NODE)) for r in ranks]
            near = measure(lambda k: plan.next_uses(spec, nodes[k], plan.Position(), HORIZON), repeats)
            whole = measure(lambda k: plan.next_uses(spec, nodes[k], plan.Position(), steps), repeats)
            picks = np.random.default_rng(0).integers(0, n, 4096)
            inverse = measure(lambda k: plan.read_at(spec, 0, picks), repeats)
            cells = [f"{t * 1000:,.1f} ms, {m / 2**20:,.1f} MiB" for t, m in (share, near, whole, inverse)]
            print(f"| {n:,} | {size:,} | {name} | {steps:,} | " + " | ".join(cells) + " |", flush=True)


def make_tree(root, files, dirs):
    for d in range(dirs):
        os.makedirs(os.path.join(root, f"class{d:04d}"))
    for i in range(files):
        open(os.path.join(root, f"class{i % dirs:04d}", f"{i:08d}.jpg"), "wb").close()


def build_rate(root, out, ranks):
    """entries/s of ``stager catalog build`` on ``ranks`` ranks, as the command reports it (start-up excluded)."""
    cmd = [sys.executable, "-m", "stager", "catalog", "build", root, "-o", out]
    if ranks > 1:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks)] + cmd
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(re.search(r"([\d,]+) entries/s", text).group(1).replace(",", ""))


def write_synthetic_catalog(path, n, chunk=10**7):
    """A catalog file of ``n`` entries ``dNNNN/NNNNNNNNN.jpg``, written in chunks (never all in memory)."""
    from stager.catalog import header

    width = 19  # "d0123/012345678.jpg"
    head, sections, length = header("/lustre/synthetic", n, n * width, True, False, n * 110_000)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(length)
        for at in range(0, n, chunk):
            i = np.arange(at, min(n, at + chunk), dtype=np.int64)
            fh.seek(sections["offsets"] + 8 * at)
            (i * width).astype("<i8").tofile(fh)
            if at + len(i) == n:
                np.array([n * width], "<i8").tofile(fh)
            fh.seek(sections["sizes"] + 8 * at)
            np.full(len(i), 110_000, "<i8").tofile(fh)
            fh.seek(sections["labels"] + 8 * at)
            (i % 1000).astype("<i8").tofile(fh)
            text = np.empty((len(i), width), np.uint8)
            text[:, 0], text[:, 5], text[:, 15:] = ord("d"), ord("/"), np.frombuffer(b".jpg", np.uint8)
            for k, digit in enumerate(range(3, -1, -1)):
                text[:, 1 + k] = 48 + (i % 1000) // 10**digit % 10
            for k, digit in enumerate(range(8, -1, -1)):
                text[:, 6 + k] = 48 + i // 10**digit % 10
            fh.seek(sections["blob"] + width * at)
            text.tofile(fh)
    return length


MAP_PROBE = """
import sys, time
from stager import plan
from stager.catalog import MappedCatalog
from stager.config import PlanConfig

def status():
    fields = dict(line.split(':', 1) for line in open('/proc/self/status'))
    return {k: int(fields[k].split()[0]) / 1024 for k in ('RssAnon', 'RssFile')}

path, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = PlanConfig(batch_size=32, epochs=1, shuffle_algorithm='feistel')
indices = [i for m in plan.iterate(n, cfg, rank=0, size=size) for i in m.indices.tolist()]
before = status()
begin = time.perf_counter()
catalog = MappedCatalog(path)
mapped = time.perf_counter() - begin
begin = time.perf_counter()
total = sum(len(catalog.path(i)) + catalog.sizes[i] + catalog.label(i) for i in indices)
read = time.perf_counter() - begin
after = status()
begin = time.perf_counter()
total = sum(len(catalog.path(i)) + catalog.sizes[i] + catalog.label(i) for i in indices)
again = time.perf_counter() - begin
print(len(indices), mapped, read, again, after['RssAnon'] - before['RssAnon'], after['RssFile'] - before['RssFile'])
"""


def bench_catalog(entries, files, dirs):
    work = tempfile.mkdtemp(prefix="plan-scale-")
    try:
        make_tree(os.path.join(work, "tree"), files, dirs)
        build_rate(os.path.join(work, "tree"), os.path.join(work, "warm.cat"), 1)  # the tree's metadata cached
        rates = [build_rate(os.path.join(work, "tree"), os.path.join(work, f"tree-{r}.cat"), r) for r in (1, 2)]
        print(f"| `stager catalog build`, {files:,} files in {dirs} directories | 1 rank: {rates[0]:,.0f} "
              f"entries/s; 2 ranks (mpiexec): {rates[1]:,.0f} entries/s |")
        path = os.path.join(work, "big.cat")
        begin = time.perf_counter()
        length = write_synthetic_catalog(path, entries)
        print(f"| synthetic catalog file, {entries:,} entries | {length / 1e9:.2f} GB, written in "
              f"{time.perf_counter() - begin:.1f} s |")
        size = 1024
        os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)  # start from a cold cache
        out = subprocess.run([sys.executable, "-c", MAP_PROBE, path, str(entries), str(size)], check=True,
                             capture_output=True, text=True).stdout.split()
        count, mapped, read, again, anon, filed = int(out[0]), *map(float, out[1:])
        print(f"| one rank of {size:,} maps it and reads its {count:,} entries of an epoch (path, size, label) | "
              f"map {mapped * 1000:.1f} ms, read {read:.2f} s cold, {again:.2f} s again; "
              f"private memory +{anon:.1f} MiB, "
              f"mapped pages resident +{filed:.0f} MiB (shared by the node's ranks, reclaimable) |")
        print(f"| the same catalog broadcast | {length / 2**20:,.0f} MiB of private memory on every rank |")
    finally:
        shutil.rmtree(work)


def bench_bcast():
    from stager.catalog import Catalog, broadcast_catalog
    from stager.world import detect

    world = detect()  # mpi4py under mpiexec, torch.distributed under torchrun
    n, comm = 1_281_167, world.comm

    def build():
        paths = [f"train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG" for i in range(n)]
        return Catalog.from_paths("/lustre/imagenet", paths, np.full(n, 110_000), np.arange(n) % 1000)

    comm.Barrier()
    catalog = broadcast_catalog(comm, build)
    comm.Barrier()
    again = time.perf_counter()
    broadcast_catalog(comm, lambda: catalog)
    elapsed = time.perf_counter() - again
    if comm.Get_rank() == 0:
        print(f"catalog broadcast ({world.source}): {n:,} entries ({len(catalog.paths_blob()) / 1e6:.1f} MB of paths) to "
              f"{comm.Get_size()} ranks in {elapsed * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", default="plan", choices=["plan", "catalog", "bcast"])
    parser.add_argument("--bcast", action="store_const", const="bcast", dest="part", help="the same as `bcast`")
    parser.add_argument("--entries", type=int, default=10**8, help="entries of the mapped catalog (catalog)")
    parser.add_argument("--files", type=int, default=20_000, help="files of the tree to build (catalog)")
    parser.add_argument("--dirs", type=int, default=100, help="first-level directories of that tree (catalog)")
    args = parser.parse_args()
    {"plan": bench_plan, "bcast": bench_bcast,
     "catalog": lambda: bench_catalog(args.entries, args.files, args.dirs)}[args.part]()
