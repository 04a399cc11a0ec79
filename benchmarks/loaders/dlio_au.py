"""DLIO's accelerator utilisation (AU) with DLIO's own PyTorch loader and with stager's, behind the emulated file system.

    .venv/bin/python benchmarks/loaders/dlio_au.py                      # the three workloads of configs/dlio, 10 ms an open
    .venv/bin/python benchmarks/loaders/dlio_au.py --workloads resnet50_npz --rounds 1 --json /tmp/dlio.json

For each workload of ``configs/dlio/workload`` DLIO's own generator writes
the dataset once (under ``--work``); the emulator serves it at
``--open-ms`` an open; then, alternating in each of ``--rounds`` rounds,
``dlio_benchmark`` runs the workload for its epochs with
``reader.data_loader: pytorch`` (DLIO's ``TorchDataLoader``: a
``DataLoader`` with the workload's ``read_threads`` workers) and with
``iterators.dlio.StagedDataLoader`` (the same number of readers, the
workload's ``stager`` section: none, the defaults), and, as the ceiling
that DLIO's own loop sets on this machine, with DLIO's loader on the
dataset as generated (no emulator, in the page cache). Each run is a fresh
process tree; AU and samples/s per epoch are DLIO's own (its
``summary.json``); CPU seconds per process kind are sampled from ``/proc``
(DLIO's process, DataLoader workers, stager's readers and prefetchers, the
emulator's daemon). For stager's runs the stall report's bottleneck line
(``stager report``) says what held an epoch back. Medians over rounds.

Each ``dlio_benchmark`` runs in a process group of its own, ended whole
however this script ends (Ctrl-C, ``kill``, an error), with its temporary
files (multiprocessing's ``pymp-*``) in the work directory, which goes too.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from stager.bench.cpu import descendants, readings  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402

BIN = os.path.dirname(sys.executable)
CONFIGS = os.path.join(REPO, "configs", "dlio")
LOADERS = {
    "dlio": [],
    "stager": ["++workload.reader.data_loader_classname=iterators.dlio.StagedDataLoader",
               "++workload.reader.data_loader_sampler=index"],
    # DLIO's own loader on the dataset as generated (no emulator, in the page cache): what DLIO's loop itself
    # allows on this machine, whatever the loader.
    "ceiling": [],
}


def emulator_cpu():
    """CPU seconds so far of the emulator daemons this process started."""
    return sum(cpu for name, cpu in readings(descendants(os.getpid())).values() if name.startswith("slowfsd"))


def dlio(workload, data, out, *overrides, cwd):
    """Runs ``dlio_benchmark`` on ``workload``; returns its output and CPU seconds per process kind."""
    command = [os.path.join(BIN, "dlio_benchmark"), "--config-dir", CONFIGS, f"workload={workload}",
               f"hydra.run.dir={out}", f"++workload.dataset.data_folder={data}", *overrides]
    tmp = os.path.join(cwd, "tmp")  # DLIO's processes leave multiprocessing's pymp-* directories in their TMPDIR
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, TMPDIR=tmp)
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen, stop = {}, threading.Event()

    def sample():
        while not stop.wait(0.05):
            seen.update(readings(descendants(proc.pid) | {proc.pid}))

    meter = threading.Thread(target=sample, daemon=True)
    meter.start()
    try:
        output, _ = proc.communicate()
    finally:
        stop.set()
        meter.join()
        end_group(proc)
    if proc.returncode:
        raise RuntimeError(f"dlio_benchmark {workload} failed ({proc.returncode}):\n{output[-4000:]}")
    cpu = {}
    for pid, (name, seconds) in seen.items():
        kind = ("dlio" if pid == proc.pid else "prefetchers" if name.startswith("stager-prefetch") else
                "readers" if name.startswith("stager-read") else "workers")
        cpu[kind] = round(cpu.get(kind, 0.0) + seconds, 2)
    return output, cpu


def end_group(proc, grace_s=15.0):
    """Ends what is left of ``proc``'s process group: all of it where this script was interrupted, else stragglers.

    A running DLIO gets SIGINT first, which its Python turns into an exit
    that finalizes MPI (mpich's segment in /dev/shm goes with it), then
    SIGKILL after ``grace_s``.
    """
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def one_run(workload, loader, data, work, rounds_dir, sets=()):
    out = os.path.join(rounds_dir, f"{workload}-{loader}")
    shutil.rmtree(out, ignore_errors=True)
    local = os.path.join(work, "local")
    extra = LOADERS[loader] + ([f"++workload.stager.staging.local_dir={local}"] if loader == "stager" else [])
    extra += list(sets)
    before = emulator_cpu()
    _, cpu = dlio(workload, data, out, *extra, cwd=work)
    cpu["emulator"] = round(emulator_cpu() - before, 2)
    with open(os.path.join(out, "summary.json")) as fh:
        metric = json.load(fh)["metric"]
    result = {"au": [round(a, 1) for a in metric["train_au_percentage"]],
              "samples_per_s": [round(s, 1) for s in metric["train_throughput_samples_per_second"]],
              "cpu_s": cpu}
    if loader == "stager":
        text = subprocess.run([os.path.join(BIN, "stager"), "report", os.path.join(out, "stager-train.json")],
                              capture_output=True, text=True, check=True).stdout
        result["bottleneck"] = next((line for line in text.splitlines() if line.startswith("bottleneck:")), "")
        result["stall"] = next((line for line in text.splitlines() if line.startswith("stall:")), "")
    return result


def median_of(runs, key):
    return [round(statistics.median(r[key][e] for r in runs), 1) for e in range(len(runs[0][key]))]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="resnet50_npz,unet3d_npz,cosmoflow_hdf5")
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default=None, help="where datasets and outputs go (default: a temporary dir)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--loaders", default=",".join(LOADERS), help="which rows to run (of dlio, stager, ceiling)")
    parser.add_argument("--stager-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a stager setting for stager's row (++workload.stager.KEY=VALUE; the defaults without)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the cleanups below: groups, mounts, work
    work = args.work or tempfile.mkdtemp(prefix="stager-dlio-bench-")
    os.makedirs(work, exist_ok=True)
    results = {"open_ms": args.open_ms, "rounds": args.rounds, "cores": len(os.sched_getaffinity(0)),
               "workloads": {}}
    try:
        for workload in args.workloads.split(","):
            data = os.path.join(work, workload, "data")
            if not os.path.isdir(os.path.join(data, "train")):
                dlio(workload, data, os.path.join(work, workload, "generate"),
                     "++workload.workflow.generate_data=True", "++workload.workflow.train=False", cwd=work)
            mnt = os.path.join(work, workload, "mnt")
            os.makedirs(mnt, exist_ok=True)
            runs = {loader: [] for loader in args.loaders.split(",")}
            with SlowFS(data, mnt, open_ms=args.open_ms) as mounted:
                for r in range(args.rounds):
                    for loader in runs:
                        source = data if loader == "ceiling" else mounted
                        run = one_run(workload, loader, source, work, os.path.join(work, workload),
                                      [f"++workload.stager.{kv}" for kv in args.stager_set] if loader == "stager" else [])
                        runs[loader].append(run)
                        print(f"{workload} round {r + 1} {loader}: AU {run['au']} samples/s {run['samples_per_s']} "
                              f"CPU {run['cpu_s']} {run.get('bottleneck', '')}", flush=True)
            summary = {loader: {"au": median_of(rs, "au"), "samples_per_s": median_of(rs, "samples_per_s"),
                                "cpu_s": {k: round(statistics.median(r["cpu_s"].get(k, 0.0) for r in rs), 2)
                                          for k in sorted({k for r in rs for k in r["cpu_s"]})},
                                "runs": rs} for loader, rs in runs.items()}
            results["workloads"][workload] = summary
            if "dlio" not in summary or "stager" not in summary:
                continue
            dlio_au, staged_au = summary["dlio"]["au"], summary["stager"]["au"]
            print(f"{workload}: AU per epoch, DLIO's loader {dlio_au}, stager's {staged_au}: "
                  f"{', '.join(f'{s / d:.1f}x' for s, d in zip(staged_au, dlio_au))}", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
