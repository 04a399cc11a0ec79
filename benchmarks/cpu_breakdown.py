"""Where the CPU goes in one stager run: emulator, prefetchers, readers, rank.

Runs one throughput epoch of ``stager bench``'s workload (one setting) and
samples ``/proc`` for the CPU time (user and system) of every process it
starts, grouped by kind: the emulator's daemon, ``stager-prefetch``,
``stager-read`` and this process (the rank: coordinator, service and loop).
On a 2-core machine the sum, not any one stage, is what bounds the run;
this is how the costs fixed in issue 6 were found (docs/benchmarks.md).

    .venv/bin/python benchmarks/cpu_breakdown.py --prefetchers 16 --readers 2
    .venv/bin/python benchmarks/cpu_breakdown.py --engine python --local-dir /tmp
"""

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stager.bench import methods as m  # noqa: E402
from stager.bench.sweep import default_local_dir  # noqa: E402
from stager.catalog import Catalog  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid):
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return name, int(fields[1]), int(fields[11]) / TICK, int(fields[12]) / TICK  # ppid, utime, stime


def _children(pid):
    kids = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.update(int(p) for p in fh.read().split())
    except OSError:
        pass
    return kids


def _descendants(root):
    found, todo = set(), [root]
    while todo:
        kids = _children(todo.pop()) - found
        found |= kids
        todo += kids
    return found


class Sampler:
    """Keeps the last CPU reading of every descendant until stopped."""

    def __init__(self, interval_s=0.02):
        self.readings = {}
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = os.getpid()
        while not self._stop.wait(self.interval_s):
            for pid in _descendants(me):
                try:
                    self.readings[pid] = _stat(pid)
                except (OSError, IndexError):
                    pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefetchers", type=int, default=12)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--open-ms", type=float, default=10.0)
    ap.add_argument("--mbps", type=float, default=500.0)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--local-dir", help="node-local storage (default as stager bench)")
    ap.add_argument("--files-per-task", type=int, default=0)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-cpu-")
    try:
        data = os.path.join(work, "data")
        make_dataset(data, args.batches * 32, 110_000, classes=10, seed=0, progress=False)
        local = tempfile.mkdtemp(prefix="stager-cpu-local-", dir=args.local_dir or default_local_dir(work, 2 * args.batches * 32 * 110_000))
        try:
            with SlowFS(data, open_ms=args.open_ms, mbps=args.mbps, engine=args.engine) as mnt:
                catalog = Catalog.from_manifest(mnt, MANIFEST)
                w = m.Workload(catalog, mnt, local, 32, epochs=1, compute_s=0.0)
                baseline = {pid: _stat(pid) for pid in _descendants(os.getpid())}  # the emulator so far
                before = os.times()
                with Sampler() as sampler:
                    result = m.stager(w, args.prefetchers, args.readers, files_per_task=args.files_per_task)
                after = os.times()
        finally:
            shutil.rmtree(local, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kinds = collections.defaultdict(lambda: [0.0, 0.0])
    for pid, (name, _, user, system) in sampler.readings.items():
        if pid in baseline:
            user, system = user - baseline[pid][2], system - baseline[pid][3]
        kind = "emulator" if name.startswith(("slowfsd", "python")) else name.rstrip("0123456789-")
        kinds[kind][0] += user
        kinds[kind][1] += system
    kinds["rank (this process)"] = [after.user - before.user, after.system - before.system]
    print(f"{args.prefetchers} prefetchers, {args.readers} readers, {args.engine} engine: "
          f"{result.wall_s:.2f} s wall, {result.samples} samples")
    print(f"{'process kind':24s} {'user s':>7s} {'system s':>9s}")
    for kind, (user, system) in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        print(f"{kind:24s} {user:7.2f} {system:9.2f}")
    total = sum(sum(v) for v in kinds.values())
    print(f"{'all':24s} {total:17.2f}  ({total / result.wall_s:.2f} cores busy on average)")


if __name__ == "__main__":
    main()
