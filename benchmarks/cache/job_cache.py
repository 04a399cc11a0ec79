"""The nodes' caches as one: source reads against the job-wide optimum, real runs and simulated scale.

Real runs: ``stager run`` under ``mpiexec`` as 2 and 4 emulated nodes of one
rank each (``STAGER_NODE_ID``) on the slow file system emulator, 3 epochs,
``staging.peers: partition``, the ranks agreeing on their position every
step (``run.state_file``, as training's all-reduce keeps them in step), at
per-node capacities that together hold 0.1x to 2x the dataset. Each runs
with ``staging.lookahead: auto`` and with the former default of 16 (refused
where its window does not fit). Beside each: the simulator's replay of the
same job (``stager.simulate``) and the job-wide optimum for the same
capacities and look-ahead (``simulate.optimum``).

Then ``stager simulate``'s model at 1,024 nodes x 4 ranks (``--files``
files of 110 KB, batch 8, 8 nodes replayed file by file), the same capacities.

    .venv/bin/python benchmarks/cache/job_cache.py --json docs/job-cache.json
    .venv/bin/python benchmarks/cache/job_cache.py --nodes 4 --aggregates 0.5 1.0 --depths auto --no-scale
    .venv/bin/python benchmarks/cache/job_cache.py --no-real --scale-files 1048576 --aggregates 0.25 0.5 1.0
    .venv/bin/python benchmarks/cache/job_cache.py --swaps --json docs/job-cache-swaps.json

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from peers import run_job
from stager.catalog import Catalog
from stager.config import config_from_dict, load_config
from stager.errors import ConfigError
from stager.job.synth import MANIFEST, make_dataset
from stager.simulate import Layout, load_profile, simulate
from stager.slowfs import SlowFS

AGGREGATES = (0.1, 0.25, 0.5, 1.0, 1.2, 2.0)
DEPTHS = ("auto", 16)


def simulated(cfg, nodes, ranks, sizes, tracked=None):
    """``(stager's source files per epoch, the optimum's per epoch, lookahead used)``, or None where refused."""
    try:
        result = simulate(cfg, load_profile(), Layout(nodes, ranks, tracked), sizes)
    except ConfigError:
        return None
    return ([e["source_files"] for e in result["methods"]["stager"]["epochs"]],
            result.get("optimum", {}).get("per_epoch"), result["lookahead"])


def real_rows(opts, work):
    rows = []
    data = os.path.join(work, "data")
    make_dataset(data, opts.samples, opts.bytes, progress=False)
    catalog = Catalog.from_manifest(data, MANIFEST)
    total = int(catalog.sizes.sum())
    os.mkdir(os.path.join(work, "mnt"))
    with SlowFS(data, os.path.join(work, "mnt"), open_ms=opts.open_ms) as mnt:
        for nodes in opts.nodes:
            for aggregate in opts.aggregates:
                for depth in opts.depths:
                    capacity = int(aggregate * total / nodes)
                    cfg_path = os.path.join(work, "job.yaml")
                    local = os.path.join(work, "local")
                    body = {"dataset": {"source": mnt, "manifest": MANIFEST},
                            "plan": {"batch_size": opts.batch_size, "epochs": 3, "seed": 1},
                            "staging": {"local_dir": local, "prefetchers": opts.prefetchers, "lookahead": depth,
                                        "peers": "partition", "capacity": capacity,
                                        "peer_swaps": opts.swaps},
                            "reader": {"workers": 2}, "run": {"compute_ms": opts.compute_ms,
                                                              "state_file": os.path.join(work, "state.json")}}
                    with open(cfg_path, "w") as fh:
                        json.dump(body, fh)
                    sim = simulated(load_config(cfg_path), nodes, 1, catalog.sizes)
                    row = {"nodes": nodes, "aggregate": aggregate, "lookahead": depth, "capacity": capacity}
                    if sim is None:
                        row["refused"] = True
                    else:
                        r = run_job(cfg_path, nodes, [], work)
                        row.update(real=[e["files_from_source"] for e in r["cache"]], simulated=sim[0],
                                   optimum=sim[1], depth=sim[2], wall_s=r["wall_s"],
                                   stall=r["stall_fraction"])
                    shutil.rmtree(local, ignore_errors=True)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    return rows, total


def scale_rows(opts):
    rows = []
    sizes = np.full(opts.scale_files, 110_000, dtype=np.int64)
    for aggregate in opts.aggregates:
        for depth in opts.depths:
            capacity = int(aggregate * sizes.sum() / 1024)
            cfg = config_from_dict({"dataset": {"source": "/nonexistent"},
                                    "plan": {"batch_size": opts.scale_batch, "epochs": 3, "seed": 1},
                                    "staging": {"prefetchers": 8, "lookahead": depth, "peers": "partition",
                                                "capacity": capacity, "peer_swaps": opts.swaps},
                                    "reader": {"workers": 2}, "run": {"compute_ms": 20}})
            sim = simulated(cfg, 1024, 4, sizes, tracked=8)
            row = {"nodes": 1024, "aggregate": aggregate, "lookahead": depth}
            row.update({"refused": True} if sim is None else {"simulated": sim[0], "optimum": sim[1], "depth": sim[2]})
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def table(rows, files):
    lines = ["| nodes | aggregate | look-ahead | real reads / dataset | simulated | optimum | real / optimum | wall s | stall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("refused"):
            lines.append(f"| {r['nodes']} | {r['aggregate']}x | {r['lookahead']} | refused: window > capacity "
                         "| | | | | |")
            continue
        best = sum(r["optimum"]) if r.get("optimum") else files
        real = sum(r["real"]) if "real" in r else None
        cells = [f"{real / files:.3f}" if real is not None else "-", f"{sum(r['simulated']) / files:.3f}",
                 f"{best / files:.3f}", f"{real / best:.3f}" if real is not None else
                 f"{sum(r['simulated']) / best:.3f} (sim.)",
                 f"{r['wall_s']:.2f}" if "wall_s" in r else "", f"{r['stall']:.1%}" if "stall" in r else ""]
        depth = r["lookahead"] if r["lookahead"] != "auto" else f"auto ({r['depth']})"
        lines.append(f"| {r['nodes']} | {r['aggregate']}x | {depth} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--bytes", type=int, default=40_000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--open-ms", type=float, default=10.0)
    ap.add_argument("--prefetchers", type=int, default=4)
    ap.add_argument("--compute-ms", type=float, default=5.0)
    ap.add_argument("--scale-files", type=int, default=262_144, help="files of the 1,024-node simulation")
    ap.add_argument("--scale-batch", type=int, default=8, help="batch size of the 1,024-node simulation")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4], help="emulated nodes of the real runs")
    ap.add_argument("--aggregates", type=float, nargs="+", default=list(AGGREGATES),
                    help="the nodes' capacities together, in datasets")
    ap.add_argument("--depths", nargs="+", default=list(DEPTHS), type=lambda v: v if v == "auto" else int(v),
                    help="staging.lookahead values (auto or a number)")
    ap.add_argument("--no-scale", action="store_true", help="leave out the 1,024-node simulation")
    ap.add_argument("--swaps", action="store_true", help="staging.peer_swaps: true")
    ap.add_argument("--no-real", action="store_true", help="leave out the real runs")
    opts = ap.parse_args()
    real, total = [], None
    if not opts.no_real:
        work = tempfile.mkdtemp(prefix="stager-job-cache-")
        try:
            real, total = real_rows(opts, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    scale = [] if opts.no_scale else scale_rows(opts)
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump({"options": vars(opts), "dataset_bytes": total, "real": real, "scale": scale}, fh, indent=1)
            fh.write("\n")
    if real:
        print(table(real, opts.samples))
    if scale:
        print()
        print(table(scale, opts.scale_files))


if __name__ == "__main__":
    main()
