"""What the always-on accounting costs, against a minibatch's time.

Runs a pipeline on the emulated slow file system (``--batches`` minibatches
of ``--batch-size`` files of ``--bytes``, ``--open-ms`` per open, ``--compute-ms``
of simulated training per step), then measures, on the same machine:

- the events the run recorded per minibatch (every thread, the node's
  service included) and what recording one costs: the run's own event mix
  replayed ``--repeat`` times into a fresh ``Stats`` (the event log plus the
  running totals it keeps), the median of five timings;
- what the end-of-run accounting costs (``Pipeline.accounting`` and the
  job's stage rates), spread over the run's minibatches;
- what the progress line costs per minibatch (``RunProgress.update`` drawing
  to a terminal);

and prints each as microseconds per minibatch and as a share of the
measured minibatch time (loop wall time / minibatches):

    PYTHONPATH=. .venv/bin/python benchmarks/studies/accounting_overhead.py
"""

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from stager import telemetry as tm  # noqa: E402
from stager.config import config_from_dict  # noqa: E402
from stager.engine import Pipeline  # noqa: E402
from stager.job.progress import RunProgress  # noqa: E402
from stager.job.synth import MANIFEST, make_dataset  # noqa: E402
from stager.slowfs import SlowFS  # noqa: E402
from stager.telemetry import Stats  # noqa: E402
from stager.telemetry.accounting import job_nodes, job_stages  # noqa: E402


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _median_time(fn, times=5):
    out = []
    for _ in range(times):
        begin = time.perf_counter()
        fn()
        out.append(time.perf_counter() - begin)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--bytes", type=int, default=20_000)
    ap.add_argument("--open-ms", type=float, default=2.0)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--prefetchers", type=int, default=8)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20, help="replays of the run's events for the timing")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="stager-acct-")
    try:
        data, mnt = os.path.join(work, "data"), os.path.join(work, "mnt")
        os.mkdir(mnt)
        make_dataset(data, args.batches * args.batch_size, nbytes=args.bytes, progress=False)
        with SlowFS(data, mnt, open_ms=args.open_ms, mbps=0):
            cfg = config_from_dict({
                "dataset": {"source": mnt, "manifest": MANIFEST, "loader": "npy"},
                "plan": {"batch_size": args.batch_size, "epochs": 1, "seed": 0},
                "staging": {"local_dir": os.path.join(work, "local"), "prefetchers": args.prefetchers,
                            "lookahead": 8},
                "reader": {"workers": args.readers}})
            compute = args.compute_ms / 1000.0
            with Pipeline(cfg) as pipe:
                loop_begin = time.monotonic()
                for _ in pipe:
                    time.sleep(compute)
                loop_end = time.monotonic()
            batches = pipe.stats.batches
            per_batch = (loop_end - loop_begin) / batches
            events = pipe.stats.telemetry.events()
            account_s = _median_time(lambda: job_stages([pipe.accounting(loop_begin, loop_end)]))
            record = pipe.accounting(loop_begin, loop_end)
            job_nodes([record])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mix = [(tm.KINDS.index(kind), a, b, value) for _, kind, a, b, value in events]

    def replay():
        stats = Stats()
        rec = stats.telemetry.record
        for _ in range(args.repeat):
            for kind, a, b, value in mix:
                rec(kind, a, b, value)

    per_event = _median_time(replay) / (args.repeat * len(mix))
    events_per_batch = len(mix) / batches
    bar = RunProgress(batches, "bench", Stats(), stream=_Tty())
    progress_s = _median_time(lambda: [bar.update() for _ in range(batches)]) / batches
    bar.close()

    rows = [("recording the events (log + running totals)", events_per_batch * per_event),
            ("end-of-run accounting, spread over the run", account_s / batches),
            ("progress line (on a terminal)", progress_s)]
    total = sum(us for _, us in rows)
    print(f"run: {batches} minibatches of {args.batch_size} files of {args.bytes} B, {args.open_ms:g} ms per open, "
          f"{args.prefetchers} prefetchers, {args.readers} readers, {args.compute_ms:g} ms compute per step; "
          f"minibatch time {per_batch * 1e3:.2f} ms; stall {record['stall_fraction']:.1%}")
    print(f"events: {len(mix)} in all, {events_per_batch:.1f} per minibatch; recording one: "
          f"{per_event * 1e6:.2f} us (median of 5 x {args.repeat} replays)")
    print()
    print("| cost | per minibatch | share of a minibatch |")
    print("|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds * 1e6:.1f} us | {seconds / per_batch:.3%} |")
    print(f"| **total** | **{total * 1e6:.1f} us** | **{total / per_batch:.3%}** |")
    if compute:
        print(f"\nagainst the compute alone ({args.compute_ms:g} ms, the shortest a minibatch can take): "
              f"{total / compute:.3%}")


if __name__ == "__main__":
    main()
