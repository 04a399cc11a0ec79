"""The ``stager`` command."""

import argparse
import logging
import os
import signal
import sys

import yaml

from .insight import add_insight_parsers, comma_numbers
from .datasets import add_dataset_parsers
from .simulate import add_simulate_parser
from .. import __version__
from ..config import load_config
from ..errors import StagerError
from ..slowfs import ENGINES


def _cmd_run(args):
    from ..job.runner import run_job
    from ..telemetry.summary import cache_line, decoded_lines, dropped_line, group_lines, reads_lines
    from ..world import abort_on_error, detect

    cfg = load_config(args.config, args.set)
    world = detect(cfg.world.mpi, cfg.world.backend)
    with abort_on_error(world):  # one rank's failure must end the job, not hang it
        s = run_job(cfg, report=args.report, record=args.record, progress=not args.quiet, world=world)
    if world.rank != 0:
        return 0
    ranks = f" on {world.size} ranks, {world.nodes} node(s)" if world.size > 1 else ""
    print(f"{s['mode']}{ranks}: {s['batches']} minibatches, {s['samples']} samples in {s['wall_s']:.2f} s "
          f"({s['samples_per_s']:.1f} samples/s); stalled {s['stall_s']:.2f} s ({s['stall_fraction']:.1%}); "
          f"staged {s['files_staged']} files, {s['bytes_staged'] / 1e6:.1f} MB")
    reads = s.get("reads")
    for line in group_lines(s) + decoded_lines(s):
        print(line)
    if reads and s["mode"] != "direct" and "group" not in s:
        for line in reads_lines(reads):
            print(line)
    cache = s.get("cache") or []
    if any(e["evictions"] for e in cache):
        print("node cache: " + cache_line(cache))
    dropped = dropped_line(cache, s.get("config", {}).get("staging", {}).get("lookahead", "auto"))
    if dropped:
        print(dropped)
    if args.report:
        print(f"report written to {args.report}")
    return 0


def _cmd_demo(args):
    from ..job.demo import run_demo

    run_demo(samples=args.samples, progress=not args.quiet)
    return 0


def _cmd_slowfs(args):
    from .. import slowfs

    if args.action == "mount":
        proc = slowfs.mount(args.source, args.mountpoint, args.open_ms, args.mbps, log_path=args.log,
                            engine=args.engine, ignore_interrupts=args.ignore_interrupts)
        print(f"mounted {args.source} on {args.mountpoint} (daemon pid {proc.pid}); "
              f"end it with: stager slowfs umount {args.mountpoint}")
    elif args.action == "build":
        from ..slowfs import build_c_engine

        print(build_c_engine())
    else:
        mode = "force" if args.force else "lazy" if args.lazy else "normal"
        slowfs.umount(args.mountpoint, mode=mode)
        print(f"unmounted {args.mountpoint}" + (f" ({mode})" if args.force or args.lazy else ""))
    return 0


def _cmd_slurm(args):
    from .. import slurm
    from ..storage import local_base

    if args.action == "local-dir":
        cfg = load_config(args.config)
        print(local_base(cfg.staging.local_dir, with_env=False))
        return 0
    cfg = load_config(args.config, args.set)
    name = args.template or cfg.slurm.template
    with open(slurm.template_path(name), encoding="utf-8") as fh:
        script = slurm.render(fh.read(), cfg, args.config)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(script)
        os.chmod(args.output, 0o755)
    else:
        sys.stdout.write(script)
    return 0


def _cmd_bench(args):
    import json
    import shlex

    from ..bench import report
    from ..bench.sweep import BenchOptions, run_bench

    opts = BenchOptions()
    if args.quick:
        opts = BenchOptions(batches=8, batch_size=8, bytes=20_000, open_ms=2.0, mbps=0.0, prefetchers=[2, 4],
                            readers=[2], compute_ms=5.0, train_prefetchers=4, train_readers=2)
    for name in ("batches", "batch_size", "bytes", "open_ms", "mbps", "compute_ms", "prefetchers", "readers",
                 "local_dir", "engine"):
        value = getattr(args, name)
        if value is not None:
            setattr(opts, name, value)
    opts.format = args.format
    if args.format == "jpeg" and args.bytes is None and not args.quick:
        from ..job.synth import JPEG_BYTES

        opts.bytes = JPEG_BYTES
    opts.chainer = not args.no_chainer
    result = run_bench(opts)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    plots = []
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
        suffix = "" if args.format == "npy" else f"-{args.format}"
        plots = [("elapsed time against prefetchers", os.path.join(args.plots, f"bench-throughput{suffix}.png")),
                 ("where the time went, training", os.path.join(args.plots, f"bench-breakdown{suffix}.png"))]
        report.plot_throughput(result, plots[0][1])
        report.plot_breakdown(result, plots[1][1])
    command = "stager bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    block = report.markdown(result, command, plots)
    if args.markdown:
        report.update_doc(args.markdown, block, args.format)
    print(block)
    return 0


def _cmd_catalog(args):
    import time

    from ..catalog import build_catalog
    from ..world import abort_on_error, detect

    world = detect("auto")
    begin = time.perf_counter()
    with abort_on_error(world):
        entries, total = build_catalog(args.source, args.output, args.extensions, args.manifest, world.comm)
    if world.rank == 0:
        seconds = time.perf_counter() - begin
        print(f"wrote {args.output}: {entries} entries, {total / 1e9:.3f} GB of samples; {seconds:.2f} s on "
              f"{world.size} rank(s), {entries / seconds:,.0f} entries/s")
    return 0


def _cmd_clean(args):
    from ..storage import clean, local_base

    return clean(os.path.abspath(args.base or local_base(None)), args.dry_run)


def _cmd_config(args):
    cfg = load_config(args.config, args.set)
    sys.stdout.write(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="stager",
        description="Stage training samples from a slow shared file system to node-local storage, "
                    "minibatch by minibatch, overlapped with training.")
    parser.add_argument("--version", action="version", version=f"stager {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the pipeline over a config's dataset as a training loop would",
                       description="Run the pipeline over the dataset CONFIG describes, iterating as a training "
                                   "loop would, and print throughput and stall fraction.")
    p.add_argument("config", help="YAML config file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="override a config value, e.g. --set staging.prefetchers=8 (repeatable)")
    p.add_argument("--report", metavar="FILE.json", help="write the totals as JSON")
    p.add_argument("--record", metavar="DIR", help="write rank-<r>.jsonl (minibatches read) and "
                                                  "staged-<node>.jsonl (files staged)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("demo", help="compare staged and direct reading on an emulated slow file system",
                       description="Make a synthetic dataset in a temporary directory, mount it through the "
                                   "slow file system emulator, run stager and direct reading with the same "
                                   "readers, print both, unmount and clean up.")
    p.add_argument("--samples", type=int, help="number of synthetic samples (default 2048)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)

    add_dataset_parsers(sub)

    p = sub.add_parser("slowfs", help="mount or unmount the emulated slow file system",
                       description="A read-only FUSE passthrough with a latency per open and a shared "
                                   "bandwidth cap.")
    ssub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    m = ssub.add_parser("mount", help="mount SRC on MNT in a background daemon",
                        description="Mount SRC read-only on MNT; the daemon runs until 'stager slowfs umount MNT'.")
    m.add_argument("source", metavar="SRC")
    m.add_argument("mountpoint", metavar="MNT")
    m.add_argument("--open-ms", type=float, default=10.0, help="latency per open in ms (default 10)")
    m.add_argument("--mbps", type=float, default=0.0, help="shared bandwidth cap in MB/s (default 0: none)")
    m.add_argument("--log", help="file for the daemon's output")
    m.add_argument("--engine", choices=ENGINES, default="auto",
                   help="the C daemon, the Python one, or C where it can be built (default auto)")
    m.add_argument("--ignore-interrupts", action="store_true",
                   help="emulate a hung server: a reader killed during a sleep stays blocked in the kernel "
                        "until the daemon ends (clear it with umount --force)")
    ssub.add_parser("build", help="build the C engine now and print its path",
                    description="Compile stager/slowfs/slowfsd.c against libfuse3 (needs cc and libfuse3-dev); "
                                "otherwise it is built on first use.")
    u = ssub.add_parser("umount", help="unmount MNT and end its daemon", description="Unmount MNT and wait "
                                                                                    "for its daemon to exit.")
    u.add_argument("mountpoint", metavar="MNT")
    how = u.add_mutually_exclusive_group()
    how.add_argument("--lazy", action="store_true",
                     help="detach MNT now even if files are open (fusermount3 -u -z); the daemon exits when "
                          "the last one closes")
    how.add_argument("--force", action="store_true",
                     help="detach MNT and end its daemon (SIGTERM, then SIGKILL): readers blocked on a hung "
                          "mount get ENOTCONN and return")
    p.set_defaults(func=_cmd_slowfs)

    p = sub.add_parser("slurm", help="sbatch scripts from the templates in slurm/",
                       description="Render an sbatch template from a config's slurm section.")
    ssub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = ssub.add_parser("render", help="fill a template from a config",
                        description="Fill an sbatch template (srun, mpirun, single, or a file) from CONFIG's "
                                    "slurm section; every value is quoted or checked.")
    r.add_argument("--config", required=True, help="the stager config the job runs with")
    r.add_argument("--template", help="srun, mpirun, single or a template file (default: slurm.template)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="override a config value, e.g. --set slurm.nodes=4 (repeatable)")
    r.add_argument("-o", "--output", help="write the script here (default: standard output)")
    ld = ssub.add_parser("local-dir", help="print the node-local base directory a job would use",
                         description="Print staging.local_dir, else $SLURM_TMPDIR, $TMPDIR or /tmp (the "
                                     "templates call it on the node).")
    ld.add_argument("config", help="the stager config")
    p.set_defaults(func=_cmd_slurm)

    p = sub.add_parser("bench", help="stager against DataLoader, MultiprocessIterator, stage-all-first, ideal",
                       description="Run the throughput and training scenarios on the slow file system "
                                   "emulator, side by side, and report times, the bound and efficiencies.")
    p.add_argument("--quick", action="store_true", help="a tiny run (seconds), for a smoke test")
    p.add_argument("--batches", type=int, help="minibatches in the throughput epoch (default 100; published: 1000)")
    p.add_argument("--batch-size", type=int, help="samples per minibatch (default 32)")
    p.add_argument("--bytes", type=int, help="bytes per sample (default 110000)")
    p.add_argument("--open-ms", type=float, help="latency per open of the emulator (default 10)")
    p.add_argument("--mbps", type=float, help="emulator bandwidth in MB/s (default 500; 0: unlimited)")
    p.add_argument("--compute-ms", type=float, help="simulated compute per step, training scenario (default 40)")
    p.add_argument("--prefetchers", type=comma_numbers(int), help="prefetcher counts to sweep (default 2,4,8,12,16)")
    p.add_argument("--readers", type=comma_numbers(int), help="reader counts to sweep (default 2,4,8)")
    p.add_argument("--no-chainer", action="store_true", help="leave Chainer's MultiprocessIterator out")
    p.add_argument("--format", choices=("npy", "jpeg"), default="npy",
                   help="the workload: npy (uint8 arrays, default) or jpeg (256x256 JPEGs of about 115 KB, "
                        "decoded to float32 channel-first by every method)")
    p.add_argument("--local-dir", help="node-local storage for every method's copies (default: /dev/shm where "
                                       "it exists; see docs/benchmarks.md)")
    p.add_argument("--engine", choices=ENGINES, help="the emulator's engine (default auto: C where it builds)")
    p.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    p.add_argument("--plots", metavar="DIR", help="write bench-throughput.png and bench-breakdown.png here")
    p.add_argument("--markdown", metavar="FILE", help="put the tables into FILE (e.g. docs/benchmarks-loaders.md)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("catalog", help="build a catalog file that nodes map instead of receiving it whole",
                       description="Catalog files for dataset.catalog.")
    csub = p.add_subparsers(dest="action", required=True)
    b = csub.add_parser("build", help="list SRC once and write its catalog file",
                        description="List SRC (scan, or --manifest) and write the catalog file CATALOG, which "
                                    "dataset.catalog names. Under mpiexec the ranks scan SRC's first-level "
                                    "subdirectories in parallel and write their parts in place.")
    b.add_argument("source", metavar="SRC", help="dataset root (dataset.source)")
    b.add_argument("-o", "--output", metavar="CATALOG", required=True, help="catalog file to write")
    b.add_argument("--manifest", help="read this manifest instead of scanning (relative to SRC)")
    b.add_argument("--extensions", nargs="*", default=[], help="when scanning, keep only these suffixes")
    b.set_defaults(func=_cmd_catalog)

    add_insight_parsers(sub)
    add_simulate_parser(sub)
    p = sub.add_parser("clean", help="remove staging directories of this user's jobs that are gone",
                       description="Remove the stager-* directories under BASE that belong to this user's jobs on "
                                   "this host whose process is gone and whose lock nobody holds (a node reboot, or "
                                   "the out-of-memory killer taking a job and its janitor). Live and kept "
                                   "directories, and directories stager did not make, are left alone.")
    p.add_argument("base", nargs="?", metavar="BASE", help="the node-local base directory (default: "
                                                          "$STAGER_LOCAL_DIR, $SLURM_TMPDIR, $TMPDIR or /tmp)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.set_defaults(func=_cmd_clean)

    p = sub.add_parser("config", help="print the effective config (all keys, with defaults)",
                       description="Print the effective configuration as YAML: CONFIG (optional) with "
                                   "--set overrides applied, every key shown.")
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[])
    p.set_defaults(func=_cmd_config)

    return parser


def _show_stager_log():
    # A command's user should see stager's own notes (which catalog path a
    # run takes), not every library's INFO lines.
    logger = logging.getLogger("stager")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def _on_sigterm(signum, frame):
    # Unwinds through every with-block: the pipeline stops its workers and
    # removes its staging directory, the emulator unmounts.
    raise SystemExit(128 + signum)


def main(argv=None):
    """Entry point of the ``stager`` console script."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _show_stager_log()
    try:
        return args.func(args)
    except StagerError as exc:
        print(f"stager: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"stager: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stager: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
