"""A simulation's results as text and as a plot (``stager simulate``, and ``stager report`` on its JSON)."""

from ..telemetry.plots import pyplot

KIND = "simulation"  # the results' "kind", by which ``stager report`` tells them from a run's report

METHOD_NAMES = {"stager": "stager", "no-peers": "stager, no peers", "unbounded": "stager, unbounded cache",
                "direct": "direct (DataLoader)", "stage-all": "stage all first"}


def _capacity(result):
    cap = result["capacity"]
    return "unbounded" if cap is None else f"{cap / 1e9:.3g} GB a node"


def text(result):
    """The table: per method, time, stall and what the shared file system was asked."""
    lines = [f"{result['nodes']} nodes x {result['ranks_per_node']} ranks, {result['samples']} samples in "
             f"{result['files']} files ({result['dataset_bytes'] / 1e9:.3g} GB), {result['epochs']} epochs of batch "
             f"{result['batch_size']}; cache {_capacity(result)} ({result['policy']}), peers {result['peers']}; "
             f"{result['tracked']} node(s) replayed file by file", "",
             f"{'method':26s} {'time s':>9s} {'stall':>6s} {'files from source':>18s} {'per node':>9s} "
             f"{'GB':>8s} {'peak opens/s':>13s} {'peak MB/s':>10s}"]
    for method, m in result["methods"].items():
        name = METHOD_NAMES.get(method, method)
        if not m.get("fits", True):
            lines.append(f"{name:26s} the dataset does not fit the node's capacity")
            continue
        lines.append(f"{name:26s} {m['seconds']:9.2f} {m['stall']:6.1%} {m['source_files']:18,d} "
                     f"{m['source_files_per_node']:9,.0f} {m['source_bytes'] / 1e9:8.2f} {m['peak_opens_per_s']:13,.0f} "
                     f"{m['peak_mb_per_s']:10,.0f}")
    best, ours = result.get("optimum"), result["methods"].get("stager")
    if best is not None and ours is not None:
        ratio = ours["source_files"] / best["files"] if best["files"] else float("nan")
        lines += ["", f"job-wide optimum (Belady's rule over every node's plan, the same capacities and look-ahead): "
                      f"{best['files']:,d} files from the source ({best['files'] / result['files']:.2f}x the dataset); "
                      f"stager's policy {ours['source_files']:,d} ({ratio:.3f}x the optimum)",
                  "  per epoch: " + " / ".join(f"{n:,d}" for n in best["per_epoch"])]
    lines.append("")
    lines.append("per epoch (time s / files from source / from peers):")
    for method, m in result["methods"].items():
        if m.get("fits", True):
            cells = [f"{e['seconds']:.2f} / {e['source_files']:,d} / {e['peer_files']:,d}" for e in m["epochs"]]
            lines.append(f"  {METHOD_NAMES.get(method, method):24s} " + "   ".join(cells))
    changes = [(method, m["counts_timeline"]) for method, m in result["methods"].items()
               if len(m.get("counts_timeline", ())) > 1]
    if changes:
        lines += ["", "node 0's counts changed by auto (seconds: prefetchers x files in flight each, look-ahead):"]
        for method, timeline in changes:
            cells = ", ".join(f"{c['t']:.2f}: {c['prefetchers']} x {c.get('in_flight', 1)}, {c.get('lookahead', '-')}"
                              for c in timeline)
            lines.append(f"  {METHOD_NAMES.get(method, method):24s} {cells}")
    return "\n".join(lines)


def plot(result, path):
    """Two panels: time per epoch, and files read from the shared file system per epoch, by method.

    Raises:
        PlotsUnavailable: Without matplotlib, saying how to get it.
    """
    plt = pyplot()

    methods = [(k, m) for k, m in result["methods"].items() if m.get("fits", True)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(methods))
    for i, (name, m) in enumerate(methods):
        x = [e["epoch"] + i * width for e in m["epochs"]]
        left.bar(x, [e["seconds"] for e in m["epochs"]], width, label=METHOD_NAMES.get(name, name))
        right.bar(x, [e["source_files"] for e in m["epochs"]], width)
    for ax, label in ((left, "seconds"), (right, "files from the shared file system")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
    left.legend(fontsize=8)
    fig.suptitle(f"simulated: {result['nodes']} nodes x {result['ranks_per_node']} ranks, cache {_capacity(result)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def is_simulation(data):
    """Whether ``data`` (a parsed JSON file) is ``stager simulate``'s results."""
    return isinstance(data, dict) and data.get("kind") == KIND
