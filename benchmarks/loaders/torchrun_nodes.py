"""Under torchrun: one staging service per node against each rank staging for itself.

    .venv/bin/python benchmarks/loaders/torchrun_nodes.py --ranks 4 --samples 1024 --open-ms 10

Runs ``stager run`` for two epochs under ``torchrun --standalone
--nproc_per_node=RANKS`` twice, side by side on the same synthetic dataset
behind the emulated slow file system: with ``world.backend=torch`` (the
node's ranks share one staging service, what torchrun gets by default) and
with ``world.backend=none`` (each rank stages for itself, what it got before
torch.distributed was a backend). ``staging.prefetchers`` counts per service:
per-rank staging runs PREFETCHERS on every rank, so the shared service runs
once with as many and once with the node's total (PREFETCHERS x RANKS, the
same number of concurrent opens on the source). Prints, for each, the files
and bytes read from the source and the slowest rank's time, then the ratios.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def run(workdir, ranks, backend, prefetchers):
    """One torchrun job; returns (files, bytes, slowest rank's seconds, the command's seconds)."""
    # Each rank writes its own report, so the per-rank run (no gather) is counted too.
    cmd = [TORCHRUN, "--standalone", f"--nproc_per_node={ranks}", "--no-python", "sh", "-c",
           f'exec "$0" "$@" --report "{backend}-$RANK.json"', sys.executable, "-m", "stager", "run", "job.yaml",
           "--quiet", "--set", f"world.backend={backend}", "--set", f"staging.prefetchers={prefetchers}"]
    env = dict(os.environ, PYTHONPATH=REPO, TMPDIR=workdir, OMP_NUM_THREADS="1")
    begin = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - begin
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    # With the torch backend rank 0's report holds the job's totals (the
    # others write none); without one, every rank reports for itself.
    reports = []
    for r in range(1 if backend == "torch" else ranks):
        with open(os.path.join(workdir, f"{backend}-{r}.json")) as fh:
            reports.append(json.load(fh))
    return (sum(r["files_staged"] for r in reports), sum(r["bytes_staged"] for r in reports),
            max(r["wall_s"] for r in reports), elapsed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="workers on the one node (default 4)")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--bytes", type=int, default=110000)
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--mbps", type=float, default=200.0)
    parser.add_argument("--prefetchers", type=int, default=4, help="per rank without a backend (default 4)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stager-torchrun-bench-") as workdir:
        with open(os.path.join(workdir, "job.yaml"), "w") as fh:
            fh.write(f"dataset: {{source: data, manifest: manifest.tsv}}\n"
                     f"synthetic: {{samples: {args.samples}, bytes: {args.bytes}}}\n"
                     f"slowfs: {{enabled: true, open_ms: {args.open_ms}, mbps: {args.mbps}}}\n"
                     "plan: {batch_size: 16, epochs: 2}\nstaging: {local_dir: local}\n"
                     "reader: {workers: 1}\n")
        # Made once beforehand: ranks without a backend would all make it at once.
        subprocess.run([sys.executable, "-m", "stager", "make-dataset", os.path.join(workdir, "data"), "--samples",
                        str(args.samples), "--bytes", str(args.bytes), "--quiet"], check=True,
                       env=dict(os.environ, PYTHONPATH=REPO))
        p = args.prefetchers
        runs = [("none", p, f"each rank for itself, {p} prefetchers each"),
                ("torch", p, f"one service per node, {p} prefetchers"),
                ("torch", p * args.ranks, f"one service per node, {p * args.ranks} prefetchers")]
        results = [run(workdir, args.ranks, backend, n) for backend, n, _ in runs]
    print(f"torchrun --nproc_per_node={args.ranks}, 2 epochs of {args.samples} samples of {args.bytes} B, "
          f"{args.open_ms:g} ms per open, {args.mbps:g} MB/s")
    for (backend, _, what), (files, nbytes, wall, elapsed) in zip(runs, results):
        print(f"  world.backend={backend:5} ({what}): {files} files, {nbytes / 1e6:.1f} MB read from the source; "
              f"slowest rank {wall:.2f} s, whole command {elapsed:.1f} s")
    f0, b0, w0, e0 = results[0]
    for (_, _, what), (f1, b1, w1, e1) in zip(runs[1:], results[1:]):
        print(f"  per-rank / {what}: {f0 / f1:.2f}x the files, {b0 / b1:.2f}x the bytes, {w0 / w1:.2f}x the "
              f"slowest rank's time ({e0 / e1:.2f}x the whole command)")


if __name__ == "__main__":
    main()
