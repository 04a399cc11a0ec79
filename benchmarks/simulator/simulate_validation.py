"""``stager simulate`` against real runs on this machine: epoch times and source reads, predicted and measured.

Real ``stager run`` jobs under ``mpiexec`` as 1, 2 and 4 emulated nodes of
one rank (``STAGER_NODE_ID``) over the slow file system emulator, across
capacities, cache policies, peers and open latencies; beside each, the
simulator's prediction for the same config on a profile of this machine:
``configs/profiles/emulated.yaml`` (the emulator's latency, every node
sharing the host's cores),
and the node's costs from ``stager whatif --report RUN --save``: a probe
refined by one run of its own (1 node, another seed); what a fetched file
costs the whole machine (the prefetcher, the emulator's daemon, the kernel,
the rank's threads) from that run and a second one that fetches nearly
every file every epoch (an LRU cache with room for little more than the
look-ahead window), both over 6 epochs: the difference of the host's busy
CPU seconds over the difference of the files. The same pair at the most
nodes compared gives what each other node on the host adds to a file
(``node.shared_copy_ms``), and the processes' start (``node.startup_s``)
is the slowest rank's time to its first request in the first run of each
pair, in between by the node count. The calibration runs are made before
and apart from the runs compared with (another seed).

    .venv/bin/python benchmarks/simulator/simulate_validation.py --json docs/simulate-validation.json

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cache"))
from peers import run_job  # noqa: E402  (benchmarks/cache/peers.py: stager run under mpiexec as emulated nodes)
from stager.cache import window_bytes
from stager.catalog import Catalog
from stager.config import load_config
from stager.engine.perf import cpu_ticks
from stager.job.synth import MANIFEST, make_dataset
from stager.model.whatif import load_rates
from stager.plan import steps_per_epoch
from stager.simulate import Layout, load_profile, simulate

PROFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "profiles", "emulated.yaml")
CALIBRATION_EPOCHS = 6  # the two calibration runs' epochs
COMBOS = [("unbounded", "auto", "off"), ("half", "clairvoyant", "off"), ("half", "lru", "off"),
          ("half", "clairvoyant", "partition")]


def half_capacity(catalog, nodes, opts):
    """Half a node's share of the dataset, plus the look-ahead window."""
    window = window_bytes(catalog.sizes, opts.batch_size, max(opts.lookahead, 2), 1)
    return int(catalog.sizes.sum()) // nodes // 2 + window


def tight_capacity(catalog, opts):
    """Room for the look-ahead window and one minibatch more: an LRU cache then fetches nearly every file every epoch."""
    window = window_bytes(catalog.sizes, opts.batch_size, max(opts.lookahead, 2), 1)
    return window + opts.batch_size * int(catalog.sizes.max())


def machine_cost_per_file(cfg_path, catalog, opts, nodes, work):
    """The host's busy CPU seconds a fetched file costs with ``nodes`` emulated nodes, and the two runs.

    Two runs of the same samples over ``CALIBRATION_EPOCHS``, the second with
    room for little more than the window, so they fetch thousands of files
    more: the difference of the host's busy seconds over that of the files.
    (The busy seconds of runs alike vary by a few tenths: from 1,942 files'
    difference this gave 0.9 and 2.1 ms on two days.) Made with another seed
    than the runs compared.
    """
    runs = {}
    for name, extra in (("all", ["staging.capacity=unbounded"]),
                        ("tight", [f"staging.capacity={tight_capacity(catalog, opts)}", "staging.cache_policy=lru"])):
        before = cpu_ticks()
        runs[name] = run_job(cfg_path, nodes, ["plan.seed=11", f"plan.epochs={CALIBRATION_EPOCHS}"] + extra, work)
        after = cpu_ticks()
        runs[name]["busy_cpu_s"] = (after[0] - before[0]) / os.sysconf("SC_CLK_TCK")
        shutil.rmtree(os.path.join(work, "local"), ignore_errors=True)
    fetched = {k: sum(e["files_from_source"] for e in r["cache"]) for k, r in runs.items()}
    return (runs["tight"]["busy_cpu_s"] - runs["all"]["busy_cpu_s"]) / (fetched["tight"] - fetched["all"]), runs


def startup_s(report):
    """The run's start: the seconds before its slowest rank first asked for a minibatch."""
    return max(rank["startup_s"] for rank in report["per_rank"])


def measured_epochs(report, steps):
    """Per epoch, the slowest rank's time from the previous epoch's end to its own (from the per-step series)."""
    out = []
    for rank in report["per_rank"]:
        ends = rank["series"]["end"]
        assert rank["series"]["stride"] == 1, "too many steps for a per-step series"
        bounds = [0.0] + [ends[(e + 1) * steps - 1] for e in range(len(ends) // steps)]
        out.append([b - a for a, b in zip(bounds, bounds[1:])])
    return [max(col) for col in zip(*out)]


def _count_or_auto(text):
    return text if text == "auto" else int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = {"samples": 1200, "bytes": 20_000, "epochs": 3, "batch-size": 16, "prefetchers": 4, "readers": 1,
                "lookahead": 4, "compute-ms": 10.0}
    for name, default in defaults.items():
        kind = _count_or_auto if name == "prefetchers" else type(default)
        ap.add_argument(f"--{name}", type=kind, default=default,
                        help="a count, or auto (files in flight tuned too, as the defaults)" if name == "prefetchers"
                        else None)
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--open-ms", default="10,2,25", help="the first for every combination, the others unbounded only")
    ap.add_argument("--json")
    opts = ap.parse_args()
    nodes_list = [int(x) for x in opts.nodes.split(",")]
    latencies = [float(x) for x in opts.open_ms.split(",")]
    work = tempfile.mkdtemp(prefix="stager-simval-")
    rows = []
    try:
        data = os.path.join(work, "data")
        make_dataset(data, opts.samples, opts.bytes, progress=False)
        catalog = Catalog.from_manifest(data, MANIFEST)
        cfg_path = os.path.join(work, "job.yaml")
        with open(cfg_path, "w") as fh:
            json.dump({"dataset": {"source": data, "manifest": MANIFEST, "loader": "npy"},
                       "slowfs": {"enabled": True, "open_ms": latencies[0]},
                       "plan": {"batch_size": opts.batch_size, "epochs": opts.epochs, "seed": 3},
                       "staging": {"local_dir": os.path.join(work, "local"), "prefetchers": opts.prefetchers,
                                   "lookahead": opts.lookahead},
                       "reader": {"workers": opts.readers, "ahead": 2},
                       "run": {"compute_ms": opts.compute_ms}}, fh)
        # The calibration: what a fetched file costs the whole machine (prefetcher, emulator daemon,
        # kernel, the rank's threads) at one node and at the most nodes compared, and a probe refined by
        # the one-node run, as `stager whatif --report` does.
        one, runs = machine_cost_per_file(cfg_path, catalog, opts, 1, work)
        most = max(nodes_list)
        more, most_runs = machine_cost_per_file(cfg_path, catalog, opts, most, work) if most > 1 else (one, runs)
        shared = (more - one) / (most - 1) if most > 1 else 0.0
        # The processes' start, at one node and at the most (emulated nodes start on the same cores).
        starts = (startup_s(runs["all"]), startup_s(most_runs["all"]))
        with open(os.path.join(work, "calibration-run.json"), "w") as fh:
            json.dump(runs["all"], fh)
        rates_path = os.path.join(work, "rates.json")
        subprocess.run([sys.executable, "-m", "stager", "whatif", cfg_path, "--report",
                        os.path.join(work, "calibration-run.json"), "--save", rates_path, "--prefetchers",
                        str(opts.prefetchers), "--readers", str(opts.readers)], check=True, capture_output=True,
                       env=dict(os.environ, TMPDIR=work))
        rates = load_rates(rates_path)
        cases = [(n, combo, latencies[0]) for n in nodes_list for combo in COMBOS]
        cases += [(n, COMBOS[0], ms) for n in nodes_list for ms in latencies[1:]]
        for nodes, (share, policy, peers), open_ms in cases:
            capacity = "unbounded" if share == "unbounded" else str(half_capacity(catalog, nodes, opts))
            sets = [f"staging.capacity={capacity}", f"staging.cache_policy={policy}", f"staging.peers={peers}",
                    f"slowfs.open_ms={open_ms}"]
            report = run_job(cfg_path, nodes, sets, work)
            shutil.rmtree(os.path.join(work, "local"), ignore_errors=True)
            cfg = load_config(cfg_path, sets)
            profile = load_profile(PROFILE, [f"filesystem.open_ms={open_ms}"]).with_rates(rates)
            start = starts[0] + (starts[1] - starts[0]) * (nodes - 1) / max(1, most - 1)
            profile = profile.set([f"costs.copy_ms={1e3 * one}", f"node.shared_copy_ms={max(0.0, 1e3 * shared)}",
                                   f"node.startup_s={start}"])
            sim = simulate(cfg, profile, Layout(nodes), catalog.sizes)["methods"]["stager"]
            unstarted = simulate(cfg, profile.set(["node.startup_s=0"]), Layout(nodes), catalog.sizes)["methods"]["stager"]
            if opts.prefetchers == "auto":
                # The model before the files in flight were simulated: a pool of processes, tuned.
                pool = simulate(load_config(cfg_path, sets + ["dataset.requests_in_flight=1"]), profile, Layout(nodes),
                                catalog.sizes)["methods"]["stager"]
            steps = steps_per_epoch(len(catalog), opts.batch_size, False, nodes)
            measured = measured_epochs(report, steps)
            row = {"nodes": nodes, "capacity": share, "policy": policy, "peers": peers, "open_ms": open_ms,
                   "measured_s": measured, "predicted_s": [e["seconds"] for e in sim["epochs"]],
                   "predicted_first_without_start_s": unstarted["epochs"][0]["seconds"],
                   "counts_predicted": sim.get("counts_timeline", [])[:1],
                   "counts_measured": report.get("counts_timeline", [])[:1],
                   "measured_source": [e["files_from_source"] for e in report["cache"]],
                   "predicted_source": [e["source_files"] for e in sim["epochs"]]}
            if opts.prefetchers == "auto":
                row["predicted_as_processes_s"] = [e["seconds"] for e in pool["epochs"]]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"options": vars(opts), "calibration": rates.to_dict(), "machine_cpu_s_per_fetched_file": one,
              "more_per_other_node_s": shared, "startup_s": {"1": starts[0], str(most): starts[1]}, "rows": rows}
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(result, fh, indent=1)
    print(markdown(result, " ".join(sys.argv[1:])))


def _starts(rows, key):
    return ", ".join(sorted({f"{c['prefetchers']} x {c.get('in_flight', 1)}" for r in rows for c in r.get(key, ())}))


def markdown(result, args):
    opts, rows = result["options"], result["rows"]
    lines = [f"Command: `.venv/bin/python benchmarks/simulator/simulate_validation.py {args}`", "",
             f"{opts['samples']} files of {opts['bytes']} bytes, {opts['epochs']} epochs, batch {opts['batch_size']}, "
             f"{opts['prefetchers']} prefetchers and {opts['readers']} reader a node, look-ahead {opts['lookahead']}, "
             f"{opts['compute_ms']:g} ms compute a step; \"half\" is half the node's share of the dataset plus the "
             "look-ahead window. The processes' start, from the calibration runs: "
             + ", ".join(f"{s:.2f} s at {n} node{'s' if n != '1' else ''}" for n, s in result["startup_s"].items())
             + ".", "",
             "| nodes | capacity | policy | peers | open ms | epoch s measured | epoch s predicted | error | "
             "files from source measured | predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
    errors = []
    for r in rows:
        err = [p / m - 1 for m, p in zip(r["measured_s"], r["predicted_s"])]
        errors += err
        lines.append(f"| {r['nodes']} | {r['capacity']} | {r['policy']} | {r['peers']} | {r['open_ms']:g} | "
                     f"{' / '.join(f'{x:.2f}' for x in r['measured_s'])} | "
                     f"{' / '.join(f'{x:.2f}' for x in r['predicted_s'])} | "
                     f"{' / '.join(f'{x:+.0%}' for x in err)} | {' / '.join(map(str, r['measured_source']))} | "
                     f"{' / '.join(map(str, r['predicted_source']))} |")
    exact = sum(r["measured_source"] == r["predicted_source"] for r in rows)
    within = sum(abs(e) <= 0.15 for e in errors)
    firsts = [r["predicted_s"][0] / r["measured_s"][0] - 1 for r in rows]
    unstarted = [r["predicted_first_without_start_s"] / r["measured_s"][0] - 1 for r in rows]
    lines.append(f"\nEpoch times within 15%: {within} of {len(errors)}; largest error {max(map(abs, errors)):.0%}. "
                 f"Source reads equal in {exact} of {len(rows)} settings. First epochs within 5%: "
                 f"{sum(abs(e) <= 0.05 for e in firsts)} of {len(rows)}, mean error {sum(firsts) / len(rows):+.1%}; "
                 f"the same simulation without the processes' start: {sum(abs(e) <= 0.05 for e in unstarted)} of "
                 f"{len(rows)}, mean error {sum(unstarted) / len(rows):+.1%}.")
    pooled = [p / m - 1 for r in rows for m, p in zip(r["measured_s"], r.get("predicted_as_processes_s", ()))]
    if pooled:
        lines.append(f"\nThe same runs predicted as a pool of processes (the model before files in flight were "
                     f"simulated): epoch times within 15% {sum(abs(e) <= 0.15 for e in pooled)} of {len(pooled)}, "
                     f"largest error {max(map(abs, pooled)):.0%}, mean {sum(pooled) / len(pooled):+.1%} (with files "
                     f"in flight: mean {sum(errors) / len(errors):+.1%}). Counts at start (prefetchers x files in "
                     f"flight each), simulated: {_starts(rows, 'counts_predicted')}; measured: "
                     f"{_starts(rows, 'counts_measured')}.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
