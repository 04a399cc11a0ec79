"""``staging.peer_swaps`` off and on, side by side: source reads, wall time and stall of the same job.

4 (``--nodes``) emulated nodes of one rank under ``mpiexec`` (``STAGER_NODE_ID``), 1,024
files of 40 KB behind the slow file system emulator (10 ms an open), batch
16, 3 epochs, ``staging.peers: partition``, ``staging.lookahead: auto``, 4
prefetchers and 2 readers a node, 5 ms of compute a step, the ranks agreeing
on their position every step; the nodes together hold 0.5x and 1x the
dataset. Runs alternate off and on, ``--repeats`` times each. Beside wall
time and stall, the CPU seconds of the job's processes by kind: the rank
processes (training loop, node service, peer server and fetch threads), the
prefetchers, the readers and the launcher (sampled from ``/proc`` every 50
ms: a process's last 50 ms are not seen).

    .venv/bin/python benchmarks/cache/swaps_paired.py --repeats 3
    .venv/bin/python benchmarks/cache/swaps_paired.py --repeats 3 --nodes 2
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading

from peers import run_job
from stager.bench.cpu import descendants, readings
from stager.catalog import Catalog
from stager.job.synth import MANIFEST, make_dataset
from stager.slowfs import SlowFS


KINDS = ("ranks", "prefetchers", "readers", "launcher")


class JobCpu:
    """Context manager: CPU seconds of the processes started below this one meanwhile, by kind (``KINDS``).

    Args:
        skip: Processes already running (the emulator): not the job's.
    """

    def __init__(self, skip):
        self.skip, self.last = set(skip), {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            self.last.update(readings(descendants(os.getpid()) - self.skip))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def seconds(self):
        out = dict.fromkeys(KINDS, 0.0)
        for name, cpu in self.last.values():
            kind = ("prefetchers" if name.startswith("stager-prefetch") else "readers" if name.startswith("stager-read")
                    else "launcher" if name in ("mpiexec", "hydra_pmi_proxy") else "ranks")
            out[kind] += cpu
        return {k: round(v, 2) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--aggregates", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--nodes", type=int, default=4)
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stager-swaps-")
    rows = {}
    try:
        data = os.path.join(work, "data")
        make_dataset(data, 1024, 40_000, progress=False)
        total = int(Catalog.from_manifest(data, MANIFEST).sizes.sum())
        os.mkdir(os.path.join(work, "mnt"))
        with SlowFS(data, os.path.join(work, "mnt"), open_ms=10.0) as mnt:
            emulator = descendants(os.getpid())
            for _ in range(opts.repeats):
                for aggregate in opts.aggregates:
                    for swaps in (False, True):
                        body = {"dataset": {"source": mnt, "manifest": MANIFEST},
                                "plan": {"batch_size": 16, "epochs": 3, "seed": 1},
                                "staging": {"local_dir": os.path.join(work, "local"), "prefetchers": 4,
                                            "peers": "partition", "peer_swaps": swaps,
                                            "capacity": int(aggregate * total / opts.nodes)},
                                "reader": {"workers": 2},
                                "run": {"compute_ms": 5.0, "state_file": os.path.join(work, "state.json")}}
                        cfg = os.path.join(work, "job.yaml")
                        with open(cfg, "w") as fh:
                            json.dump(body, fh)
                        with JobCpu(emulator) as cpu:
                            r = run_job(cfg, opts.nodes, [], work)
                        row = (sum(e["files_from_source"] for e in r["cache"]) / 1024, r["wall_s"],
                               r["stall_fraction"], cpu.seconds())
                        rows.setdefault((aggregate, swaps), []).append(row)
                        print(json.dumps({"aggregate": aggregate, "swaps": swaps, "row": row}), file=sys.stderr)
                        shutil.rmtree(os.path.join(work, "local"), ignore_errors=True)
                        if os.path.exists(os.path.join(work, "state.json")):  # a run that ended removes it
                            os.unlink(os.path.join(work, "state.json"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| aggregate | peer_swaps | source reads / dataset | wall s | stall | " +
          " | ".join(f"CPU s, {k}" for k in KINDS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(KINDS))
    for (aggregate, swaps), runs in sorted(rows.items()):
        cells = [" / ".join(f"{r[i]:{f}}" for r in runs) for i, f in ((0, ".3f"), (1, ".2f"), (2, ".1%"))]
        cells += [" / ".join(f"{r[3][k]:.1f}" for r in runs) for k in KINDS]
        print(f"| {aggregate}x | {'on' if swaps else 'off'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
