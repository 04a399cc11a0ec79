"""The subcommands that say where a run's time goes and what to change: ``report``, ``analyze``, ``whatif``."""

import argparse
import os
import sys

from ..config import load_config
from ..errors import StagerError


def comma_numbers(kind):
    """An argparse type: ``1,2,4`` as a list of ``kind``."""
    def parse(text):
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    return parse


def _count_or_auto(text):
    return text if text == "auto" else int(text)


def _cmd_report(args):
    from .simulate import report_simulation
    from ..telemetry import load_report
    from ..telemetry.plots import PlotsUnavailable, make_plots
    from ..telemetry.summary import render

    directory = args.plots or os.path.splitext(args.run)[0] + "-plots"
    if report_simulation(args.run, directory, args.no_plots):
        return 0
    report = load_report(args.run)
    plots = []
    if not args.no_plots:
        try:
            plots = make_plots(report, directory)
        except PlotsUnavailable as exc:
            plots = [str(exc)]
    print(render(report, plots))
    return 0


def _cmd_analyze(args):
    import json

    from ..analyze import AnalyzeOptions, analyze, table

    # As ``python -m`` does, so that --step finds a module beside the user.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    options = AnalyzeOptions(step=args.step, batches=args.batches, warmup=args.warmup, collate=args.collate,
                             drop_caches=not args.keep_page_cache, progress=not args.quiet)
    result = analyze(load_config(args.config, args.set), options)
    print(table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
        print(f"written to {args.json}")
    return 0


def _cmd_whatif(args):
    from ..model import whatif

    if args.calibration and (args.config or args.report):
        raise StagerError("stager whatif: give a CONFIG to probe (and --report) or --calibration, not both")
    if not args.calibration and not args.config:
        raise StagerError("stager whatif: give a CONFIG whose source to probe, or --calibration FILE.json")
    catalog = plan_cfg = None
    if args.calibration:
        rates, ahead = whatif.load_rates(args.calibration), 16
    else:
        from ..cache import lookahead_depth

        cfg = load_config(args.config, args.set)
        with whatif.calibrated(cfg, args.report, args.compute_ms[0] if args.compute_ms else None) as (rates, catalog,
                                                                                                       cfg):
            # As the pipeline counts its window: the look-ahead, or the readers' own if longer.
            plan_cfg = cfg.plan
            ahead = max(lookahead_depth(cfg.staging.lookahead), cfg.reader.ahead or 2 * max(args.readers or [2]))
    if args.save:
        whatif.save_rates(rates, args.save)
    print(f"calibration: open {rates.open_s * 1000:.2f} ms, "
          f"{'unlimited' if not rates.bandwidth else f'{rates.bandwidth / 1e6:.0f} MB/s'}, prefetcher "
          f"{rates.copy_s * 1000:.2f} ms/file, reader {rates.read_s * 1000:.2f} ms/file, compute "
          f"{rates.compute_s * 1000:.1f} ms/step, {rates.file_bytes / 1e3:.0f} kB/file, {rates.cores:g} cores free")
    rows = whatif.grid(rates, args.prefetchers or [1, 2, 4, 8, 16], args.readers or [max(1, int(rates.cores))],
                       args.open_ms or [None], args.mbps or [None], args.compute_ms or [None],
                       args.capacity or [None], catalog, plan_cfg, ahead)
    print(whatif.markdown(rows))
    return 0


def add_insight_parsers(sub):
    """Adds ``report``, ``analyze`` and ``whatif`` to the ``stager`` command's subparsers."""
    p = sub.add_parser("report", help="where the time went in a run: stalls, the bottleneck, advice, plots",
                       description="Read RUN.json (written by 'stager run --report' or a front end's report(); "
                                   "or 'stager simulate --json', whose table and plot it shows again) "
                                   "and print the stall fraction, the bottleneck stage, each rank's time, the "
                                   "time to the first minibatch and advice tied to the measured rates; draw "
                                   "timeline.png, stalls.png, ranks.png and counts.png.")
    p.add_argument("run", metavar="RUN.json", help="the run's report")
    p.add_argument("--plots", metavar="DIR", help="where the PNG plots go (default: RUN-plots/ beside RUN.json)")
    p.add_argument("--no-plots", action="store_true", help="text only")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("analyze", help="is the training waiting for data, and why (DS-Analyzer's method)",
                       description="Run one training step over the same minibatches three ways: cold from the "
                                   "source (fetch-bound), from a warm local copy (preparation-bound) and on "
                                   "synthetic in-memory batches (pure compute); attribute the stall to fetch "
                                   "(cold - staged) and to preparation (staged - synthetic).")
    p.add_argument("config", help="YAML config file (the job to analyse)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="override a config value, e.g. --set run.compute_ms=50 (repeatable)")
    p.add_argument("--step", metavar="MODULE:FUNCTION",
                   help="the training step, a function taking one minibatch (default: sleep run.compute_ms)")
    p.add_argument("--collate", choices=("none", "torch"), default="none",
                   help="what the step receives: none, the list of (sample, label) pairs (default); torch, "
                        "default_collate's tensors, as StagedLoader yields")
    p.add_argument("--batches", type=int, default=50, help="minibatches timed per phase (default 50)")
    p.add_argument("--warmup", type=int, default=2, help="untimed minibatches first in each phase (default 2)")
    p.add_argument("--keep-page-cache", action="store_true",
                   help="do not drop the page cache before the cold phase (dropping needs root)")
    p.add_argument("--json", metavar="FILE", help="write the measurements and the attribution as JSON")
    p.add_argument("--quiet", action="store_true", help="no phase lines on standard error")
    p.set_defaults(func=_cmd_analyze)

    p = sub.add_parser("whatif", help="predict throughput and stall for other counts, sources and caches",
                       description="Calibrate the model (a probe of a few files of CONFIG's source, refined "
                                   "by a run's --report), or read a saved calibration, and print its predictions "
                                   "for every combination of the values given.")
    p.add_argument("config", nargs="?", help="YAML config whose source to probe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--report", metavar="RUN.json", help="a stager run --report whose totals refine the calibration")
    p.add_argument("--calibration", metavar="FILE.json", help="a calibration saved with --save")
    p.add_argument("--save", metavar="FILE.json", help="write the calibration")
    p.add_argument("--prefetchers", type=comma_numbers(_count_or_auto),
                   help="prefetcher counts, 'auto' among them for the count auto settles at for each source "
                        "(default 1,2,4,8,16)")
    p.add_argument("--readers", type=comma_numbers(int), help="reader counts (default: the cores)")
    p.add_argument("--open-ms", type=comma_numbers(float), help="latencies per open (default: measured)")
    p.add_argument("--mbps", type=comma_numbers(float), help="bandwidths in MB/s, 0 unlimited (default: measured)")
    p.add_argument("--compute-ms", type=comma_numbers(float),
                   help="compute per step (default: the report's or run.compute_ms)")
    p.add_argument("--capacity", type=lambda t: [x for x in t.split(",") if x],
                   help="cache capacities: bytes (500M) or a share of the dataset (50%%); needs CONFIG")
    p.set_defaults(func=_cmd_whatif)
