"""``stager simulate``: a job at any number of nodes, in simulated time (``stager.simulate``)."""

import json

from ..config import load_config
from ..errors import StagerError


def _cmd_simulate(args):
    import numpy as np

    from ..simulate import METHODS, Layout, load_profile, simulate
    from ..simulate.progress import Progress
    from ..simulate.report import plot, text

    cfg = load_config(args.config, args.set)
    profile = load_profile(args.profile, args.profile_set)
    if args.calibration:
        from ..model.whatif import load_rates

        profile = profile.with_rates(load_rates(args.calibration))
    to_files = containers = None
    if args.files:
        sizes = np.full(args.files, args.file_bytes, dtype=np.int64)
    else:
        from ..catalog import load_catalog

        catalog = load_catalog(cfg.dataset)
        sizes, containers = catalog.files.sizes, catalog.containers
        to_files = catalog.file_index if containers is not None else None
    methods = ["stager"] + [m.strip() for m in args.baseline.split(",") if m.strip()] if args.baseline else ["stager"]
    if args.baseline == "all":
        methods = list(METHODS)
    layout = Layout(args.nodes, args.ranks_per_node, args.tracked, args.every_node)
    result = simulate(cfg, profile, layout, sizes, to_files, containers, methods, Progress())
    print(text(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
            fh.write("\n")
        print(f"results written to {args.json}")
    if args.plot:
        from ..telemetry.plots import PlotsUnavailable

        try:
            plot(result, args.plot)
        except PlotsUnavailable as exc:
            raise StagerError(f"stager simulate --plot: {exc}") from None
        print(f"plot written to {args.plot}")
    return 0


def report_simulation(path, plots_dir, no_plots):
    """``stager report`` on ``stager simulate --json``'s results: the table, and its plot in ``plots_dir``.

    Returns:
        False when ``path`` is not such results (a run's report, or not JSON: the caller's to say).
    """
    import os

    from ..simulate.report import is_simulation, plot, text
    from ..telemetry.plots import PlotsUnavailable

    try:
        with open(path, encoding="utf-8") as fh:
            result = json.load(fh)
    except (OSError, ValueError):
        return False
    if not is_simulation(result):
        return False
    print(text(result))
    if not no_plots:
        os.makedirs(plots_dir, exist_ok=True)
        target = os.path.join(plots_dir, "simulation.png")
        try:
            plot(result, target)
            print(f"\nplot: {target}")
        except PlotsUnavailable as exc:
            print(f"\n{exc}")
    return True


def add_simulate_parser(sub):
    """Adds ``stager simulate`` to the command's subparsers."""
    p = sub.add_parser("simulate", help="predict a job at any number of nodes (discrete-event simulation)",
                       description="Simulate CONFIG's job on --nodes nodes of --ranks-per-node ranks: stager's own "
                                   "plan, cache policies and peer ownership decide what each node reads and from "
                                   "where; a profile (--profile) models the shared file system, the nodes and the "
                                   "network. Prints, per method, the time, the stall and the shared file system's "
                                   "load, per epoch and overall.")
    p.add_argument("config", metavar="CONFIG", help="the job's YAML config (plan, staging, reader, run)")
    p.add_argument("--profile", metavar="PROFILE.yaml", help="the machine: filesystem, node, network, costs "
                                                             "(default: the built-in defaults)")
    p.add_argument("--profile-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a profile value")
    p.add_argument("--calibration", metavar="RATES.json", help="fill the node's costs and cores from `stager whatif "
                                                               "--save` (this machine's calibration)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks on each node (default 1)")
    p.add_argument("--tracked", type=int, help="nodes whose cache is replayed file by file; the others read as "
                                               "they do (default: all; 8 to 16 suffice at scale)")
    p.add_argument("--every-node", action="store_true",
                   help="simulate every node in time, not only the tracked ones (each standing for the nodes that "
                        "read as it does); slower, the same where every node is tracked")
    p.add_argument("--files", type=int, help="simulate this many files instead of the config's catalog")
    p.add_argument("--file-bytes", type=int, default=110_000, help="bytes of each of --files (default 110000)")
    p.add_argument("--baseline", metavar="M[,M...]", help="also simulate these methods: no-peers, unbounded, direct, "
                                                          "stage-all, or all")
    p.add_argument("--json", metavar="OUT.json", help="write the results here (`stager report OUT.json` shows them "
                                                      "again, with the plot)")
    p.add_argument("--plot", metavar="OUT.png", help="plot time and source reads per epoch here")
    p.set_defaults(func=_cmd_simulate)
