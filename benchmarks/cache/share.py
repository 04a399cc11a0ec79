"""Concurrent jobs on one node sharing one staging service (``staging.share``) against the same jobs alone.

Starts 1, 2, 4 and 8 ``stager run`` jobs at once over the slow file system
emulator (10 ms an open) reading a JPEG dataset decoded to float32 CHW, for
3 epochs, twice: as one group (same seed and loader: one service, each file
read once, each minibatch decoded once) and independently (each job its own
staging directory, prefetchers and readers). Records per setting the time of
each job and of the whole set, the files and bytes the jobs read from the
source, and the CPU seconds of every process kind: the jobs' main processes,
their readers (the decoding), prefetchers (the jobs' or the group's) and the
group's service, and the opens of the samples' files on the source
(inotify on the emulator's backing tree: the group's and the jobs' probes
included; the manifest, which each job reads once, apart). The
jobs run on the defaults (``auto`` counts), and with counts set by hand
where ``--counts`` names them. This process makes itself the child subreaper, so the
group's service, which leaves its founder's process tree by design, is
still counted (and reaped) here.

    .venv/bin/python benchmarks/cache/share.py --json docs/share.json
    .venv/bin/python benchmarks/cache/share.py --counts auto,8:2 --jobs 8 --json docs/share-8.json

Prints a Markdown section for docs/benchmarks.md.
"""

import argparse
import compileall
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from helpers.opens import Opens  # noqa: E402
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


def run_set(n, shared, counts, job, work, skip, data):
    """Runs ``n`` jobs at once; returns their reports, times, the source's opens and the CPU per kind.

    ``counts`` is "auto" (the defaults) or "P:R", prefetchers and readers set by hand.
    """
    sets = [f"staging.share=bench{n}-{counts.replace(':', '-')}"] if shared else []
    if counts != "auto":
        prefetchers, readers = counts.split(":")
        sets += [f"staging.prefetchers={prefetchers}", f"reader.workers={readers}"]
    with Opens(data) as opens:
        out = _run_jobs(n, shared, counts, sets, job, work, skip)
        counted = opens.count()
        out["source_opens"] = sum(counted.values()) - counted[MANIFEST]  # each job reads the manifest once
        out["manifest_opens"] = counted[MANIFEST]
    return out


def _run_jobs(n, shared, counts, sets, job, work, skip):
    procs, begin = [], time.perf_counter()
    for i in range(n):
        rep = os.path.join(work, f"{'shared' if shared else 'alone'}-{counts.replace(':', '-')}-{n}-{i}.json")
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
    return {"jobs": n, "shared": shared, "counts": counts, "elapsed_s": round(max(ends), 2),
            "counts_at_start": sorted({_start(r) for r in reports}),
            "job_wall_s": [round(r["wall_s"], 2) for r in reports],
            "files_from_source": sum(r["files_staged"] for r in reports),
            "bytes_from_source": sum(r["bytes_staged"] for r in reports),
            "batches_from_group": sum(r.get("group", {}).get("batches_from_group", 0) for r in reports),
            "samples_decoded": sum((r.get("group") or {}).get("samples_decoded", r["samples"]) for r in reports),
            "cpu": cpu}


def _start(report):
    """A job's counts when it began: 'P x F + R' (prefetchers x files in flight + readers)."""
    first = (report.get("counts_timeline") or [{}])[0]
    return f"{first.get('prefetchers', '?')} x {first.get('in_flight', '?')} + {first.get('readers', '?')}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--jobs", default="1,2,4,8")
    ap.add_argument("--open-ms", type=float, default=10.0)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--counts", default="auto,8:2",
                    help="comma-separated: auto (the defaults) or PREFETCHERS:READERS set by hand")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    # Each job's start is a share of the CPU this measures: the jobs load stager's modules compiled, as an
    # installed stager (and scripts/bootstrap.sh's) does, not compiled anew where PYTHONDONTWRITEBYTECODE is set.
    compileall.compile_dir(os.path.join(REPO, "stager"), quiet=1)
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
staging: {{local_dir: {os.path.join(work, 'local')}}}
run: {{compute_ms: {args.compute_ms}}}
""")
            skip = descendants(os.getpid())  # the emulator: its opens are the jobs', its CPU is not theirs
            for n in [int(x) for x in args.jobs.split(",")]:
                for counts in args.counts.split(","):
                    for shared in (True, False):
                        results.append(run_set(n, shared, counts, job, work, skip, data))
                    print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "cores": os.cpu_count(), "results": results}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print(markdown(out))


def markdown(out):
    rows = ["| jobs | counts | mode | all done (s) | each job (s) | source opens | files / MB fetched | "
            "minibatches from group | samples decoded | CPU s: jobs / readers / prefetchers / service |",
            "|" + "---|" * 10]
    for r in out["results"]:
        c = r["cpu"]
        counts = "defaults" if r.get("counts", "auto") == "auto" else r["counts"].replace(":", " + ") + " by hand"
        rows.append(f"| {r['jobs']} | {counts} ({'; '.join(r.get('counts_at_start', []))}) | "
                    f"{'shared' if r['shared'] else 'independent'} | {r['elapsed_s']:.1f} | "
                    f"{', '.join(f'{w:.1f}' for w in r['job_wall_s'])} | {r.get('source_opens', '-')} | "
                    f"{r['files_from_source']} / "
                    f"{r['bytes_from_source'] / 1e6:.0f} | {r['batches_from_group']} | {r['samples_decoded']} | "
                    f"{c['jobs']:.1f} / {c['readers']:.1f} / {c['prefetchers']:.1f} / {c['service']:.1f} |")
    by = {(r["jobs"], r.get("counts", "auto"), r["shared"]): r for r in out["results"]}
    lines = []
    for n, counts, shared in sorted(by):
        if shared and (n, counts, False) in by:
            lines.append(f"- {n} job(s), {'defaults' if counts == 'auto' else counts + ' by hand'}: independent / "
                         f"shared all-done time = "
                         f"{by[(n, counts, False)]['elapsed_s'] / by[(n, counts, True)]['elapsed_s']:.2f}x")
    return "\n".join(rows + [""] + lines)


if __name__ == "__main__":
    main()
