"""Concurrent jobs on one node sharing one staging service (``staging.share``) against the same jobs alone.

Starts 1, 2 and 4 ``stager run`` jobs at once over the slow file system
emulator (10 ms an open) reading a JPEG dataset decoded to float32 CHW, for
3 epochs, twice: as one group (same seed and loader: one service, each file
read once, each minibatch decoded once) and independently (each job its own
staging directory, prefetchers and readers). Records per setting the time of
each job and of the whole set, the files and bytes the jobs read from the
source, and the CPU seconds of every process kind: the jobs' main processes,
their readers (the decoding), prefetchers (the jobs' or the group's) and the
group's service. This process makes itself the child subreaper, so the
group's service, which leaves its founder's process tree by design, is
still counted (and reaped) here.

    .venv/bin/python benchmarks/cache/share.py --json docs/share.json

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager.bench.cpu import descendants, readings  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402

_PR_SET_CHILD_SUBREAPER = 36
KINDS = ("jobs", "readers", "prefetchers", "service")


class Meter:
    """CPU seconds of every process below this one, by kind, sampled every 50 ms until stopped."""

    def __init__(self, jobs, skip):
        self.jobs, self.skip = set(jobs), set(skip)
        self.last = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            self.last.update(readings(descendants(os.getpid()) - self.skip))

    def seconds(self):
        self._stop.set()
        self._thread.join()
        out = dict.fromkeys(KINDS, 0.0)
        for pid, (name, cpu) in self.last.items():
            kind = ("jobs" if pid in self.jobs else "readers" if name.startswith("stager-read")
                    else "prefetchers" if name.startswith("stager-prefetch") else "service")
            out[kind] += cpu
        return {k: round(v, 2) for k, v in out.items()}


def run_set(n, shared, job, work, skip):
    """Runs ``n`` jobs at once; returns their reports, times and the CPU per kind."""
    sets = [f"staging.share=bench{n}"] if shared else []
    procs, begin = [], time.perf_counter()
    for i in range(n):
        rep = os.path.join(work, f"{'shared' if shared else 'alone'}-{n}-{i}.json")
        cmd = [sys.executable, "-m", "stager", "run", job, "--quiet", "--report", rep]
        for s in sets:
            cmd += ["--set", s]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=dict(os.environ, TMPDIR=work, OMP_NUM_THREADS="1")), rep))
    meter = Meter([p.pid for p, _ in procs], skip)
    ends = []
    for proc, _ in procs:
        out, err = proc.communicate()
        ends.append(time.perf_counter() - begin)
        if proc.returncode:
            sys.exit(f"{n} jobs (shared={shared}) failed:\n{out}{err}")
    for pid in descendants(os.getpid()) - skip:  # the group's service, orphaned to us: it ends with its last job
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # not ours (a grandchild)
    cpu = meter.seconds()
    reports = [json.load(open(rep)) for _, rep in procs]
    return {"jobs": n, "shared": shared, "elapsed_s": round(max(ends), 2),
            "job_wall_s": [round(r["wall_s"], 2) for r in reports],
            "files_from_source": sum(r["files_staged"] for r in reports),
            "bytes_from_source": sum(r["bytes_staged"] for r in reports),
            "batches_from_group": sum(r.get("group", {}).get("batches_from_group", 0) for r in reports),
            "samples_decoded": sum((r.get("group") or {}).get("samples_decoded", r["samples"]) for r in reports),
            "cpu": cpu}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--jobs", default="1,2,4")
    ap.add_argument("--open-ms", type=float, default=10.0)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--prefetchers", type=int, default=8)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    work = tempfile.mkdtemp(prefix="stager-share-bench-")
    results = []
    try:
        data = os.path.join(work, "data")
        make_dataset(data, args.samples, nbytes=115_000, classes=10, seed=1, progress=False, fmt="jpeg")
        os.mkdir(os.path.join(work, "mnt"))
        with SlowFS(data, os.path.join(work, "mnt"), open_ms=args.open_ms, mbps=0) as mnt:
            os.mkdir(os.path.join(work, "local"))
            job = os.path.join(work, "job.yaml")
            with open(job, "w") as fh:
                fh.write(f"""
dataset: {{source: {mnt}, manifest: {MANIFEST}, loader: image, layout: chw}}
plan: {{batch_size: 32, epochs: {args.epochs}, seed: 0}}
staging: {{local_dir: {os.path.join(work, 'local')}, prefetchers: {args.prefetchers}, lookahead: 8,
          capacity: unbounded}}
reader: {{workers: {args.readers}}}
run: {{compute_ms: {args.compute_ms}}}
""")
            skip = descendants(os.getpid())  # the emulator: its opens are the jobs', its CPU is not theirs
            for n in [int(x) for x in args.jobs.split(",")]:
                for shared in (True, False):
                    results.append(run_set(n, shared, job, work, skip))
                    print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "cores": os.cpu_count(), "results": results}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print(markdown(out))


def markdown(out):
    rows = ["| jobs | mode | all done (s) | each job (s) | files / MB from source | minibatches from group | "
            "samples decoded | CPU s: jobs / readers / prefetchers / service |", "|" + "---|" * 8]
    for r in out["results"]:
        c = r["cpu"]
        rows.append(f"| {r['jobs']} | {'shared' if r['shared'] else 'independent'} | {r['elapsed_s']:.1f} | "
                    f"{', '.join(f'{w:.1f}' for w in r['job_wall_s'])} | {r['files_from_source']} / "
                    f"{r['bytes_from_source'] / 1e6:.0f} | {r['batches_from_group']} | {r['samples_decoded']} | "
                    f"{c['jobs']:.1f} / {c['readers']:.1f} / {c['prefetchers']:.1f} / {c['service']:.1f} |")
    by = {(r["jobs"], r["shared"]): r for r in out["results"]}
    lines = []
    for n in sorted({r["jobs"] for r in out["results"]}):
        if (n, True) in by and (n, False) in by:
            lines.append(f"- {n} job(s): independent / shared all-done time = "
                         f"{by[(n, False)]['elapsed_s'] / by[(n, True)]['elapsed_s']:.2f}x")
    return "\n".join(rows + [""] + lines)


if __name__ == "__main__":
    main()
